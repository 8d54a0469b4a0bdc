#!/bin/bash
# GPU run AE (one H200): the two-pass fp32 RMSNorm forward over chunk x rows x warps x num_stages (1 included),
# then the fastest against torch.compile in 6 interleaved rounds.
set -u
L=$OUT/logs; mkdir -p $L
timeout 400 python benchmarks/probes/rms_fwd_stages_probe.py $OUT/rms_fwd_stages.csv > $L/ae.log 2>&1; echo "ae rc=$?" >> $L/ae.log
tail -20 $L/ae.log
