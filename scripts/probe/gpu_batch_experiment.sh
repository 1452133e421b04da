set -u
PY=python3
$PY -m pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v -i warning | tail -3
$PY scripts/build_native.py >/dev/null
$PY -m pyvgpu warmup | tail -1
for b in 2 10 30; do
  echo "== batch $b ms"
  PYVGPU_SM_BATCH_MS=$b $PY -m pyvgpu bench sm --workload spin --targets "" --png "" --output "$OUT/pair-batch$b.json" 2>&1 | tail -4
done
PYVGPU_SM_BATCH_MS=10 $PY -m pyvgpu bench sm --workload matmul --targets "" --png "" --output "$OUT/pair-matmul-batch10.json" 2>&1 | tail -4
$PY -m pyvgpu bench overhead --rounds 3 --sm 90 --output "$OUT/overhead-sm90.json" 2>&1 | tail -4
$PY -m pyvgpu bench overhead --rounds 3 --sm 99 --output "$OUT/overhead-sm99.json" 2>&1 | tail -4
