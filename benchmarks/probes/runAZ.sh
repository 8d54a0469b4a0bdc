#!/bin/bash
# GPU run AZ: the fused loss's softmax kernel with the logits read once from DRAM (rows per program, cache hints,
# the whole row in registers), checked against the kernel as it is, then the whole loss with the fastest variant
# swapped in, paired with torch.compile's unfused loss (ce_softmax_probe.py).
set -u
L=$OUT/logs; mkdir -p $L
timeout 500 python benchmarks/probes/ce_softmax_probe.py $OUT/ce_softmax_az.csv > $L/az.log 2>&1
echo "az rc=$?" >> $L/az.log
grep -vE "^\s*$|Warning|warn" $L/az.log | tail -70 | cut -c1-220
