#!/bin/bash
# GPU run W (nvidia-h200-x2): the end-to-end compiled step, torch ops against Triton ops + fused residual adds, both
# in ONE process per GPU, in 12 interleaved rounds (paired per round: the torch step varied by 8 ms from process to
# process in runs U and V, more than the difference sought). RMSNorm launch: run V's grid best (launch_rms_H:
# backward 8 warps, 1 row, 2 programs per SM, the next tile loaded ahead). GPU 0 torch first, GPU 1 Triton first.
set -u
L=$OUT/logs; mkdir -p $L
E="python -m kernels.bench --kernels none --e2e --e2e-isolation none --e2e-rounds 12 --launch benchmarks/probes/launch_rms_H.json"
(export CUDA_VISIBLE_DEVICES=0
 timeout 420 $E --e2e-variants torch:compile,triton_fused:compile --out $OUT/w0 > $L/w0.log 2>&1; echo "w0 rc=$?" >> $L/w0.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 420 $E --e2e-variants triton_fused:compile,torch:compile --out $OUT/w1 > $L/w1.log 2>&1; echo "w1 rc=$?" >> $L/w1.log) &
wait
tar czf $OUT/runW.tgz $OUT/w0 $OUT/w1 $L 2>/dev/null
grep -E "round (0|11)|paired|rc=|Error" $L/w0.log $L/w1.log | tail -16
