#!/bin/bash
# GPU run N (nvidia-h200-x2), after run M:
#   GPU 0: issue 8's full-depth side by side, pass B (rotated order: wb_config as exported, ref_compiled, wb_base,
#          ref_eager)
#   GPU 1: the exported config with one knob family changed at a time, at full depth (compile_shapes: dynamic,
#          then bucket width 128, then the torch ops under compile, then torch ops with the fused Triton loss):
#          where the gap to the compiled reference comes from
set -u
L=$OUT/logs; mkdir -p $L
R=runs/campaign
export NCCL_NVLS_ENABLE=0
ls $R/gr00t-n1.6-proxy/config.yaml || exit 3
CMP="--preset gr00t-n1.6 --micro-batch 8 --seq-len 2048 --steps 16 --warmup 6 --log-every 4
     --wb-config $R/gr00t-n1.6-proxy/config.yaml --wb-base $R/gr00t-n1.6-proxy/baseline/0/config.yaml
     --wb-config-set model.name=gr00t-n1.6 --wb-config-set model.config_path=null"
(export CUDA_VISIBLE_DEVICES=0
 timeout 570 python benchmarks/loop_bench.py $CMP --timeout 330 \
     --variants wb_config,ref_compiled,wb_base,ref_eager --out $OUT/cmpC > $L/cmpC.log 2>&1
 echo "cmpC rc=$?" >> $L/cmpC.log) &
(export CUDA_VISIBLE_DEVICES=1
 D="--wb-config-set loongforge.compute_domain.compile_shapes=dynamic --wb-config-set data.bucket_width=128"
 timeout 200 python benchmarks/loop_bench.py $CMP $D --timeout 190 --variants wb_config --out $OUT/cmpD1 \
     > $L/cmpD1.log 2>&1; echo "D1 rc=$?" >> $L/cmpD1.log
 timeout 180 python benchmarks/loop_bench.py $CMP $D --wb-config-set loongforge.compute_domain.triton_fusion=false \
     --timeout 175 --variants wb_config --out $OUT/cmpD2 > $L/cmpD2.log 2>&1; echo "D2 rc=$?" >> $L/cmpD2.log
 timeout 180 python benchmarks/loop_bench.py $CMP $D --wb-config-set loongforge.compute_domain.triton_fusion=false \
     --wb-config-set loongforge.compute_domain.ops.loss=triton \
     --timeout 175 --variants wb_config --out $OUT/cmpD3 > $L/cmpD3.log 2>&1; echo "D3 rc=$?" >> $L/cmpD3.log) &
wait
tail -14 $L/cmpC.log
for f in D1 D2 D3; do grep -E "^\[|rc=" $L/cmp$f.log; tail -2 $L/cmp$f.log | head -1; done
tar czf $OUT/runN.tgz $OUT/cmpC $OUT/cmpD1 $OUT/cmpD2 $OUT/cmpD3 $L 2>/dev/null
