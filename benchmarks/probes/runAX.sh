#!/bin/bash
# GPU run AX: the gr00t-n1.6 step end to end at the registry's defaults (no --launch: what a user gets), on the
# code as it is (fused loss at 8 warps), torch ops against Triton ops with fused residual adds, compiled and eager,
# in one process, 6 interleaved rounds.
set -u
L=$OUT/logs; mkdir -p $L
timeout 560 python -m kernels.bench --kernels none --e2e --e2e-isolation none --e2e-rounds 6 \
  --e2e-variants torch:compile,triton_fused:compile,torch:eager,triton_fused:eager \
  --out $OUT/ax > $L/ax.log 2>&1; echo "ax rc=$?" >> $L/ax.log
grep -E "paired|rc=|Error|ms/step|\| (torch|triton)" $L/ax.log | tail -14 | cut -c1-220
