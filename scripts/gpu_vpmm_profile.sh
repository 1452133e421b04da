#!/bin/bash
# VPMM after the defragmentation changes: GPU tests, the VMM call profile, latency, a PyTorch demo, bench vpmm
# at 2M and 16M pages and under a 3G cap. Results in $OUT/run3.tgz.
set -u
W=$(mktemp -d)
source scripts/gpu_setup.sh --vpmm
(cd tests && timeout 300 python3 -m pytest -q -s -p no:cacheprovider gpu/test_gpu_vpmm.py > "$W/gpu-tests.log" 2>&1); tail -2 "$W/gpu-tests.log"
python3 tests/gpu/vpmm_real.py profile | tee "$W/profile.json"
python3 tests/gpu/vpmm_real.py latency | tee "$W/latency.json"
/usr/bin/time -f "wall %e s" python3 -m pyvgpu wrap --allocator vpmm --memory 8G -- python3 scripts/demo_train.py 8 --mib 1024 --try-oom 9000 > "$W/torch-vpmm.log" 2>&1; tail -3 "$W/torch-vpmm.log"
python3 -m pyvgpu bench vpmm --output "$W/bench-vpmm.json" 2>&1 | tee "$W/bench-vpmm.txt" | tail -6
python3 -m pyvgpu bench vpmm --page-size 16M --output "$W/bench-vpmm-16m.json" 2>&1 | tee "$W/bench-vpmm-16m.txt" | tail -6
python3 -m pyvgpu bench vpmm --cap 3G --output "$W/bench-vpmm-cap3g.json" 2>&1 | tee "$W/bench-vpmm-cap3g.txt" | tail -6
tar czf "$OUT/run3.tgz" -C "$W" .
