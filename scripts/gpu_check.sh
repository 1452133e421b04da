#!/bin/bash
# The one GPU check: install this tree on a GPU machine, then run the parts asked for, and write
# $OUT/summary.md (pasteable into docs/ and the note: machine, commit, every figure) plus
# $OUT/raw.tgz (logs, JSON, PNGs). Device time is scarce: ask for every part you need in one call.
#
#   bash scripts/gpu_check.sh [PART...]     (default: tests compute vpmm)
#
# Carry .wheels (the dependencies, and this tree's wheel from `python scripts/build_wheel.py --for-device
# .wheels`: then the install takes seconds, not the ~90 s of a build; a wheel of other sources is not used).
# The dependencies, for the device's Python (3.12) too, since it has no network:
#   pip download -d .wheels prometheus-client rich typer pyyaml
#   pip download -d .wheels --python-version 3.12 --only-binary=:all: prometheus-client rich typer pyyaml
#
# Parts:
#   tests     every GPU test (pytest -m gpu tests/gpu)
#   compute   bench sm: spin and matmul alone 10-90%, the 30/70 pair (spin also time-sliced), matmul
#             beside an unlimited neighbour;
#             launch overhead without and with a share, paired in one run (and with it seeing one device, on 2+)
#   scenarios bench sm: the small-kernel MLP alone at 50 and the 50/50 pair (turns and time-sliced), a
#             share beside an unlimited wrapped neighbour and a burst with --sm-borrow (MLP, spin),
#             high against low priority (60/60 and 50/50, spin)
#   workloads bench sm on decode, the MLP beside an unlimited neighbour, and (2 GPUs) all-reduce and
#             tensor-parallel decode: alone, pairs taking turns and time-sliced, beside an unlimited neighbour
#   matrix    bench matrix: the workload matrix (issue 27 item 7) into MATRIX_DIR (/tmp/pyvgpu-matrix: a second
#             call on a machine still warm goes on where one ran out of time; a fresh machine starts over),
#             cut at MATRIX_TIMEOUT s (500) to leave time to pack; matrix.md into the summary, matrix.png beside it;
#             MATRIX_SECONDS, MATRIX_WORKLOADS, MATRIX_MPS=1 and MATRIX_ARGS (more options) tune it
#             (MATRIX_WORKLOADS: comma-separated workloads, default by GPU count; MATRIX_MPS=1 adds MPS pairs;
#             MATRIX_SECONDS: seconds a run, default 8; MATRIX_REPEAT=N runs every scenario N times;
#             MATRIX_GPUS=0,1: one-GPU workloads dealt round those GPUs and run side by side)
#   cost      bench sm on decode and mlp at 30 and a 50/50 pair, with each run's cost a launch: raw estimate,
#             gated timing, NVML busy, launches at the mean (COST_SECONDS a run, default 8; ~4 min)
#   latency   bench latency: a decode service (--priority high) beside a training loop, p50/p99 alone and
#             stacked under pyvgpu, time slicing and MPS (LAT_SECONDS, default 30 a scenario)
#   mps       bench sm under --mode mps (MPS alone), the memory view and OOM under MPS with and without pyvgpu
#   vpmm-loops VPMM on real loops: the context probe, the issue-32 repro (before the fix too, from .old),
#             the loop tests, bench vpmm --workload all, a soak (SOAK_SECONDS)
#   vpmm      bench vpmm (mapped/live, ops/s against expandable_segments and the default allocator)
#   startup   bench startup (time to the first CUDA call, raw and wrapped)
#   timing    scripts/probe/timing_probe.py: a small matmul's and a spin kernel's timing on an idle stream and
#             behind queued work, alone and beside a launch-bound loop (TIMING_SECONDS a case, default 5)
#   devices   scripts/probe/device_probe.py (2+ GPUs): launches under a share counted on their own device, a
#             PyTorch loop on cuda:0 only and one switching between cuda:0 and cuda:1
#   nvml-process scripts/probe/nvml_process_probe.py: NVML's per-process utilization beside each process's own
#             GPU time (a duty-cycled matmul at 20% and 50% beside a small-matmul loop)
#   none      install and warm up only
# WARMUP=1: use host-tuned callbacks (pyvgpu warmup) instead of the packaged portable ones. No matplotlib: no PNGs.
set -u
OUT=${OUT:-/tmp/pyvgpu-gpu}
mkdir -p "$OUT"
PARTS=${*:-tests compute vpmm}
ROOT=$PWD
W=$(mktemp -d)
S="$OUT/summary.md"
export PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=$(mktemp -d)
PY=python3
pack() { tar czf "$OUT/raw.tgz" -C "$W" .; }
say() { echo "$@" | tee -a "$S"; }
block() { echo '```' >> "$S"; tee -a "$S"; echo '```' >> "$S"; }
png() { $PY -c "import matplotlib" 2>/dev/null && echo "$W/$1" || echo ""; }

