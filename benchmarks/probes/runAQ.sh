#!/bin/bash
# GPU run AQ: the rstd store of the RMSNorm forward, against torch.compile's training and inference
# forwards (rms_rstd_store_probe.py), one process per GPU (on two, an independent repeat).
set -u
L=$OUT/logs; mkdir -p $L
G=$(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 )))
for g in $G; do
  (export CUDA_VISIBLE_DEVICES=$g
   timeout 540 python benchmarks/probes/rms_rstd_store_probe.py $OUT/rms_rstd_store_gpu$g.csv $OUT/inductor_train_code_gpu$g.py > $L/aq$g.log 2>&1
   echo "aq$g rc=$?" >> $L/aq$g.log) &
done
wait
for g in $G; do echo "== GPU $g"; grep -E "Error|rc=|copy ceiling|^inductor|^(fp32|bf16|fused)|^  " $L/aq$g.log | cut -c1-300; done
