#!/bin/bash
# GPU run F (one H200), planned for the next session: the open kernel items of issue 6.
#  1. the compiled 28-layer step with every op on Triton, alone in a fresh process (and blocking launches if it fails)
#  2. the dW split (aligned block + tail) against the single odd-row matmul: matmul probe, then the fused-loss sweep
#  3. the torch loss op's vocabulary padding, A/B in one process (benchmarks/probes/vocab_pad_ab.py)
#  4. the end-to-end step, one process per variant (kernels.bench --e2e isolates them on CUDA)
set -u
L=$OUT/logs; mkdir -p $L
timeout 200 python benchmarks/probes/compile_ops_diag.py 28 all:best > $L/diag28.log 2>&1; echo "diag28 rc=$?"; tail -9 $L/diag28.log
if ! grep -q "rc=0" $L/diag28.log; then
    timeout 200 python benchmarks/probes/compile_ops_diag.py 28 all:best:blocking loss:best:blocking > $L/diag28b.log 2>&1
    tail -18 $L/diag28b.log
fi
timeout 60 python benchmarks/probes/ce_dw_probe.py > $L/ce_probe.log 2>&1; tail -6 $L/ce_probe.log
timeout 120 python benchmarks/probes/vocab_pad_ab.py $L/vocab_pad_ab.csv > $L/vocab_pad.log 2>&1; tail -4 $L/vocab_pad.log
timeout 120 python -m kernels.bench --kernels fused_linear_ce --quick --out $OUT/kce > $L/kce.log 2>&1; echo "kce rc=$?"
grep -E "PASS|FAIL" $L/kce.log
timeout 330 python -m kernels.bench --kernels none --e2e --launch benchmarks/results/kernels_best_launch_h200_2026-11-29.json \
    --out $OUT/ke > $L/e2e.log 2>&1; echo "e2e rc=$?"
grep -E "own process|PASS|FAIL" $L/e2e.log
tar czf $OUT/logsF.tgz -C $OUT logs kce ke
