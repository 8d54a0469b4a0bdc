#!/bin/bash
# GPU run AM (nvidia-h200-x2): inductor's pick for the fp32 RMSNorm forward and our launch space screened around
# it (rms_fp32_sweep_probe.py), one process per GPU, each with its own inductor cache (an independent repeat).
set -u
L=$OUT/logs; mkdir -p $L
for g in 0 1; do
  (export CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_am$g
   rm -rf $TORCHINDUCTOR_CACHE_DIR
   timeout 540 python benchmarks/probes/rms_fp32_sweep_probe.py $OUT/rms_fp32_sweep_gpu$g.csv > $L/am$g.log 2>&1
   echo "am$g rc=$?" >> $L/am$g.log) &
done
wait
for g in 0 1; do echo "== GPU $g"; grep -E "Error|rc=|copy ceiling|^inductor|^rmsnorm|^  " $L/am$g.log | cut -c1-400; done
