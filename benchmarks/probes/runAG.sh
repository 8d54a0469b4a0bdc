#!/bin/bash
# GPU run AG (nvidia-h200-x2): kernels.bench for RMSNorm, SwiGLU and RoPE on this code (fwd_block_size 2,048 among
# the candidates, RoPE's block_t, each mode also against a copy of as many bytes); GPU 0 the gr00t shapes,
# GPU 1 hidden 4,096.
set -u
L=$OUT/logs; mkdir -p $L
B="python -m kernels.bench --kernels rmsnorm,swiglu,rope"
(export CUDA_VISIBLE_DEVICES=0; timeout 560 $B --shapes gr00t-n1.6 --out $OUT/ag0 > $L/ag0.log 2>&1; echo "ag0 rc=$?" >> $L/ag0.log) &
(export CUDA_VISIBLE_DEVICES=1; timeout 560 $B --shapes hidden-4096 --out $OUT/ag1 > $L/ag1.log 2>&1; echo "ag1 rc=$?" >> $L/ag1.log) &
wait
tar czf $OUT/runAG.tgz $OUT/ag0 $OUT/ag1 $L 2>/dev/null
grep -E "PASS|FAIL|rc=|Error|wrote" $L/ag0.log $L/ag1.log | cut -c1-260
