#!/bin/bash
# Issue 5, second GPU run: nvidia-smi's process table inside and outside a group (the
# group's processes only, with their charged memory), the devices GPU tests, a top frame.
set -u
FINAL=${OUT:-/tmp/pyvgpu-gpu}; OUT=$(mktemp -d); mkdir -p "$FINAL"
pack() { tar czf "$FINAL/issue5-smi.tgz" -C "$OUT" .; }
source scripts/gpu_setup.sh
HOLD='import torch,sys; x=torch.empty(1<<30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("HELD", flush=True); sys.stdin.read()'
mkfifo /tmp/a /tmp/b
$PY -m pyvgpu wrap --group team-a --memory 8G -- $PY -c "$HOLD" < /tmp/a > "$OUT/a.out" & exec 3>/tmp/a
$PY -m pyvgpu wrap --group team-b --memory 4G -- $PY -c "$HOLD" < /tmp/b > "$OUT/b.out" & exec 4>/tmp/b
for i in $(seq 60); do grep -q HELD "$OUT/a.out" && grep -q HELD "$OUT/b.out" && break; sleep 1; done
{ echo '$ nvidia-smi   (outside any group)'; nvidia-smi; echo '$ pyvgpu wrap --group team-a -- nvidia-smi'; $PY -m pyvgpu wrap --group team-a -- nvidia-smi
  echo '$ pyvgpu wrap --group team-a -- nvidia-smi --query-compute-apps=pid,used_memory --format=csv'
  $PY -m pyvgpu wrap --group team-a -- nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  echo '$ pyvgpu status'; $PY -m pyvgpu status; } > "$OUT/smi-groups.txt" 2>&1
COLUMNS=130 $PY -m pyvgpu top --once > "$OUT/top-once.txt" 2>&1
exec 3>&- 4>&-; wait
cat "$OUT/smi-groups.txt" "$OUT/top-once.txt"; pack
$PY -m pytest -p no:cacheprovider -m gpu tests/gpu/test_gpu_devices.py -v 2>&1 | tee "$OUT/gpu-tests-devices.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | head -20
pack
