#!/bin/bash
# GPU run T (nvidia-h200-x2): the two-pass RMSNorm forward (launch parameter fwd_block_size < hidden).
#   GPU 0: the RMSNorm sweep (both models, fp32 out and bf16 out) with fwd_block_size among the candidates
#   GPU 1: run S's best (8 warps) replicated: torch ops and Triton ops + fused residual adds, compiled, in one call
set -u
L=$OUT/logs; mkdir -p $L
(export CUDA_VISIBLE_DEVICES=0
 timeout 280 python -m kernels.bench --kernels rmsnorm --providers triton,torch,torch_compile --out $OUT/kr \
     > $L/kr.log 2>&1; echo "kr rc=$?" >> $L/kr.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 280 python -m kernels.bench --kernels none --e2e --launch benchmarks/probes/launch_rms_A.json \
     --e2e-variants torch:compile,triton_fused:compile --out $OUT/keA > $L/keA.log 2>&1
 echo "keA rc=$?" >> $L/keA.log) &
wait
grep -E "PASS|FAIL|rc=" $L/kr.log | tail -14
grep -E "own process|PASS|FAIL|rc=" $L/keA.log | tail -5
tar czf $OUT/runT.tgz $OUT/kr $OUT/keA $L 2>/dev/null
