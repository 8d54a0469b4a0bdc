#!/bin/bash
# GPU run AB (nvidia-h200-x2): RoPE with block_t tokens per program: the gradient layout the model feeds RoPE's
# backward, and a block_t x block_h x num_warps grid against torch.compile with the gradients in both layouts;
# GPU 0 the gr00t shape, GPU 1 the larger one.
set -u
L=$OUT/logs; mkdir -p $L
P=benchmarks/probes/rope_tile_probe.py
(export CUDA_VISIBLE_DEVICES=0; timeout 500 python $P gr00t-n1.6 $OUT/rope_tile_gr00t.csv > $L/ab0.log 2>&1; echo "ab0 rc=$?" >> $L/ab0.log) &
(export CUDA_VISIBLE_DEVICES=1; timeout 500 python $P hidden-4096 $OUT/rope_tile_4096.csv > $L/ab1.log 2>&1; echo "ab1 rc=$?" >> $L/ab1.log) &
wait
tar czf $OUT/runAB.tgz $OUT/*.csv $L 2>/dev/null
grep -E "layout|ceiling|mode|fwd |bwd |rc=|Error" $L/ab0.log $L/ab1.log | tail -24
