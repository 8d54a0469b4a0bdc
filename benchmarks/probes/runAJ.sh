#!/bin/bash
# GPU run AJ (nvidia-h200-x2). GPU 0: kernels.rmsnorm's forward with its unmasked path against the masked forward of
# 9b5819b and torch.compile, 6 paired rounds (benchmarks/probes/rms_even_probe.py). GPU 1: kernels.bench for
# RMSNorm on this code, both shape sets.
set -u
L=$OUT/logs; mkdir -p $L
(export CUDA_VISIBLE_DEVICES=0
 timeout 540 python benchmarks/probes/rms_even_probe.py $OUT/rms_even_probe.csv benchmarks/probes/rms_fwd_masked_kernel.py \
   > $L/aj0.log 2>&1; echo "aj0 rc=$?" >> $L/aj0.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 540 python -m kernels.bench --kernels rmsnorm --out $OUT/aj1 > $L/aj1.log 2>&1; echo "aj1 rc=$?" >> $L/aj1.log) &
wait
tar czf $OUT/runAJ.tgz $OUT/aj1 $OUT/*.csv $L 2>/dev/null
grep -v "^  File\|^    " $L/aj0.log | tail -45; grep -E "PASS|FAIL|rc=|Error|wrote" $L/aj1.log | cut -c1-200 | tail -30
