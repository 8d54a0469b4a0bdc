#!/bin/bash
# GPU run M (nvidia-h200-x2), after the Triton launchers became torch.library custom ops:
#   GPU 0: issue 8's full-depth side by side, pass A (ref_eager, wb_base, wb_config as exported, ref_compiled)
#   GPU 1: issue 6's end-to-end step (torch / triton ops, eager / compiled, one process per variant), then the
#          exported config with compile_shapes: dynamic (one graph for the four bucket lengths) and the
#          compiled reference, at full depth
set -u
L=$OUT/logs; mkdir -p $L
R=runs/campaign
export NCCL_NVLS_ENABLE=0
ls $R/gr00t-n1.6-proxy/config.yaml || exit 3
CMP="--preset gr00t-n1.6 --micro-batch 8 --seq-len 2048 --steps 16 --warmup 6 --log-every 4
     --wb-config $R/gr00t-n1.6-proxy/config.yaml --wb-base $R/gr00t-n1.6-proxy/baseline/0/config.yaml
     --wb-config-set model.name=gr00t-n1.6 --wb-config-set model.config_path=null"
(export CUDA_VISIBLE_DEVICES=0
 timeout 570 python benchmarks/loop_bench.py $CMP --timeout ${VAR_S:-330} \
     --variants ${VARS_A:-ref_eager,wb_base,wb_config,ref_compiled} --out $OUT/cmpA > $L/cmpA.log 2>&1
 echo "cmpA rc=$?" >> $L/cmpA.log) &
(export CUDA_VISIBLE_DEVICES=1
 timeout ${E2E_S:-260} python -m kernels.bench --kernels none --e2e \
     --launch benchmarks/results/kernels_best_launch_h200_2026-11-29.json --out $OUT/ke > $L/e2e.log 2>&1
 echo "e2e rc=$?" >> $L/e2e.log
 timeout $((565 - ${E2E_S:-260})) python benchmarks/loop_bench.py $CMP --timeout 240 \
     --wb-config-set loongforge.compute_domain.compile_shapes=dynamic \
     --variants ${VARS_B:-wb_config,ref_compiled} --out $OUT/cmpB > $L/cmpB.log 2>&1
 echo "cmpB rc=$?" >> $L/cmpB.log) &
wait
grep -E "own process|PASS|FAIL|rc=" $L/e2e.log | tail -12
tail -14 $L/cmpA.log; tail -10 $L/cmpB.log
tar czf $OUT/runM.tgz $OUT/cmpA $OUT/cmpB $OUT/ke $L 2>/dev/null
ls -la $OUT
