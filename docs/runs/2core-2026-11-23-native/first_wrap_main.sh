#!/bin/bash
# "before": main at 5ecb7ee, first wrap with an empty user cache (it compiles), 2-core box
export LD_LIBRARY_PATH=/tmp/nv-fake
for i in 1 2; do
  d=/tmp/nv-main-cold-$i; rm -rf $d
  echo "load before: $(cat /proc/loadavg)"
  s=$(date +%s.%N)
  PYVGPU_CACHE_DIR=$d /tmp/nv-main-venv/bin/python -m pyvgpu wrap -- /tmp/nv-main-venv/bin/python -c "import ctypes; print('rc', ctypes.CDLL('libcuda.so.1').cuInit(0))"
  e=$(date +%s.%N)
  echo "main first wrap, empty cache, run $i: $(echo "$e - $s" | bc) s; load after: $(cat /proc/loadavg)"
done
