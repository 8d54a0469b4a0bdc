#!/bin/bash
# GPU run B: diagnostics, the compile/graph kernel tests, the full kernel benchmark.
set -u
L=$OUT/logs; mkdir -p $L
timeout 60 python benchmarks/probes/ce_dw_probe.py > $L/ce_probe.log 2>&1; echo "probe rc=$?"; cat $L/ce_probe.log | tail -6
timeout 70 python benchmarks/probes/fullgraph_diag.py > $L/diag.log 2>&1; echo "diag rc=$?"; grep -v Warning $L/diag.log | tail -25
timeout 90 python -m pytest tests/test_kernels.py -q -p no:cacheprovider --tb=short -k "compile or graph or fullgraph or loss" > $L/pytest.log 2>&1; echo "tests rc=$?"
grep -E "^E  |passed|failed" $L/pytest.log | head -20
timeout 340 python -m kernels.bench --out $OUT/kb --kernel-sweep $OUT/kb/kernel_sweep.csv > $L/bench.log 2>&1; echo "bench rc=$?"
sed -n '/Copy ceiling measured/,$p' $L/bench.log | tail -40
tar czf $OUT/logsB.tgz -C $OUT logs kb
