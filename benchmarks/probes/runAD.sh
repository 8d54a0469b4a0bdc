#!/bin/bash
# GPU run AD (nvidia-h200-x2): int32 against int64 offsets, paired with torch.compile in 6 interleaved rounds.
# GPU 0: the fp32 RMSNorm forward; GPU 1: SwiGLU forward and backward.
set -u
L=$OUT/logs; mkdir -p $L
P=benchmarks/probes/int32_index_probe.py
(export CUDA_VISIBLE_DEVICES=0; timeout 400 python $P rmsnorm $OUT/int32_rmsnorm.csv 6 > $L/ad0.log 2>&1; echo "ad0 rc=$?" >> $L/ad0.log) &
(export CUDA_VISIBLE_DEVICES=1; timeout 400 python $P swiglu $OUT/int32_swiglu.csv 6 > $L/ad1.log 2>&1; echo "ad1 rc=$?" >> $L/ad1.log) &
wait
tar czf $OUT/runAD.tgz $OUT/*.csv $L 2>/dev/null
grep -v "^\s*$" $L/ad0.log | tail -22; grep -v "^\s*$" $L/ad1.log | tail -34
