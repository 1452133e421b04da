#!/bin/bash
# Issue 5 on a GPU machine (two GPUs if there are), in one command: install, GPU tests,
# nvidia-smi and torch under --devices/--memory, an exporter scrape and top captures
# during wrapped PyTorch runs, a live limit change, launch overhead. Results in $OUT.
set -u
FINAL=${OUT:-/tmp/pyvgpu-gpu}
OUT=$(mktemp -d)  # results gather here; packed into $FINAL/issue5.tgz after each part (few files come back)
mkdir -p "$FINAL"
pack() { tar czf "$FINAL/issue5.tgz" -C "$OUT" .; }
export PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=$(mktemp -d)
PY=python3
$PY -c "import prometheus_client, rich" 2>/dev/null || $PY -m pip install -q --no-index --find-links .wheels prometheus-client rich 2>&1 | grep -v -i warning | tail -2
$PY -m pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v -i warning | tail -3
$PY scripts/build_native.py >/dev/null
/usr/bin/time -f "warmup (cold compile) %e s" $PY -m pyvgpu warmup
nvidia-smi -L | tee "$OUT/machine.txt"
nvidia-smi --version | head -3 >> "$OUT/machine.txt"

echo "== devices: nvidia-smi and torch, raw and under --devices 1,0 --memory 4G" | tee "$OUT/devices.txt"
Q="--query-gpu=index,uuid,name,memory.total,memory.used --format=csv"
TV='import json,torch; print(json.dumps([dict(i=i, name=torch.cuda.get_device_name(i), uuid=str(torch.cuda.get_device_properties(i).uuid), total=torch.cuda.get_device_properties(i).total_memory, mem_get_info=torch.cuda.mem_get_info(i)) for i in range(torch.cuda.device_count())]))'
N=$(nvidia-smi -L | wc -l)
SEL=0; [ "$N" -ge 2 ] && SEL=1,0
for W in "" "$PY -m pyvgpu wrap --devices $SEL --memory 4G --"; do
  echo "\$ ${W:+pyvgpu wrap --devices $SEL --memory 4G -- }nvidia-smi $Q" >> "$OUT/devices.txt"
  $W nvidia-smi $Q >> "$OUT/devices.txt" 2>&1
  echo "\$ ${W:+pyvgpu wrap --devices $SEL --memory 4G -- }python -c '<torch view>'" >> "$OUT/devices.txt"
  $W $PY -c "$TV" >> "$OUT/devices.txt" 2>&1
done
$PY -m pyvgpu wrap --devices $SEL --memory 4G -- nvidia-smi >> "$OUT/devices.txt" 2>&1
cat "$OUT/devices.txt"; pack

echo "== exporter and top during wrapped torch runs"
$PY -m pyvgpu exporter --port 9400 --address 127.0.0.1 2> "$OUT/exporter.log" &
EXP=$!
$PY -m pyvgpu wrap --group train --memory 8G --sm 50 -- $PY scripts/demo_train.py 40 --mib 2048 > "$OUT/train.log" 2>&1 &
T1=$!
$PY -m pyvgpu wrap --group infer --memory 3G -- $PY scripts/demo_train.py 40 --mib 512 --try-oom 4096 > "$OUT/infer.log" 2>&1 &
T2=$!
sleep 30
$PY -m pyvgpu limits set --group train --memory 6G 2>&1 | tee "$OUT/limits-set.txt"
sleep 2
curl -s http://127.0.0.1:9400/metrics > "$OUT/exporter-scrape.txt" || $PY -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9400/metrics').read().decode())" > "$OUT/exporter-scrape.txt"
grep "^pyvgpu_" "$OUT/exporter-scrape.txt" | head -40
COLUMNS=150 $PY -m pyvgpu top --once > "$OUT/top-once.txt" 2>&1; cat "$OUT/top-once.txt"
if command -v tmux >/dev/null; then
  tmux new-session -d -s top -x 150 -y 30 "$PY -m pyvgpu top"; sleep 3
  tmux capture-pane -p -t top > "$OUT/top-tmux.txt"; tmux send-keys -t top q; sleep 1
  tmux kill-session -t top 2>/dev/null; echo "tmux capture: $(wc -l < "$OUT/top-tmux.txt") lines"
else
  echo "no tmux here"; (script -q -c "timeout 3 $PY -m pyvgpu top" /dev/null > "$OUT/top-pty.txt" 2>&1 || true)
fi
$PY -m pyvgpu status > "$OUT/status.txt" 2>&1
$PY -m pyvgpu status --json > "$OUT/status.json" 2>&1
wait $T1 $T2
kill -TERM $EXP; wait $EXP  # (a background job ignores SIGINT in a script)
cat "$OUT/train.log" "$OUT/infer.log"; pack

echo "== launch overhead (the launch counter is new on every launch of a group member)"
$PY -m pyvgpu bench overhead --rounds 3 --output "$OUT/overhead-nolimit.json" 2>&1 | tail -4
$PY -m pyvgpu bench overhead --rounds 3 --memory 70G --output "$OUT/overhead-memory.json" 2>&1 | tail -4
$PY -m pyvgpu bench overhead --rounds 3 --sm 99 --output "$OUT/overhead-sm99.json" 2>&1 | tail -4; pack

echo "== GPU tests"
PART=${PART:-all}
$PY -m pytest -p no:cacheprovider -m gpu tests/gpu -v ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E " | head -40
pack
