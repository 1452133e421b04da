#!/bin/bash
# Where the --sm 99 launch overhead goes on a GPU: with turns, without (PYVGPU_SM_TURN=0), no share; the
# clock and an atomic add alone; then every GPU test.
set -u
ROOT=$PWD
bash scripts/gpu_check.sh none > $OUT/setup.log 2>&1
grep -E "machine|tree|CPU" /tmp/pyvgpu-gpu/summary.md
gcc -O2 -o /tmp/clk probe/clk.c && /tmp/clk; lscpu | grep -E "Model name|L1d|L1i|L2|Hypervisor"
cd /tmp
for r in 1 2; do
  PYVGPU_SCHED=/tmp/a.turns python3 -m pyvgpu bench overhead --rounds 5 --sm 99 --output /tmp/turns-$r.json 2>&1 | grep -E "^  launch" | sed "s/^/sm99 turns $r: /"
  PYVGPU_SM_TURN=0 PYVGPU_SCHED=/tmp/b.turns python3 -m pyvgpu bench overhead --rounds 5 --sm 99 --output /tmp/noturns-$r.json 2>&1 | grep -E "^  launch" | sed "s/^/sm99 no turns $r: /"
done
PYVGPU_SCHED=/tmp/c.turns python3 -m pyvgpu bench overhead --rounds 5 --output /tmp/none.json 2>&1 | grep -E "^  launch" | sed "s/^/no share: /"
tar czf $OUT/overhead.tgz -C /tmp turns-1.json turns-2.json noturns-1.json noturns-2.json none.json
cd $ROOT && OUT=/tmp/gpu2 bash scripts/gpu_check.sh tests > /tmp/gpu2.log 2>&1; sed -n '/## GPU tests/,$p' /tmp/gpu2/summary.md | tail -32
cp /tmp/gpu2/summary.md $OUT/summary-tests.md
