#!/bin/bash
# GPU run S (nvidia-h200-x2): the fused norm's backward ran at 65% of copy in run R (its launch parameters were
# swept for the unfused norm). The compiled end-to-end step with every residual add fused, under five RMSNorm
# launch configurations (benchmarks/probes/launch_rms_{A..E}.json: one change each from the run-Q best), against
# torch ops compiled on GPU 0.
set -u
L=$OUT/logs; mkdir -p $L
run() {  # NAME LAUNCH VARIANTS
  timeout 150 python -m kernels.bench --kernels none --e2e --launch $2 --e2e-variants $3 --out $OUT/$1 \
      > $L/$1.log 2>&1; echo "$1 rc=$?" >> $L/$1.log
}
(export CUDA_VISIBLE_DEVICES=0
 run torch benchmarks/probes/launch_rms_A.json torch:compile
 run A benchmarks/probes/launch_rms_A.json triton_fused:compile
 run B benchmarks/probes/launch_rms_B.json triton_fused:compile) &
(export CUDA_VISIBLE_DEVICES=1
 run C benchmarks/probes/launch_rms_C.json triton_fused:compile
 run D benchmarks/probes/launch_rms_D.json triton_fused:compile
 run E benchmarks/probes/launch_rms_E.json triton_fused:compile) &
wait
for f in torch A B C D E; do grep -E "own process|rc=" $L/$f.log | tail -2; done
tar czf $OUT/runS.tgz $OUT/torch $OUT/A $OUT/B $OUT/C $OUT/D $OUT/E $L 2>/dev/null
