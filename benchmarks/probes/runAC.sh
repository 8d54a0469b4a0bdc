#!/bin/bash
# GPU run AC (nvidia-h200-x2). GPU 0: kernels.bench for RoPE (block_t in the sweep; gradients in the model's
# layout; the compiled reference's backward traced for gradients laid out like its outputs), then the RMSNorm
# streaming-store probe. GPU 1: the paired compiled end-to-end step (torch ops against Triton ops with fused
# residual adds, 8 interleaved rounds) on this code, launch_rms_H.
set -u
L=$OUT/logs; mkdir -p $L
(export CUDA_VISIBLE_DEVICES=0
 timeout 300 python -m kernels.bench --kernels rope --out $OUT/ac0 > $L/ac0.log 2>&1; echo "ac0 rc=$?" >> $L/ac0.log
 timeout 200 python benchmarks/probes/rms_fwd_store_probe.py $OUT/rms_fwd_store.csv 6 > $L/ac_rms.log 2>&1
 echo "ac_rms rc=$?" >> $L/ac_rms.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 500 python -m kernels.bench --kernels none --e2e --e2e-isolation none --e2e-rounds 8 \
   --launch benchmarks/probes/launch_rms_H.json --e2e-variants torch:compile,triton_fused:compile --out $OUT/ac1 \
   > $L/ac1.log 2>&1; echo "ac1 rc=$?" >> $L/ac1.log) &
wait
tar czf $OUT/runAC.tgz $OUT/ac0 $OUT/ac1 $OUT/*.csv $L 2>/dev/null
tail -14 $L/ac0.log; cat $L/ac_rms.log | tail -18; grep -E "paired|rc=|Error" $L/ac1.log | tail -6
