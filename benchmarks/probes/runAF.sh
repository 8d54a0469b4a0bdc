#!/bin/bash
# GPU run AF (one H200): the fp32 RMSNorm forward with the hidden size at run time or as a constexpr (and without
# the rstd store) against torch.compile in 6 interleaved rounds; inductor's generated code kept.
set -u
L=$OUT/logs; mkdir -p $L
timeout 400 python benchmarks/probes/rms_fwd_constexpr_probe.py $OUT/rms_fwd_constexpr.csv > $L/af.log 2>&1; echo "af rc=$?" >> $L/af.log
tail -20 $L/af.log
