#!/bin/bash
# GPU run Z (nvidia-h200-x2): run W's paired compiled comparison again on the final code (the dw partials summed by
# the Triton kernel, 16 columns per program): torch ops against Triton ops + fused residual adds, one process per
# GPU, 12 interleaved rounds; GPU 0 torch first, GPU 1 Triton first. RMSNorm launch: launch_rms_H.
set -u
L=$OUT/logs; mkdir -p $L
E="python -m kernels.bench --kernels none --e2e --e2e-isolation none --e2e-rounds 12 --launch benchmarks/probes/launch_rms_H.json"
(export CUDA_VISIBLE_DEVICES=0
 timeout 400 $E --e2e-variants torch:compile,triton_fused:compile --out $OUT/z0 > $L/z0.log 2>&1; echo "z0 rc=$?" >> $L/z0.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 400 $E --e2e-variants triton_fused:compile,torch:compile --out $OUT/z1 > $L/z1.log 2>&1; echo "z1 rc=$?" >> $L/z1.log) &
wait
tar czf $OUT/runZ.tgz $OUT/z0 $OUT/z1 $L 2>/dev/null
grep -E "round (0|11)|paired|rc=|Error" $L/z0.log $L/z1.log | tail -12
