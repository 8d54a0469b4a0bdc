#!/bin/bash
# GPU run AN (nvidia-h200-x2): the RMSNorm forward reading each row twice at a whole-row tile, as inductor does
# (rms_two_pass_probe.py), one process per GPU (on two, an independent repeat).
set -u
L=$OUT/logs; mkdir -p $L
G=$(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 )))
for g in $G; do
  (export CUDA_VISIBLE_DEVICES=$g
   timeout 540 python benchmarks/probes/rms_two_pass_probe.py $OUT/rms_two_pass_gpu$g.csv > $L/an$g.log 2>&1
   echo "an$g rc=$?" >> $L/an$g.log) &
done
wait
for g in $G; do echo "== GPU $g"; grep -E "Error|rc=|copy ceiling|^inductor|^fp32|^  " $L/an$g.log | cut -c1-300; done
