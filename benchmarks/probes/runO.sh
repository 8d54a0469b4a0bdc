#!/bin/bash
# GPU run O (nvidia-h200-x2), after run N: every variant is the exported config with compile_shapes: dynamic and
# bucket width 128 (run N's best), at full depth
#   GPU 0: that variant again (a repeat), the compiled reference again, then compile_scope: layer
#   GPU 1: compile_scope: layer with the torch ops (inductor's own fusions), then the same with the fused Triton loss
#          (model scope with torch ops did not finish compiling + capturing within 175 s in run N)
set -u
L=$OUT/logs; mkdir -p $L
R=runs/campaign
CMP="--preset gr00t-n1.6 --micro-batch 8 --seq-len 2048 --steps 16 --warmup 6 --log-every 4
     --wb-config $R/gr00t-n1.6-proxy/config.yaml --wb-base $R/gr00t-n1.6-proxy/baseline/0/config.yaml
     --wb-config-set model.name=gr00t-n1.6 --wb-config-set model.config_path=null
     --wb-config-set loongforge.compute_domain.compile_shapes=dynamic --wb-config-set data.bucket_width=128"
LAYER="--wb-config-set loongforge.compute_domain.compile_scope=layer"
TORCH="--wb-config-set loongforge.compute_domain.triton_fusion=false"
lb() { local name=$1 t=$2 total=$3; shift 3
       timeout $total python benchmarks/loop_bench.py $CMP "$@" --timeout $t --out $OUT/$name > $L/$name.log 2>&1
       echo "$name rc=$?" >> $L/$name.log; }
(export CUDA_VISIBLE_DEVICES=0
 lb O1 185 295 --variants wb_config,ref_compiled
 lb O2 170 175 $LAYER --variants wb_config) &
(export CUDA_VISIBLE_DEVICES=1
 lb O3 225 230 $LAYER $TORCH --variants wb_config
 lb O4 225 230 $LAYER $TORCH --wb-config-set loongforge.compute_domain.ops.loss=triton --variants wb_config) &
wait
for f in O1 O2 O3 O4; do grep -E "^\[|rc=" $L/$f.log; grep -A4 "^variant" $L/$f.log | tail -2; done
tar czf $OUT/runO.tgz $OUT/O1 $OUT/O2 $OUT/O3 $OUT/O4 $L 2>/dev/null
