#!/bin/bash
# GPU run U (nvidia-h200-x2): the RMSNorm backward with its own launch parameters (bwd_num_warps, bwd_block_rows,
# bwd_tiles_in_flight) and the fused add's residual gradient loaded with the other inputs.
#   GPU 0: the RMSNorm sweep of the cases as the model runs them (bf16 out; the fused residual add), both models
#   GPU 1: end to end, compiled: torch ops and Triton ops + fused residual adds under run S's best (launch_rms_A),
#          then the fused variant with the backward loading the next tile ahead (launch_rms_F)
set -u
L=$OUT/logs; mkdir -p $L
(export CUDA_VISIBLE_DEVICES=0
 timeout 330 python -m kernels.bench --kernels rmsnorm --shapes "fused add,bf16 out" \
     --providers triton,torch_compile --out $OUT/kr > $L/kr.log 2>&1; echo "kr rc=$?" >> $L/kr.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 220 python -m kernels.bench --kernels none --e2e --launch benchmarks/probes/launch_rms_A.json \
     --e2e-variants torch:compile,triton_fused:compile --out $OUT/keA > $L/keA.log 2>&1
 echo "keA rc=$?" >> $L/keA.log
 timeout 120 python -m kernels.bench --kernels none --e2e --launch benchmarks/probes/launch_rms_F.json \
     --e2e-variants triton_fused:compile --out $OUT/keF > $L/keF.log 2>&1
 echo "keF rc=$?" >> $L/keF.log) &
wait
tar czf $OUT/runU.tgz $OUT/kr $OUT/keA $OUT/keF $L 2>/dev/null
grep -E "^\| rmsnorm|PASS|FAIL|rc=" $L/kr.log | head -30
grep -E "own process|ms/step|rc=" $L/keA.log $L/keF.log | tail -8
