#!/bin/bash
# GPU run AT, on the commit that adds it: the one-pass forward's rstd store (between the row's load and its store,
# or last), and two passes over the whole row, paired with torch.compile's training forward (rms_one_pass_rstd_probe).
set -u
L=$OUT/logs; mkdir -p $L
timeout 420 python benchmarks/probes/rms_one_pass_rstd_probe.py $OUT/rms_one_pass_rstd_at.csv > $L/at.log 2>&1
echo "at rc=$?" >> $L/at.log
grep -E "Error|rc=|copy ceiling|^(fp32|bf16|fused)|^  " $L/at.log | cut -c1-200
