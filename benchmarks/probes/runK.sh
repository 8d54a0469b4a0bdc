#!/bin/bash
# GPU run K (nvidia-h200-x2), after run J on the same warm machine (runs/campaign kept; else carried):
#   GPU 0: issue 8 phase 2, the full-depth side by side (campaign.sh compare: exported proxy winner, untuned
#          default, plain reference eager and compiled, one process per variant, repeats interleaved)
#   GPU 1: optionally the grid's remaining trials (GRID_S seconds), then issue 7's memory domain (run G), then
#          issue 6's compiled 28-layer Triton step (compile_ops_diag)
set -u
L=$OUT/logs; mkdir -p $L
R=runs/campaign
export NCCL_NVLS_ENABLE=0
ls $R/gr00t-n1.6-proxy/config.yaml || exit 3
(CUDA_VISIBLE_DEVICES=0 timeout 575 bash benchmarks/campaign.sh compare $R $OUT/campaign > $L/compare.log 2>&1
 echo "compare rc=$?" >> $L/compare.log) &
(if [ "${GRID_S:-0}" -gt 0 ]; then
   CUDA_VISIBLE_DEVICES=1 timeout $((GRID_S + 60)) python -m workbench.tune --study gr00t-n1.6-grid --out $R \
       --timeout $GRID_S --no-progress --no-report > $L/grid2.log 2>&1; echo "grid rc=$?" >> $L/grid2.log
 fi
 MEM_S=$((330 - ${GRID_S:-0}))
 CUDA_VISIBLE_DEVICES=1 timeout $MEM_S python benchmarks/memory_bench.py --micro-batches 4,8 --steps 6 --warmup 3 \
     --timeout 100 --out $OUT/mem > $L/mem.log 2>&1; echo "memory_bench rc=$?" >> $L/mem.log
 # then issue 6: the compiled 28-layer step with every op on Triton, alone in a fresh process
 CUDA_VISIBLE_DEVICES=1 timeout 200 python benchmarks/probes/compile_ops_diag.py 28 all:best > $L/diag28.log 2>&1) &
wait
tail -22 $L/compare.log; tail -16 $L/mem.log; tail -12 $L/diag28.log; [ -f $L/grid2.log ] && tail -6 $L/grid2.log
tar czf $OUT/runsK.tgz runs/campaign $OUT/campaign $OUT/mem $L 2>/dev/null
ls -la $OUT
