#!/bin/bash
# VPMM on a GPU machine: the walkthrough with data checks, pool-hit latency, PyTorch under
# `pyvgpu wrap --allocator vpmm` (and under a cap), `pyvgpu bench vpmm`. Results packed into $OUT/vpmm.tgz.
set -u
FINAL=${OUT:-/tmp/pyvgpu-gpu}; OUT=$(mktemp -d); mkdir -p "$FINAL"
pack() { tar czf "$FINAL/vpmm.tgz" -C "$OUT" .; }
export PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=$(mktemp -d)
PY=python3
$PY -c "import prometheus_client, rich" 2>/dev/null || $PY -m pip install -q --no-index --find-links .wheels prometheus-client rich 2>&1 | grep -v -i warning | tail -2
$PY -m pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v -i warning | tail -3
$PY scripts/build_native.py >/dev/null && $PY -m pyvgpu warmup >/dev/null
nvidia-smi -L > "$OUT/machine.txt"
for n in 22 18 15 12; do $PY scripts/probe/vpmm_gpu.py walk $n >> "$OUT/walk.json" 2>> "$OUT/walk.err"; done
cat "$OUT/walk.json" "$OUT/walk.err" | tail -8; pack
$PY scripts/probe/vpmm_gpu.py latency > "$OUT/latency.json" 2> "$OUT/latency.err"; cat "$OUT/latency.json" "$OUT/latency.err" | tail -5; pack
PROBE='import torch, pyvgpu.vpmm as v; print("allocator", torch.cuda.memory.get_allocator_backend() if hasattr(torch.cuda.memory, "get_allocator_backend") else "?")'
$PY -m pyvgpu wrap --allocator vpmm --memory 8G -- $PY scripts/demo_train.py 8 --mib 1024 --try-oom 9000 > "$OUT/torch-vpmm.log" 2>&1
$PY -m pyvgpu wrap --memory 8G -- $PY scripts/demo_train.py 8 --mib 1024 --try-oom 9000 > "$OUT/torch-default.log" 2>&1
$PY -m pyvgpu wrap --allocator vpmm -- $PY -c "
import torch, pyvgpu.vpmm as v
x = [torch.randn(1<<20, device='cuda') for _ in range(64)]
y = torch.cat(x); s = float(y.sum()); del x
z = torch.empty(300<<20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()
print('pools', len(v._TORCH_POOLS), v._TORCH_POOLS[0].stats()); print('sum ok', abs(s - float(y.sum())) < 1e-3)
" > "$OUT/torch-pool.log" 2>&1
tail -3 "$OUT/torch-vpmm.log" "$OUT/torch-default.log" "$OUT/torch-pool.log"; pack
$PY -m pyvgpu bench vpmm --json "$OUT/bench-vpmm.json" 2>&1 | tail -6
$PY -m pyvgpu bench vpmm --cap 3G --json "$OUT/bench-vpmm-cap3g.json" 2>&1 | tail -6; pack
