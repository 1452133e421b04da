#!/bin/bash
# Issue 17 (turns that never idle the GPU, every wrapped group in them, borrowing, priorities): the GPU
# figures, one part per call (each well under 10 minutes). Everything lands in $OUT/issue17-PART.tgz.
#   1: spin: alone at 10-90%, the 30/70 pair taking turns and time-sliced, 50 beside an unlimited wrapped
#      group, the burst (--sm 30 --sm-borrow alone, then a --sm 50 neighbour: the time to give back)
#   2: the small-kernel MLP: alone at 50%, the 50/50 pair taking turns and time-sliced, 50 beside an
#      unlimited wrapped MLP, the burst
#   3: matmul alone at 10-90% and the 30/70 pair, 50 beside an unlimited neighbour
#   4: priorities: 60/60 (more than the GPU) high against low, and 50/50 high against low (spin)
#   5: the GPU tests, and the launch overheads (no share, --sm 99)
set -u
PART=${1:-1}
R=$PWD
W=$(mktemp -d)
source scripts/gpu_setup.sh >"$W/setup.log" 2>&1; tail -2 "$W/setup.log"
nvidia-smi -L > "$W/machine.txt"
PNG=1; python3 -c "import matplotlib" 2>/dev/null || PNG=0
png() { if [ $PNG = 1 ]; then echo "$W/$1"; else echo ""; fi; }
pack() { tar czf "$OUT/issue17-$PART.tgz" -C "$W" .; }
bench() { name=$1; shift; python3 -m pyvgpu bench sm --png "$(png "$name.png")" --output "$W/$name.json" "$@" \
            > "$W/$name.txt" 2>&1; tail -20 "$W/$name.txt"; pack; }
cd "$W"  # the installed pyvgpu, not the tree's
case "$PART" in
1) bench sm-spin --workload spin --sliced --neighbour unlimited --burst ;;
2) bench sm-mlp --workload mlp --targets 50 --pair 50,50 --sliced --neighbour unlimited --burst ;;
3) bench sm-matmul --workload matmul --neighbour unlimited ;;
4) bench sm-prio-60 --workload spin --targets "" --pair 60,60 --priorities high,low
   bench sm-prio-50 --workload spin --targets "" --pair 50,50 --priorities high,low ;;
5) (cd "$R/tests" && timeout 400 python3 -m pytest -p no:cacheprovider -m gpu gpu -v -s > "$W/gpu-tests.log" 2>&1)
   grep -E "PASSED|FAILED|ERROR|passed|failed" "$W/gpu-tests.log" | tail -8; pack
   python3 -m pyvgpu bench overhead --rounds 5 --output "$W/overhead.json" 2>&1 | tail -3; pack
   python3 -m pyvgpu bench overhead --rounds 5 --sm 99 --output "$W/overhead-sm99.json" 2>&1 | tail -3; pack ;;
*) echo "part 1-5"; exit 2 ;;
esac
