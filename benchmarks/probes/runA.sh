#!/bin/bash
# GPU run A: kernel tests with real Triton, the fused-CE time probe, a quick kernel bench with GPU-only timing.
set -u
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $L/gpu.txt 2>&1
timeout 150 python -m pytest tests/test_kernels.py -q -x -p no:cacheprovider --tb=long -k "fullgraph" > $L/pytest_fullgraph.log 2>&1; echo "fullgraph rc=$?"
tail -5 $L/pytest_fullgraph.log
timeout 180 python benchmarks/probes/ce_dw_probe.py > $L/ce_probe.log 2>&1; echo "probe rc=$?"
grep -v '^\[' $L/ce_probe.log | tail -40
timeout 200 python -m kernels.bench --quick --kernels rmsnorm,swiglu,rope --out $OUT/kq > $L/bench_quick.log 2>&1; echo "bench rc=$?"
tail -25 $L/bench_quick.log
cp $OUT/kq/kernels_bench.csv $L/ 2>/dev/null
timeout 100 python -m pytest tests/test_kernels.py -q -p no:cacheprovider --tb=short > $L/pytest_all.log 2>&1; echo "all kernel tests rc=$?"
tail -8 $L/pytest_all.log
tar czf $OUT/logsA.tgz -C $OUT logs kq
