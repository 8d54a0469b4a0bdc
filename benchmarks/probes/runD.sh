#!/bin/bash
# GPU run D (two H200s): the end-to-end kernel step on GPU 0, then the overlap scheduler grid vs DDP on both.
set -u
L=$OUT/logs; mkdir -p $L
nvidia-smi topo -m > $L/topo.txt 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 270 python -m kernels.bench --kernels none --e2e --launch benchmarks/results/kernels_best_launch_h200_2026-11-29.json --out $OUT/ke > $L/e2e.log 2>&1; echo "e2e rc=$?"
grep -E "^\[|^\||PASS|FAIL" $L/e2e.log | tail -16
export NCCL_NVLS_ENABLE=0
timeout 290 torchrun --standalone --nproc-per-node 2 benchmarks/overlap_bench.py --budget-s 200 --out $OUT/ov > $L/overlap.log 2>&1; echo "overlap rc=$?"
tail -22 $L/overlap.log
tar czf $OUT/logsD.tgz -C $OUT logs ke ov
