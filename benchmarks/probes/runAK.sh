#!/bin/bash
# GPU run AK (nvidia-h200-x2), on the final code of the RMSNorm forward's unmasked path (4506966). GPU 0:
# kernels.bench for RMSNorm as the model runs it (bf16 out, fused add), both shape sets. GPU 1: the paired compiled
# end-to-end step (torch ops against Triton ops with fused residual adds, 8 interleaved rounds), launch_rms_H.
set -u
L=$OUT/logs; mkdir -p $L
(export CUDA_VISIBLE_DEVICES=0
 timeout 500 python -m kernels.bench --kernels rmsnorm --shapes "bf16 out,fused add" --out $OUT/ak0 > $L/ak0.log 2>&1
 echo "ak0 rc=$?" >> $L/ak0.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 500 python -m kernels.bench --kernels none --e2e --e2e-isolation none --e2e-rounds 8 \
   --launch benchmarks/probes/launch_rms_H.json --e2e-variants torch:compile,triton_fused:compile --out $OUT/ak1 \
   > $L/ak1.log 2>&1; echo "ak1 rc=$?" >> $L/ak1.log) &
wait
tar czf $OUT/runAK.tgz $OUT/ak0 $OUT/ak1 $L 2>/dev/null
grep -E "PASS|FAIL|rc=|Error|wrote" $L/ak0.log | cut -c1-220; grep -E "paired|rc=|Error" $L/ak1.log | tail -6
