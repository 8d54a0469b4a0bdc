#!/bin/bash
# GPU run AO: the RMSNorm forward with the row length a constexpr against the runtime-D kernel and
# torch.compile (rms_constexpr_d_probe.py), one process per GPU (on two, an independent repeat).
set -u
L=$OUT/logs; mkdir -p $L
G=$(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 )))
for g in $G; do
  (export CUDA_VISIBLE_DEVICES=$g
   timeout 540 python benchmarks/probes/rms_constexpr_d_probe.py $OUT/rms_constexpr_d_gpu$g.csv > $L/ao$g.log 2>&1
   echo "ao$g rc=$?" >> $L/ao$g.log) &
done
wait
for g in $G; do echo "== GPU $g"; grep -E "Error|rc=|copy ceiling|^inductor|^(fp32|bf16|fused)|^  " $L/ao$g.log | cut -c1-300; done