# --- setup: dependencies from the carried .wheels (the device has no network), the tree, the callbacks
$PY -c "import prometheus_client, rich, typer, yaml" 2>/dev/null ||
  $PY -m pip install -q --no-index --find-links .wheels prometheus-client rich typer pyyaml 2>&1 | grep -v -i warning | tail -2
T0=$(date +%s)
# A wheel carried in .wheels (python scripts/build_wheel.py --for-device .wheels, here) installs in seconds
# where building takes about 90 s; only where the digest beside it is this tree's (else it is another tree's).
WHL=$(ls .wheels/pyvgpu-*.whl 2>/dev/null | head -1)
if [ -n "$WHL" ] && [ "$(cat .wheels/pyvgpu.digest 2>/dev/null)" = "$($PY scripts/build_wheel.py --digest)" ]; then
  HOW="installed the carried $(basename "$WHL") (its sources are this tree's)"
  $PY -m pip install --no-deps --force-reinstall -q "$WHL" 2>&1 | grep -v -i warning | tail -3
else
  HOW="built here${WHL:+ (the carried wheel is of other sources: run scripts/build_wheel.py --for-device .wheels)}"
  $PY -m pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v -i warning | tail -3
  $PY scripts/build_native.py >/dev/null  # in place too, from the build cache the install filled
fi
T1=$(date +%s)
{
  echo "# GPU check: $PARTS"
  echo
  echo "- machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | paste -sd';')"
  echo "- CPU: $(nproc) cores; Python $($PY -c 'import sys; print(sys.version.split()[0])');" \
       "torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none);" \
       "numba $($PY -c 'import numba; print(numba.__version__)')"
  echo "- tree: $(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
       "$(git status --porcelain 2>/dev/null | grep -q . && echo '(with uncommitted changes)')"
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
} > "$S"
cat "$S"
# The packaged callbacks (portable x86-64, compiled by the package build) are what users get: they are
# measured. WARMUP=1 compiles the host-tuned ones into the cache first (then used instead).
echo "pyvgpu $HOW: $((T1 - T0)) s" | block
# From here on the installed pyvgpu, not the tree's: `python -m` puts the working folder first on sys.path,
# and the tree holds no shim when the carried wheel was installed
cd "$W"
if [ -n "${WARMUP:-}" ]; then
  /usr/bin/time -f "warmup (host-tuned compile) %e s" $PY -m pyvgpu warmup 2>&1 | tail -1 | block
fi

