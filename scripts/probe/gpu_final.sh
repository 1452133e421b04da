set -u
PY=python3
$PY -m pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v -i warning | tail -3
$PY scripts/build_native.py >/dev/null
$PY -m pyvgpu warmup | tail -1
$PY -m pyvgpu bench overhead --rounds 3 --sm 99 --output "$OUT/overhead-sm99.json" 2>&1 | tail -3
$PY -m pyvgpu bench sm --workload spin --png "$OUT/sm-spin.png" --output "$OUT/sm-spin.json" 2>&1 | tail -11
for b in 10 20; do
  echo "== batch $b ms"
  PYVGPU_SM_BATCH_MS=$b $PY -m pyvgpu bench sm --workload spin --targets "" --png "" --output "$OUT/pair-batch$b.json" 2>&1 | tail -4
done
$PY -m pyvgpu bench sm --workload graph --targets 30,70 --pair "" --png "" --output "$OUT/sm-graph.json" 2>&1 | tail -5
$PY -m pyvgpu bench sm --workload matmul --png "$OUT/sm-matmul.png" --output "$OUT/sm-matmul.json" 2>&1 | tail -11
