#!/bin/bash
# GPU run AS, on ba16684 (the forward's new registry defaults): rms_final_probe.py again, its "registry defaults"
# now the launches run AR found best.
set -u
L=$OUT/logs; mkdir -p $L
timeout 300 python benchmarks/probes/rms_final_probe.py $OUT/rms_final_as.csv > $L/as.log 2>&1; echo "as rc=$?" >> $L/as.log
grep -E "Error|rc=|copy ceiling|^(fp32|bf16|fused)|^  " $L/as.log | cut -c1-200
