#!/bin/bash
# GPU run P (one H200): the compile caches with the Triton ops as custom ops. The same compiled all-Triton config
# (exported + dynamic + bucket 128 + layer scope) twice in fresh processes sharing one inductor cache directory:
# the first compiles and fills the FX graph / AOTAutograd caches, the second should load from them (shorter
# compile_s) and run (before the custom ops, a cache-hit process hit CUDA illegal memory accesses twice).
set -u
L=$OUT/logs; mkdir -p $L
R=runs/campaign
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache-P
rm -rf $TORCHINDUCTOR_CACHE_DIR
CMP="--preset gr00t-n1.6 --micro-batch 8 --seq-len 2048 --steps 16 --warmup 6 --log-every 4
     --wb-config $R/gr00t-n1.6-proxy/config.yaml
     --wb-config-set model.name=gr00t-n1.6 --wb-config-set model.config_path=null
     --wb-config-set loongforge.compute_domain.compile_shapes=dynamic --wb-config-set data.bucket_width=128
     --wb-config-set loongforge.compute_domain.compile_scope=layer"
for i in 1 2; do
  timeout 110 python benchmarks/loop_bench.py $CMP --timeout 105 --variants wb_config --out $OUT/P$i > $L/P$i.log 2>&1
  echo "P$i rc=$?" >> $L/P$i.log
  grep -E "^\[|rc=" $L/P$i.log; grep -E "illegal|Error" $OUT/P$i/wb_config-0/log.txt | tail -3
  python -c "import json,sys; d=json.load(open(sys.argv[1])); print('compile_s', d['time/compile_s'])" \
      $OUT/P$i/wb_config-0/summary.json
done
du -sh $TORCHINDUCTOR_CACHE_DIR
tar czf $OUT/runP.tgz $OUT/P1 $OUT/P2 $L 2>/dev/null
