#!/bin/bash
# GPU run AV: the fused linear cross-entropy, re-timed on the code as it is (its dW update as an aligned block of
# rows plus the tail, never timed), against three other dW layouts (ce_fused_probe.py), and kernels.bench's
# sweep of the loss (peak memory, the goal's check).
set -u
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 300 python benchmarks/probes/ce_fused_probe.py $OUT/ce_fused_av.csv > $L/av.log 2>&1
echo "av rc=$?" >> $L/av.log
grep -E "Error|rc=|copy ceiling|^(one|whole)|^  " $L/av.log | cut -c1-200
timeout 240 python -m kernels.bench --quick --kernels fused_linear_ce --out $OUT/bench_av > $L/av_bench.log 2>&1
echo "bench rc=$?" >> $L/av_bench.log
grep -E "fused_linear_ce|rc=" $L/av_bench.log | tail -12 | cut -c1-220
