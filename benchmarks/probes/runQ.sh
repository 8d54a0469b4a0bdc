#!/bin/bash
# GPU run Q (nvidia-h200-x2), after the norms write autocast's dtype (bf16) directly under autocast:
#   GPU 0: issue 6's end-to-end step compiled, torch / triton / triton_fused ops, one process each, profiled
#          (e2e_profile.csv: top 40 CUDA kernels per step), then Triton for every op but the loss
#   GPU 1: the RMSNorm forward probe (inductor's code, kernel variants), the RMSNorm sweep with the new
#          fp32-in bf16-out case, then the end-to-end step eager (torch / triton / triton_fused), profiled
set -u
L=$OUT/logs; mkdir -p $L
LJ=benchmarks/results/kernels_best_launch_h200_2026-11-29.json
(export CUDA_VISIBLE_DEVICES=0
 timeout 400 python -m kernels.bench --kernels none --e2e --e2e-profile --launch $LJ \
     --e2e-variants torch:compile,triton:compile,triton_fused:compile --out $OUT/keC > $L/keC.log 2>&1
 echo "keC rc=$?" >> $L/keC.log
 timeout 150 python -m kernels.bench --kernels none --e2e --launch $LJ \
     --e2e-variants rmsnorm+fused+swiglu+rope:compile --out $OUT/keX > $L/keX.log 2>&1
 echo "keX rc=$?" >> $L/keX.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 120 python benchmarks/probes/rmsnorm_fwd_probe.py > $L/probe.log 2>&1; echo "probe rc=$?" >> $L/probe.log
 timeout 180 python -m kernels.bench --kernels rmsnorm --providers triton,torch,torch_compile \
     --out $OUT/kr > $L/kr.log 2>&1; echo "kr rc=$?" >> $L/kr.log
 timeout 240 python -m kernels.bench --kernels none --e2e --e2e-profile --launch $LJ \
     --e2e-variants torch:eager,triton:eager,triton_fused:eager --out $OUT/keE > $L/keE.log 2>&1
 echo "keE rc=$?" >> $L/keE.log) &
wait
tail -22 $L/probe.log
grep -E "PASS|FAIL|INFO|rc=" $L/kr.log | tail -12
for f in keC keX keE; do grep -E "own process|PASS|FAIL|INFO|profile|rc=" $L/$f.log | tail -12; done
tar czf $OUT/runQ.tgz $OUT/keC $OUT/keX $OUT/keE $OUT/kr $OUT/probeQ $L 2>/dev/null
ls -la $OUT
