#!/bin/bash
# Every GPU test on the current tree (after a change of the per-process context layout). $OUT/all.tgz.
set -u
W=$(mktemp -d)
source scripts/gpu_setup.sh --vpmm >"$W/setup.log" 2>&1; tail -2 "$W/setup.log"
nvidia-smi -L > "$W/machine.txt"
(cd tests && timeout 540 python3 -m pytest -p no:cacheprovider -m gpu gpu -v -s > "$W/gpu-tests-all.log" 2>&1)
grep -E "PASSED|FAILED|ERROR|passed|failed" "$W/gpu-tests-all.log" | tail -25
tar czf "$OUT/all.tgz" -C "$W" .
