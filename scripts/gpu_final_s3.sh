#!/bin/bash
# Session 3's last device run: every GPU test (the context layout changed), and where VPMM's start-up
# time goes under `wrap --allocator vpmm`. Results in $OUT/final.tgz.
set -u
W=$(mktemp -d)
source scripts/gpu_setup.sh --vpmm
nvidia-smi -L > "$W/machine.txt"
PROBE='import time; t0 = time.time(); import torch; t1 = time.time(); x = torch.empty(1 << 20, device="cuda"); torch.cuda.synchronize(); t2 = time.time(); print(f"import torch {t1 - t0:.2f} s, first tensor {t2 - t1:.2f} s")'
for a in default vpmm; do
  /usr/bin/time -f "$a: wall %e s" python3 -m pyvgpu wrap --allocator $a -- python3 -c "$PROBE" >> "$W/startup.txt" 2>&1
done
python3 -X importtime -c "import pyvgpu.vpmm, numba" 2> "$W/importtime.txt" >/dev/null
cat "$W/startup.txt"; sort -t'|' -k2 -n "$W/importtime.txt" | tail -5
(cd tests && timeout 480 python3 -m pytest -p no:cacheprovider -m gpu gpu -v -s > "$W/gpu-tests.log" 2>&1)
grep -E "PASSED|FAILED|ERROR|passed|failed" "$W/gpu-tests.log" | tail -25
tar czf "$OUT/final.tgz" -C "$W" .
