#!/bin/bash
# GPU run AH (one H200): kernels.bench for RoPE at both sizes after the tidy of its offsets (one offset vector per
# tensor instead of a scalar base plus a vector), to check it against run AG.
set -u
L=$OUT/logs; mkdir -p $L
timeout 300 python -m kernels.bench --kernels rope --out $OUT/ah > $L/ah.log 2>&1; echo "ah rc=$?" >> $L/ah.log
grep -E "PASS|FAIL|rc=|Error" $L/ah.log | cut -c1-200
