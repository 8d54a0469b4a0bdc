#!/bin/bash
# GPU run AI (one H200): mask-free, int32 and TMA variants of the fp32 RMSNorm forward and of SwiGLU against
# torch.compile in 6 interleaved rounds (benchmarks/probes/mask_free_probe.py).
set -u
L=$OUT/logs; mkdir -p $L
timeout 540 python benchmarks/probes/mask_free_probe.py $OUT/mask_free_probe.csv > $L/ai.log 2>&1; echo "ai rc=$?" >> $L/ai.log
grep -v "^  File\|^    " $L/ai.log | tail -75
