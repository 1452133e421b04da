#!/bin/bash
# --sm 99 launch overhead: this tree (sampling gap), cmp-old (73cbd06) and varA (this tree, no periodic
# timing), installed side by side, run in turn, with and without turns.
set -u
ROOT=$PWD
bash scripts/gpu_check.sh none > $OUT/setup.log 2>&1
T0=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/old-site ./cmp-old > $OUT/old-install.log 2>&1 &
python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/varA-site ./varA > $OUT/varA-install.log 2>&1 &
wait
echo "aside installs $(( $(date +%s) - T0 )) s"; ls /tmp/old-site/pyvgpu/libpyvgpu_callbacks.so /tmp/varA-site/pyvgpu/libpyvgpu_callbacks.so
cd /tmp
b() { name=$1; site=$2; shift 2; d=$(mktemp -d)
  XDG_RUNTIME_DIR=$d PYTHONPATH=$site PYVGPU_SCHED=$d/turns python3 -m pyvgpu bench overhead --rounds 5 --sm 99 \
    --output /tmp/$name.json "$@" 2>&1 | grep -E "^  launch" | sed "s/^/$name: /"; }
for r in 1 2; do
  b new-$r "" ; b old-$r /tmp/old-site ; b varA-$r /tmp/varA-site
  PYVGPU_SM_TURN=0 b new-noturns-$r ""; PYVGPU_SM_TURN=0 b old-noturns-$r /tmp/old-site
done
python3 -c "
import json,glob
for f in sorted(glob.glob('/tmp/*-[12].json')):
    d=json.load(open(f)); print(f.split('/')[-1], d['callbacks'][:40], [round(r['paired_diff_median_ns']) for r in d['ops']['launch']['ab_rounds']])
"
tar czf $OUT/ab3.tgz -C /tmp $(cd /tmp && ls *-[12].json)
