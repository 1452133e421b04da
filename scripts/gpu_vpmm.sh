#!/bin/bash
# VPMM on a GPU machine: the GPU tests (walkthrough with data checks, PyTorch under a cap), pool-hit latency,
# a PyTorch training demo under both allocators, `pyvgpu bench vpmm` with and without a cap.
# Results packed into $OUT/vpmm.tgz (the device returns few files).
set -u
FINAL=${OUT:-/tmp/pyvgpu-gpu}; OUT=$(mktemp -d); mkdir -p "$FINAL"
pack() { tar czf "$FINAL/vpmm.tgz" -C "$OUT" .; }
source scripts/gpu_setup.sh --vpmm
nvidia-smi -L > "$OUT/machine.txt"
(cd tests && timeout 300 $PY -m pytest -q -s -p no:cacheprovider gpu/test_gpu_vpmm.py > "$OUT/gpu-tests.log" 2>&1)
tail -4 "$OUT/gpu-tests.log"; pack
$PY tests/gpu/vpmm_real.py latency > "$OUT/latency.json" 2> "$OUT/latency.err"; cat "$OUT/latency.json" "$OUT/latency.err" | tail -5; pack
for a in vpmm default; do
  /usr/bin/time -f "wall %e s" $PY -m pyvgpu wrap --allocator $a --memory 8G -- $PY scripts/demo_train.py 8 --mib 1024 --try-oom 9000 > "$OUT/torch-$a.log" 2>&1
  tail -3 "$OUT/torch-$a.log"
done; pack
$PY -m pyvgpu bench vpmm --output "$OUT/bench-vpmm.json" 2>&1 | tee "$OUT/bench-vpmm.txt" | tail -8
$PY -m pyvgpu bench vpmm --cap 3G --output "$OUT/bench-vpmm-cap3g.json" 2>&1 | tee "$OUT/bench-vpmm-cap3g.txt" | tail -8; pack
