# Sourced by the scripts/gpu_*.sh runs: install pyvgpu and its extras from the carried .wheels on the
# device (no network there), build the shim in place, compile the callbacks (extra args go to warmup).
export PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=$(mktemp -d)
PY=python3
$PY -c "import prometheus_client, rich" 2>/dev/null ||
  $PY -m pip install -q --no-index --find-links .wheels prometheus-client rich 2>&1 | grep -v -i warning | tail -2
$PY -m pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v -i warning | tail -3
$PY scripts/build_native.py >/dev/null && $PY -m pyvgpu warmup "$@" 2>&1 | tail -1
