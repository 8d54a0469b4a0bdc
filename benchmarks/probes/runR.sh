#!/bin/bash
# GPU run R (nvidia-h200-x2), after every residual add is fused into the norm that follows it
# (fused_residual_norm: the block hands its MLP output to the next block's first norm) and the fused norm's
# backward writes the branch's bf16 gradient itself; e2e mode "graphs" (reduce-overhead: CUDA graphs).
#   GPU 0: end to end compiled (torch / triton / triton_fused, profiled), then with CUDA graphs (torch,
#          triton_fused)
#   GPU 1: end to end eager (torch / triton / triton_fused), triton with CUDA graphs, the RMSNorm sweep
set -u
L=$OUT/logs; mkdir -p $L
LJ=benchmarks/results/kernels_best_launch_h200_2026-11-29.json
(export CUDA_VISIBLE_DEVICES=0
 timeout 300 python -m kernels.bench --kernels none --e2e --e2e-profile --launch $LJ \
     --e2e-variants torch:compile,triton:compile,triton_fused:compile --out $OUT/keC > $L/keC.log 2>&1
 echo "keC rc=$?" >> $L/keC.log
 timeout 250 python -m kernels.bench --kernels none --e2e --launch $LJ \
     --e2e-variants torch:graphs,triton_fused:graphs --out $OUT/keG > $L/keG.log 2>&1
 echo "keG rc=$?" >> $L/keG.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 200 python -m kernels.bench --kernels none --e2e --e2e-profile --launch $LJ \
     --e2e-variants torch:eager,triton:eager,triton_fused:eager --out $OUT/keE > $L/keE.log 2>&1
 echo "keE rc=$?" >> $L/keE.log
 timeout 150 python -m kernels.bench --kernels none --e2e --launch $LJ \
     --e2e-variants triton:graphs --out $OUT/keG1 > $L/keG1.log 2>&1
 echo "keG1 rc=$?" >> $L/keG1.log
 timeout 180 python -m kernels.bench --kernels rmsnorm --quick --providers triton,torch,torch_compile \
     --out $OUT/kr > $L/kr.log 2>&1; echo "kr rc=$?" >> $L/kr.log) &
wait
for f in keC keG keE keG1; do grep -E "own process|PASS|FAIL|INFO|rc=" $L/$f.log | tail -10; done
grep -E "PASS|FAIL|rc=" $L/kr.log | tail -6
tar czf $OUT/runR.tgz $OUT/keC $OUT/keG $OUT/keE $OUT/keG1 $OUT/kr $L 2>/dev/null
ls $OUT