for part in $PARTS; do
  case $part in
  tests)
    say "## GPU tests"
    (cd "$ROOT/tests" && timeout 420 $PY -m pytest -p no:cacheprovider -m gpu gpu -v -s -rA > "$W/gpu-tests.log" 2>&1)
    # pytest's short summary (-rA): one line per test, whatever the tests printed
    grep -E "^(PASSED|FAILED|ERROR|SKIPPED) |^=+ .*[0-9]+ (passed|failed)" "$W/gpu-tests.log" | tail -60 | block
    pack ;;
  compute)
    say "## Compute shares"
    $PY -m pyvgpu bench sm --workload spin --sliced --png "$(png sm-spin.png)" --output "$W/sm-spin.json" 2>&1 |
      tail -20 | block; pack
    $PY -m pyvgpu bench sm --workload matmul --neighbour unlimited --png "$(png sm-matmul.png)" \
      --output "$W/sm-matmul.json" 2>&1 | tail -20 | block; pack
    $PY -m pyvgpu bench sm --workload graph --targets 30,70 --png "" --output "$W/sm-graph.json" 2>&1 | tail -12 | block; pack
    say "## Launch overhead (no share, then --sm 99)"
    $PY -m pyvgpu bench overhead --rounds 5 --output "$W/overhead.json" 2>&1 | tail -4 | block
    $PY -m pyvgpu bench overhead --rounds 5 --sm 99 --output "$W/overhead-sm99.json" 2>&1 | tail -4 | block; pack
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      # seeing one device or two: the device lookup a limited launch makes (context.launch_device)
      say "### --sm 99 seeing one device (CUDA_VISIBLE_DEVICES=0)"
      CUDA_VISIBLE_DEVICES=0 $PY -m pyvgpu bench overhead --rounds 5 --sm 99 --output "$W/overhead-sm99-1dev.json" \
        2>&1 | tail -4 | block; pack
    fi ;;
  scenarios)
    say "## Issue 17 scenarios (turns that never idle the GPU, neighbours, borrowing, priorities)"
    sc() {  # sc NAME ARGS...: one bench sm run, its table into the summary
      name=$1; shift
      say "### bench sm $*"
      $PY -m pyvgpu bench sm "$@" --png "$(png "$name.png")" --output "$W/$name.json" 2>&1 | tail -22 | block; pack
    }
    sc sm-mlp --workload mlp --targets 50 --pair 50,50 --sliced --neighbour unlimited --burst
    sc sm-spin-scenarios --workload spin --targets "" --pair "" --neighbour unlimited --burst
    sc sm-prio-60 --workload spin --targets "" --pair 60,60 --priorities high,low
    sc sm-prio-50 --workload spin --targets "" --pair 50,50 --priorities high,low ;;
  workloads)
    say "## Workloads the shares were not tuned on: decode, all-reduce and tensor-parallel decode (issue 27)"
    wl() {  # wl NAME ARGS...: one bench sm run, its table into the summary
      name=$1; shift
      say "### bench sm $*"
      $PY -m pyvgpu bench sm "$@" --png "$(png "$name.png")" \
        --output "$W/$name.json" 2>&1 | tail -22 | block; pack
    }
    wl sm-decode --workload decode --targets ${DECODE_TARGETS:-30,50,70} --pair 50,50 --sliced --neighbour unlimited
    wl sm-decode-3070 --workload decode --targets "" --pair 30,70 ${DECODE_3070_SLICED---sliced}
    wl sm-mlp-neighbour --workload mlp --targets "" --pair "" --neighbour unlimited
    [ -n "${WITH_SPIN:-}" ] && wl sm-spin --workload spin --targets 30,70 --pair 30,70 --neighbour unlimited
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      wl sm-allreduce --workload allreduce --targets 30,50,90 --pair 50,50 --sliced --neighbour unlimited
      PYVGPU_SM_TURN=0 wl sm-allreduce-sliced --workload allreduce --targets 50 --pair ""
      wl sm-tp-decode --workload tp-decode --targets 50 --pair 50,50 --sliced
    else
      say "(one GPU: the all-reduce and tensor-parallel rows need two)"
    fi ;;
  matrix)
    say "## The workload matrix (issue 27 item 7)"
    # Outside $W, so that a second call on a machine still warm goes on from the first (--skip-done); the
    # timeout leaves the call time to render and pack what the scenarios that finished measured.
    M=${MATRIX_DIR:-/tmp/pyvgpu-matrix}
    TREE=$(cd "$ROOT" && $PY scripts/build_wheel.py --digest)
    if [ -d "$M" ] && [ "$(cat "$M/.tree" 2>/dev/null)" != "$TREE" ]; then
      rm -rf "$M"  # another tree's runs: never resumed under this tree's name
    fi
    mkdir -p "$M"; echo "$TREE" > "$M/.tree"; [ -f "$ROOT/.commit" ] && cp "$ROOT/.commit" "$M/.commit"
    matrix_run() {  # WORKLOADS (empty: the default set): one bench matrix into $M
      # shellcheck disable=SC2086  # MATRIX_ARGS: more bench matrix options, split on spaces
      timeout "${MATRIX_TIMEOUT:-500}" $PY -m pyvgpu bench matrix --output-dir "$M" --skip-done \
        --seconds "${MATRIX_SECONDS:-8}" ${1:+--workloads "$1"} ${MATRIX_MPS:+--mps} \
        ${MATRIX_REPEAT:+--repeat "$MATRIX_REPEAT"} ${MATRIX_ARGS:-} --png ""
      echo "bench matrix ${1:-}: exit $? (124: cut by MATRIX_TIMEOUT; call again on the warm machine to go on)"
    }
    if [ -n "${MATRIX_GPUS:-}" ]; then
      # one-GPU workloads side by side, dealt round the GPUs, each seeing one (its NVML is read there) and
      # taking turns in a turn file of its own
      IFS=, read -ra GPUS <<< "$MATRIX_GPUS"
      IFS=, read -ra WLS <<< "${MATRIX_WORKLOADS:-spin,matmul,mlp,decode}"
      for k in "${!GPUS[@]}"; do
        MINE=""; for j in "${!WLS[@]}"; do [ $((j % ${#GPUS[@]})) -eq "$k" ] && MINE="$MINE${MINE:+,}${WLS[$j]}"; done
        [ -n "$MINE" ] && (export CUDA_VISIBLE_DEVICES=${GPUS[$k]} XDG_RUNTIME_DIR; XDG_RUNTIME_DIR=$(mktemp -d)
                           matrix_run "$MINE" > "$M/run-gpu${GPUS[$k]}.log" 2>&1) &
      done
      wait
      cat "$M"/run-gpu*.log >> "$M/run.log"
    else
      matrix_run "${MATRIX_WORKLOADS:-}" >> "$M/run.log" 2>&1
    fi
    tail -3 "$M/run.log" | block
    [ "$M" -ef "$W/matrix" ] || { rm -rf "$W/matrix"; cp -r "$M" "$W/matrix"; }
    $PY -m pyvgpu bench matrix --from "$W/matrix" --png "$(png matrix/matrix.png)" > /dev/null 2>> "$W/matrix/run.log"
    cat "$W/matrix/matrix.md" >> "$S" 2>/dev/null || say "(no matrix.md: see matrix/run.log in raw.tgz)"
    pack ;;
  cost)
    say "## What the cost model charges against what its timings read and NVML (decode and mlp at 30, 50/50)"
    for w in decode mlp; do
      timeout 280 $PY -m pyvgpu bench sm --workload $w --targets 30 --pair 50,50 --seconds "${COST_SECONDS:-8}" \
        --png "" --output "$W/cost-$w.json" 2>&1 | tail -12 | block
    done; pack ;;
  latency)
    say "## A decode service beside a training loop, by latency (issue 27, item 6)"
    timeout 560 $PY -m pyvgpu bench latency --seconds "${LAT_SECONDS:-30}" --output "$W/latency.json" 2>&1 |
      tail -10 | block; pack ;;
  mps)
    say "## MPS mode against MPS alone and pyvgpu's turns (spin kernel)"
    $PY -m pyvgpu bench sm --workload spin --targets 30,70 --pair 30,70 --mode mps --png "" \
      --output "$W/sm-spin-mps.json" 2>&1 | tail -8 | block; pack
    MEM='import torch; f, t = torch.cuda.mem_get_info(); print(f"total {t / 2**30:.2f} GiB, free {f / 2**30:.2f} GiB")'
    OOM='import torch\ntry:\n    x = torch.empty(5 << 30, dtype=torch.uint8, device="cuda"); print("5 GiB: allocated")\nexcept torch.OutOfMemoryError as e:\n    print("5 GiB: OutOfMemoryError")'
    say "### memory view under a 4 GiB cap"
    {
      echo "pyvgpu wrap --mode mps --memory 4G: $($PY -m pyvgpu wrap --mode mps --memory 4G -- $PY -c "$MEM" 2>&1 | tail -1); $($PY -m pyvgpu wrap --mode mps --memory 4G -- $PY -c "$(printf "$OOM")" 2>&1 | tail -1)"
      D=$(mktemp -d); export CUDA_MPS_PIPE_DIRECTORY=$D/pipe CUDA_MPS_LOG_DIRECTORY=$D/log; mkdir -p $D/pipe $D/log
      nvidia-cuda-mps-control -d
      echo "MPS alone, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M: $(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M $PY -c "$MEM" 2>&1 | tail -1); $(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M $PY -c "$(printf "$OOM")" 2>&1 | tail -1)"
      echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    } 2>&1 | block
    for d in "$XDG_RUNTIME_DIR/pyvgpu/mps/pipe"; do [ -e "$d/control" ] && echo quit | CUDA_MPS_PIPE_DIRECTORY=$d nvidia-cuda-mps-control; done
    pack ;;
  vpmm)
    say "## VPMM"
    $PY -m pyvgpu bench vpmm --output "$W/bench-vpmm.json" 2>&1 | tail -10 | block; pack ;;
  spin)
    say "## Spin alone at 30 and 70, and the 30/70 pair (what held before, kept)"
    $PY -m pyvgpu bench sm --workload spin --targets 30,70 --pair 30,70 --png "" --output "$W/sm-spin.json" 2>&1 |
      tail -9 | block; pack ;;
  vpmm-loops)
    say "## VPMM on real loops (issue 32): the context probe, the crash before and after, the loop tests, the benchmark, a soak"
    $PY -m pyvgpu warmup --vpmm 2>&1 | tail -1 | block
    [ -n "${PROBE:-}" ] && { $PY "$ROOT/tests/gpu/vpmm_ctx_probe.py" 2>&1 | tail -12 | block; pack; }
    if [ -d "$ROOT/.old" ]; then  # the tree before the fix, installed apart: the crash as the issue saw it
      say "### before the fix ($(cat "$ROOT/.old/.commit" 2>/dev/null))"
      $PY -m pip install -q --no-build-isolation --no-deps --target "$W/old" "$ROOT/.old" 2>&1 | grep -v -i warn | tail -2
      cp "$ROOT/pyvgpu/bench/vpmm_loops.py" "$W/old/pyvgpu/bench/"  # the loop itself, which the old tree lacks
      (cd "$W" && PYTHONPATH="$W/old" timeout 150 $PY "$ROOT/scripts/vpmm_repro.py" --runs 1 2>&1 | tail -4) | block; pack
    fi
    say "### after the fix"
    timeout 200 $PY "$ROOT/scripts/vpmm_repro.py" --runs "${REPRO_RUNS:-2}" 2>&1 | tail -6 | block; pack
    (cd "$ROOT/tests" && timeout 300 $PY -m pytest -p no:cacheprovider -q -rA -s gpu/test_gpu_vpmm_loops.py \
      > "$W/vpmm-loop-tests.log" 2>&1)
    grep -E "^(PASSED|FAILED|ERROR|SKIPPED) |passed|failed" "$W/vpmm-loop-tests.log" | block
    say "stderr lines 'not a live allocation' in the loop tests: $(grep -c 'not a live allocation' "$W/vpmm-loop-tests.log")"
    pack
    # LOOP_WORKLOADS: decode, train, trace or all; the call's limit bounds seconds x rounds x 3 allocators
    for wl in ${LOOP_WORKLOADS:-all}; do
      timeout $((${LOOP_SECONDS:-8} * ${LOOP_ROUNDS:-1} * 12 + 120)) $PY -m pyvgpu bench vpmm --workload "$wl" \
        --seconds "${LOOP_SECONDS:-8}" --rounds "${LOOP_ROUNDS:-1}" --cap 40G \
        --output "$W/bench-vpmm-loops-$wl.json" 2>&1 | tail -22 | block; pack
    done
    if [ "${SOAK_SECONDS:-120}" -gt 0 ]; then
      timeout $((${SOAK_SECONDS:-120} + 120)) $PY "$ROOT/scripts/vpmm_soak.py" --seconds "${SOAK_SECONDS:-120}" \
        > "$W/soak.log" 2>&1; echo "exit $?" >> "$W/soak.log"
      tail -6 "$W/soak.log" | block; pack
    fi ;;
  startup)
    say "## Start-up"
    $PY -m pyvgpu bench startup --runs 5 --output "$W/startup.json" 2>&1 | tail -10 | block; pack ;;
  timing)
    say "## What a timed launch reads (scripts/probe/timing_probe.py)"
    $PY "$ROOT/scripts/probe/timing_probe.py" "${TIMING_SECONDS:-5}" > "$W/timing.log" 2>&1
    tail -14 "$W/timing.log" | block; pack ;;
  devices)
    say "## Each launch counted on its own device (scripts/probe/device_probe.py)"
    $PY "$ROOT/scripts/probe/device_probe.py" > "$W/devices.log" 2>&1
    tail -3 "$W/devices.log" | head -2 | block; pack ;;
  nvml-process)
    say "## NVML's per-process utilization against each process's own GPU time (scripts/probe/nvml_process_probe.py)"
    for duty in 0.2 0.5; do
      $PY "$ROOT/scripts/probe/nvml_process_probe.py" 14 "$duty" > "$W/nvml-process-$duty.log" 2>&1
      tail -4 "$W/nvml-process-$duty.log" | block
    done; pack ;;
  none) ;;  # install and warm up only (for the probes in scripts/probe)
  *)
    say "unknown part: $part (tests, compute, scenarios, workloads, matrix, cost, latency, mps, vpmm-loops, vpmm, startup, timing, nvml-process, none)" ;;
  esac
done
cp "$S" "$W/"; pack
echo "== summary: $S"
