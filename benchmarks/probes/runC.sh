#!/bin/bash
# GPU run C: compile/graph kernel tests, then the end-to-end gr00t step, torch vs Triton ops, eager and compiled.
set -u
L=$OUT/logs; mkdir -p $L
timeout 100 python -m pytest tests/test_kernels.py -q -p no:cacheprovider --tb=short -k "compile or graph or loss" > $L/pytest.log 2>&1; echo "tests rc=$?"
grep -E "^E  |passed|failed" $L/pytest.log | head -20
timeout 400 python -m kernels.bench --kernels none --e2e --launch benchmarks/results/kernels_best_launch_h200_2026-11-29.json --out $OUT/ke > $L/e2e.log 2>&1; echo "e2e rc=$?"
grep -E "^\[|^\||PASS|FAIL" $L/e2e.log | tail -24
tar czf $OUT/logsC.tgz -C $OUT logs ke
