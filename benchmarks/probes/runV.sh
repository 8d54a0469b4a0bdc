#!/bin/bash
# GPU run V (nvidia-h200-x2): the RMSNorm backward's launch parameters crossed (probe), and the end-to-end compiled
# step replicated on both GPUs with run U's best RMSNorm launch (fused add: forward 2 warps x 1 row; backward 8 warps,
# 2 rows, 2 programs per SM, the next tile loaded ahead: launch_rms_G), torch ops and Triton ops + fused residual
# adds, the two GPUs in opposite orders.
set -u
L=$OUT/logs; mkdir -p $L
E="python -m kernels.bench --kernels none --e2e --launch benchmarks/probes/launch_rms_G.json"
(export CUDA_VISIBLE_DEVICES=0
 timeout 230 python benchmarks/probes/rms_bwd_grid.py $OUT/rms_bwd_grid.csv > $L/grid.log 2>&1; echo "grid rc=$?" >> $L/grid.log
 timeout 300 $E --e2e-variants triton_fused:compile,torch:compile --out $OUT/ke0 > $L/ke0.log 2>&1
 echo "ke0 rc=$?" >> $L/ke0.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 300 $E --e2e-variants torch:compile,triton_fused:compile --out $OUT/ke1 > $L/ke1.log 2>&1
 echo "ke1 rc=$?" >> $L/ke1.log) &
wait
tar czf $OUT/runV.tgz $OUT/ke0 $OUT/ke1 $OUT/rms_bwd_grid.csv $L 2>/dev/null
tail -14 $L/grid.log
grep -E "own process|rc=" $L/ke0.log $L/ke1.log
