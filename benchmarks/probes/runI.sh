#!/bin/bash
# GPU run I (nvidia-h200-x8, when lent), issue 9: tune bucket_size_mb / overlap_ratio / micro-batch for the full
# gr00t-n1.6 over 8 GPUs, then the side-by-side grid against DDP with its 25 MB buckets. NVLink multicast off.
set -u
L=$OUT/logs; mkdir -p $L
export NCCL_NVLS_ENABLE=0
timeout 330 python -m workbench.tune --study gr00t-n1.6-8gpu --gpus 8 --out runs --timeout 240 --no-progress \
    > $L/tune8.log 2>&1; echo "tune rc=$?"; tail -8 $L/tune8.log
timeout 250 torchrun --standalone --nproc-per-node 8 benchmarks/overlap_bench.py --layers 28 --bucket-sizes 25,200 \
    --ratios 0.5,1 --budget-s 180 --out $OUT/ov8 > $L/ov8.log 2>&1; echo "overlap8 rc=$?"; tail -10 $L/ov8.log
tar czf $OUT/logsI.tgz -C $OUT logs ov8
