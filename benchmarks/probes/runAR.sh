#!/bin/bash
# GPU run AR, on the final RMSNorm forward (D a constexpr, rstd stored after the second pass): rms_final_probe.py
# (the training forward against 1a5e719's kernel and torch.compile, 6 cases), and the paired compiled end-to-end
# step (torch ops against Triton ops with fused residual adds, launch_rms_H). On two GPUs side by side, on one in turn.
set -u
L=$OUT/logs; mkdir -p $L
N=$(nvidia-smi -L | wc -l)
probe() { CUDA_VISIBLE_DEVICES=0 timeout 240 python benchmarks/probes/rms_final_probe.py $OUT/rms_final.csv \
  > $L/ar0.log 2>&1; echo "ar0 rc=$?" >> $L/ar0.log; }
e2e() { CUDA_VISIBLE_DEVICES=$1 timeout $2 python -m kernels.bench --kernels none --e2e --e2e-isolation none \
  --e2e-rounds 6 --launch benchmarks/probes/launch_rms_H.json --e2e-variants torch:compile,triton_fused:compile \
  --out $OUT/ar1 > $L/ar1.log 2>&1; echo "ar1 rc=$?" >> $L/ar1.log; }
if [ "$N" -ge 2 ]; then probe & e2e 1 330 & wait; else probe; e2e 0 300; fi
grep -E "Error|rc=|copy ceiling|^(fp32|bf16|fused)|^  " $L/ar0.log | cut -c1-200
grep -E "paired|rc=|Error" $L/ar1.log | tail -6
