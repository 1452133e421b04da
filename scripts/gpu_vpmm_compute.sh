#!/bin/bash
# One device run for VPMM and the compute path: scripts/gpu_vpmm.sh, then the compute GPU tests, launch
# overhead without and with a share, `bench sm` on the spin load. Everything lands in $OUT/*.tgz.
set -u
FINAL=${OUT:-/tmp/pyvgpu-gpu}; mkdir -p "$FINAL"
OUT=$FINAL bash scripts/gpu_vpmm.sh
W=$(mktemp -d); export PYTHONUNBUFFERED=1
pack() { tar czf "$FINAL/compute.tgz" -C "$W" .; }
(cd tests && timeout 400 python3 -m pytest -q -s -p no:cacheprovider gpu/test_gpu_compute.py > "$W/gpu-compute-tests.log" 2>&1)
tail -3 "$W/gpu-compute-tests.log"; pack
python3 -m pyvgpu bench overhead --rounds 5 --output "$W/overhead.json" 2>&1 | tail -4
python3 -m pyvgpu bench overhead --rounds 5 --sm 99 --output "$W/overhead-sm99.json" 2>&1 | tail -4; pack
python3 -m pyvgpu bench sm --workload spin --png "$W/sm-spin.png" --output "$W/sm-spin.json" 2>&1 | tail -12; pack
