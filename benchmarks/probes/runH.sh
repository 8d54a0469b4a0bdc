#!/bin/bash
# GPU run H (two H200s), planned: the overlap scheduler under torch.compile, block by block vs whole model
# (compile_scope layer vs model), against DDP, 8-block gr00t copy as in the eager grid.
set -u
L=$OUT/logs; mkdir -p $L
export NCCL_NVLS_ENABLE=0
for scope in layer model; do
    timeout 270 torchrun --standalone --nproc-per-node 2 benchmarks/overlap_bench.py --compile default \
        --compile-scope $scope --bucket-sizes 25 --ratios 0,1 --budget-s 200 --out $OUT/ov-$scope \
        > $L/overlap-$scope.log 2>&1; echo "overlap compile scope=$scope rc=$?"
    tail -8 $L/overlap-$scope.log
done
tar czf $OUT/logsH.tgz -C $OUT logs ov-layer ov-model
