#!/bin/bash
# GPU run X (nvidia-h200-x2): run W's paired comparison for the other two modes, and the RMSNorm sweep at hidden
# 4,096 with the backward's new parameters (bwd_tiles_in_flight included).
#   GPU 0: eager, torch ops against Triton ops + fused residual adds, one process, 6 interleaved rounds; then the
#          RMSNorm sweep at hidden 4,096 (bf16 out; fused add)
#   GPU 1: compile + CUDA graphs (reduce-overhead), the same pair, one process, 12 interleaved rounds
set -u
L=$OUT/logs; mkdir -p $L
E="python -m kernels.bench --kernels none --e2e --e2e-isolation none --launch benchmarks/probes/launch_rms_H.json"
(export CUDA_VISIBLE_DEVICES=0
 timeout 150 $E --e2e-rounds 6 --e2e-variants torch:eager,triton_fused:eager --out $OUT/x0 > $L/x0.log 2>&1
 echo "x0 rc=$?" >> $L/x0.log
 timeout 200 python -m kernels.bench --kernels rmsnorm --shapes "hidden-4096" --providers triton,torch_compile \
     --out $OUT/kr4 > $L/kr4.log 2>&1; echo "kr4 rc=$?" >> $L/kr4.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 400 $E --e2e-rounds 12 --e2e-variants torch:graphs,triton_fused:graphs --out $OUT/x1 > $L/x1.log 2>&1
 echo "x1 rc=$?" >> $L/x1.log) &
wait
tar czf $OUT/runX.tgz $OUT/x0 $OUT/x1 $OUT/kr4 $L 2>/dev/null
grep -E "round 0|paired|rc=|Error" $L/x0.log $L/x1.log | tail -10
grep -E "^\| rmsnorm|PASS|FAIL|rc=" $L/kr4.log
