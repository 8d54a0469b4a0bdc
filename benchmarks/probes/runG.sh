#!/bin/bash
# GPU run G (one H200), planned: issue 7's memory domain. workbench.memory analyze on the gr00t-n1.6 preset at
# micro-batch 4 and 8, torch's default allocator settings vs the settings the analysis suggests.
set -u
L=$OUT/logs; mkdir -p $L
timeout 560 python benchmarks/memory_bench.py --micro-batches 4,8 --steps 6 --warmup 3 --timeout 130 \
    --out $OUT/mem > $L/mem.log 2>&1; echo "memory_bench rc=$?"
tail -14 $L/mem.log
tar czf $OUT/logsG.tgz -C $OUT logs mem
