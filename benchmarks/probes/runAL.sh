#!/bin/bash
# GPU run AL (nvidia-h200-x2): the floor under the two ops level with torch.compile (RMSNorm fp32 forward, SwiGLU).
# ceiling_probe.py on each GPU, in two processes: the second is an independent repeat (inductor picks its reduction
# configuration per process).
set -u
L=$OUT/logs; mkdir -p $L
for g in 0 1; do
  (export CUDA_VISIBLE_DEVICES=$g
   timeout 540 python benchmarks/probes/ceiling_probe.py $OUT/ceiling_gpu$g.csv $OUT/inductor_code_gpu$g.py \
     > $L/al$g.log 2>&1; echo "al$g rc=$?" >> $L/al$g.log) &
done
wait
for g in 0 1; do echo "== GPU $g"; grep -vE "^\s+(File|\^|raise|return)" $L/al$g.log | grep -E "FAILED|rc=|copy ceiling|^[a-z]|  " | cut -c1-200; done
