#!/bin/bash
# GPU run AW: the fused loss's new default of 8 warps (from run AV's softmax-kernel sweep) against 16 warps, the
# whole loss paired with torch.compile's unfused loss (ce_fused_probe.py --warps), and kernels.bench's quick
# sweep of the loss at the new defaults (4 warps now a candidate).
set -u
L=$OUT/logs; mkdir -p $L
timeout 300 python benchmarks/probes/ce_fused_probe.py $OUT/ce_warps_aw.csv --warps > $L/aw.log 2>&1
echo "aw rc=$?" >> $L/aw.log
grep -E "Error|rc=|copy ceiling|^(one|whole)|^  " $L/aw.log | cut -c1-200
timeout 240 python -m kernels.bench --quick --kernels fused_linear_ce --out $OUT/bench_aw > $L/aw_bench.log 2>&1
echo "bench rc=$?" >> $L/aw_bench.log
grep -E "fused_linear_ce|rc=" $L/aw_bench.log | tail -6 | cut -c1-260
