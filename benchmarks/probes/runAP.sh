#!/bin/bash
# GPU run AP: what separates our RMSNorm forward from inductor's at its launch: int64 offsets, the stride
# argument, the rstd store (rms_inductor_diff_probe.py), one process per GPU (on two, an independent repeat).
set -u
L=$OUT/logs; mkdir -p $L
G=$(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 )))
for g in $G; do
  (export CUDA_VISIBLE_DEVICES=$g
   timeout 540 python benchmarks/probes/rms_inductor_diff_probe.py $OUT/rms_inductor_diff_gpu$g.csv > $L/ap$g.log 2>&1
   echo "ap$g rc=$?" >> $L/ap$g.log) &
done
wait
for g in $G; do echo "== GPU $g"; grep -E "Error|rc=|copy ceiling|^inductor|^(fp32|bf16|fused)|^  " $L/ap$g.log | cut -c1-300; done
