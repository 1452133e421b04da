#!/bin/bash
# Why a bf16 matmul under a share does more than its share of the unlimited work: the SM clock and
# power, sampled by nvidia-smi every 100 ms, while the matmul runs unlimited, then under --sm 30/50/70,
# then the spin kernel unlimited and under --sm 50. Output: $OUT/clock.tgz.
set -u
W=$(mktemp -d)
bash scripts/gpu_check.sh none >"$W/setup.log" 2>&1  # install and warm up only
cd "$W"
B=$(python3 -c "from pyvgpu.native.shim import BENCH_BIN; print(BENCH_BIN)")
run() {  # name, command...
  name=$1; shift
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,power.limit,utilization.gpu,clocks_event_reasons.active --format=csv,noheader -lms 100 > "$W/$name.csv" &
  S=$!
  "$@" > "$W/$name.out" 2>&1
  kill $S; wait $S 2>/dev/null
  python3 - "$W/$name.csv" "$name" <<'PY'
import sys
rows=[l.split(", ") for l in open(sys.argv[1]) if l.strip()]
rows=rows[len(rows)//3:]  # after warm-up
num=lambda s: float(s.split()[0])
clk=[num(r[1]) for r in rows]; pw=[num(r[2]) for r in rows]; ut=[num(r[4]) for r in rows]
print(f"{sys.argv[2]:<14} sm clock {sum(clk)/len(clk):6.0f} MHz (min {min(clk):.0f}), power {sum(pw)/len(pw):5.0f} W of {rows[0][3]}, util {sum(ut)/len(ut):4.0f}%, reasons {sorted(set(r[5] for r in rows))}")
PY
}
run matmul-raw python3 -m pyvgpu.bench.sm_worker 8
for s in 30 50 70; do run matmul-sm$s python3 -m pyvgpu wrap --sm $s -- python3 -m pyvgpu.bench.sm_worker 8; done
run spin-raw "$B" sm 8 4600 kernel
run spin-sm50 python3 -m pyvgpu wrap --sm 50 -- "$B" sm 8 4600 kernel
tail -n 2 "$W"/matmul-*.out
tar czf "$OUT/clock.tgz" -C "$W" .
