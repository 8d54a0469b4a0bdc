#!/bin/bash
# GPU run AU, on the commit with run AT's defaults and fwd_passes: those defaults and the knob through the model's
# call, paired with torch.compile's training forward (rms_defaults_probe.py).
set -u
L=$OUT/logs; mkdir -p $L
timeout 420 python benchmarks/probes/rms_defaults_probe.py $OUT/rms_defaults_au.csv > $L/au.log 2>&1
echo "au rc=$?" >> $L/au.log
grep -E "Error|rc=|copy ceiling|^(fp32|bf16|fused)|^  " $L/au.log | cut -c1-200
# the kernel benchmark's quick sweep of RMSNorm at the gr00t shape: fwd_passes in its CSV and one-at-a-time sweep
timeout 240 python -m kernels.bench --quick --kernels rmsnorm --out $OUT/bench_au > $L/au_bench.log 2>&1
echo "bench rc=$?" >> $L/au_bench.log
tail -4 $L/au_bench.log | cut -c1-200
