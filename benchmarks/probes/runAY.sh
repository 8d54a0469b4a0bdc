#!/bin/bash
# GPU run AY: the RMSNorm forward's defaults below a tile of 1,024 columns (hidden 256, 512 and 768), never
# measured before, through the model's call, paired with torch.compile's training forward
# (rms_defaults_probe.py --small).
set -u
L=$OUT/logs; mkdir -p $L
timeout 500 python benchmarks/probes/rms_defaults_probe.py $OUT/rms_small_ay.csv --small > $L/ay.log 2>&1
echo "ay rc=$?" >> $L/ay.log
grep -E "Error|rc=|copy ceiling|^(fp32|bf16|fused)|^  " $L/ay.log | cut -c1-200
