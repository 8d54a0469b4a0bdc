#!/bin/bash
# GPU run L (nvidia-h200-x2): run F split over the two GPUs (each measurement on one GPU only).
#   GPU 0: the compiled 28-layer step with every op on Triton alone in a fresh process (blocking launches if it
#          fails), then the end-to-end step, one process per variant
#   GPU 1: the dW split probe, the torch loss op's vocab padding A/B, the fused-loss quick sweep
set -u
L=$OUT/logs; mkdir -p $L
T=${E2E_S:-300}
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python benchmarks/probes/compile_ops_diag.py 28 all:best > $L/diag28.log 2>&1; echo "diag28 rc=$?" >> $L/diag28.log
 if ! grep -q "rc=0" $L/diag28.log; then
     timeout 150 python benchmarks/probes/compile_ops_diag.py 28 all:best:blocking > $L/diag28b.log 2>&1
 fi
 timeout $T python -m kernels.bench --kernels none --e2e --launch benchmarks/results/kernels_best_launch_h200_2026-11-29.json \
     --out $OUT/ke > $L/e2e.log 2>&1; echo "e2e rc=$?" >> $L/e2e.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 60 python benchmarks/probes/ce_dw_probe.py > $L/ce_probe.log 2>&1
 timeout 120 python benchmarks/probes/vocab_pad_ab.py $L/vocab_pad_ab.csv > $L/vocab_pad.log 2>&1
 timeout 150 python -m kernels.bench --kernels fused_linear_ce --quick --out $OUT/kce > $L/kce.log 2>&1; echo "kce rc=$?" >> $L/kce.log) &
wait
tail -9 $L/diag28.log; [ -f $L/diag28b.log ] && tail -18 $L/diag28b.log
tail -6 $L/ce_probe.log; tail -4 $L/vocab_pad.log; grep -E "PASS|FAIL|rc=" $L/kce.log
grep -E "own process|PASS|FAIL|rc=" $L/e2e.log
tar czf $OUT/logsL.tgz -C $OUT logs kce ke
