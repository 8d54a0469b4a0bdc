#!/bin/bash
# GPU run J (nvidia-h200-x2), issue 8 phase 1: the proxy search on GPU 0 and the 24-configuration grid on GPU 1,
# at the same time (separate GPUs, 32 host cores; each study's figures come from one GPU only). The studies'
# storage stays under runs/campaign
# (first tried 2026-11-30 01:47 with trials that compiled inside their measured windows: discarded, see
# Trainer.precompile) (git-ignored: kept on the warm machine for run K) and comes back as a tarball.
set -u
L=$OUT/logs; mkdir -p $L
R=runs/campaign; rm -rf $R; mkdir -p $R
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
(CUDA_VISIBLE_DEVICES=0 timeout 560 python -m workbench.tune --study gr00t-n1.6-proxy --out $R --timeout 270 \
    --no-progress > $L/search.log 2>&1; echo "search rc=$?" >> $L/search.log) &
(CUDA_VISIBLE_DEVICES=1 timeout 570 python -m workbench.tune --study gr00t-n1.6-grid --out $R --timeout 500 \
    --no-progress --no-report > $L/grid.log 2>&1; echo "grid rc=$?" >> $L/grid.log) &
wait
tail -25 $L/search.log; tail -30 $L/grid.log
tar czf $OUT/runsJ.tgz --exclude='*.pt' --exclude='*.pickle' runs/campaign
cp $L/*.log $OUT/ 2>/dev/null; ls -la $OUT; du -sh runs/campaign
