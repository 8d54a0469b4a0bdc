#!/bin/bash
# GPU run Y (nvidia-h200-x2): the RMSNorm backward's dw partials summed by a Triton kernel instead of torch's sum(0).
#   GPU 0: the RMSNorm sweep at hidden 2,048 (fp32; bf16 out; fused add)
#   GPU 1: the dw-sum probe (torch against the Triton kernel at several block shapes), then the sweep at 4,096
set -u
L=$OUT/logs; mkdir -p $L
(export CUDA_VISIBLE_DEVICES=0
 timeout 330 python -m kernels.bench --kernels rmsnorm --shapes "8x2048x2048" --providers triton,torch_compile \
     --out $OUT/y0 > $L/y0.log 2>&1; echo "y0 rc=$?" >> $L/y0.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 60 python benchmarks/probes/rms_dw_sum_probe.py $OUT/rms_dw_sum_probe.csv > $L/probe.log 2>&1
 echo "probe rc=$?" >> $L/probe.log
 timeout 270 python -m kernels.bench --kernels rmsnorm --shapes "8x2048x4096" --providers triton,torch_compile \
     --out $OUT/y1 > $L/y1.log 2>&1; echo "y1 rc=$?" >> $L/y1.log) &
wait
tar czf $OUT/runY.tgz $OUT/y0 $OUT/y1 $OUT/rms_dw_sum_probe.csv $L 2>/dev/null
cat $L/probe.log | cut -c1-100
grep -E "PASS|FAIL|rc=" $L/y0.log $L/y1.log
