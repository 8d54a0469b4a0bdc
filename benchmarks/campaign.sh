#!/bin/bash
# The one-GPU campaign for gr00t-n1.6, in phases that each fit a 10-minute command and resume where a previous
# call stopped (the studies' storage lives under $RUNS; carry it between calls).
#
#   bash benchmarks/campaign.sh search   RUNS OUT   # the full-depth study: seeds, search, validate, export
#   bash benchmarks/campaign.sh compare  RUNS OUT   # side by side in one call: exported config, the compiled
#                                                   # reference loop and the FP8 recipe (micro-batch 8, 16, 24)
#   bash benchmarks/campaign.sh converge RUNS OUT   # FP8 vs bf16 over 500 steps on the same data
#   bash benchmarks/campaign.sh quick    RUNS OUT   # a quick look: the 4-block proxy study (not the full model)
#   bash benchmarks/campaign.sh grid     RUNS OUT   # the 18-configuration grid of the proxy (resumable)
#   bash benchmarks/campaign.sh replay   RUNS OUT   # CPU: the samplers replayed against the measured grid
#   bash benchmarks/campaign.sh vla-search  RUNS OUT  # the gr00t-n1.6-vla study (resumable, as search is)
#   bash benchmarks/campaign.sh vla-compare RUNS OUT  # side by side: its exported config, the base eager and
#                                                     # the base under torch.compile, launch overhead profiled
#   bash benchmarks/campaign.sh vla-fit     RUNS OUT  # the largest micro-batch that fits, default and
#                                                     # suggested allocator settings
#   bash benchmarks/campaign.sh hf-search   RUNS OUT  # the hf-llama study (resumable, as search is)
#   bash benchmarks/campaign.sh hf-compare  RUNS OUT  # side by side: the HF Trainer run of studies/hf-llama.yaml
#                                                     # untuned, with run.prepare's levers, and the workbench's
#                                                     # own exported gr00t-n1.6 config
#
# Issue 38's checks on one H200, a call each (a study named apart, from sampler seed 1, then its export beside the
# best config known, the FP8 recipe and the plain compiled loop; the VLA's beside the seeded study's export; the
# 2026-12-06 runs were w6h100 and vla-w11h200, both on an H200, and guard7, a 3.6-GPU-minute look at the numerics
# guard on trial 0):
#   NAME=gr00t-n1.6-w7h SEED=1 GPU_MIN=8.5 SEARCH_S=400 NO_REF=1 bash benchmarks/campaign.sh search RUNS OUT
#   NAME=gr00t-n1.6-w7h WB_ALT=benchmarks/reports/gr00t-n1.6-sa_config_h200_2026-12-05.yaml REFERENCE=wb_alt \
#     VARIANTS=wb_alt,wb_config,ref_recipe@16,ref_compiled,wb_config,wb_alt bash benchmarks/campaign.sh compare RUNS OUT
#   NAME=gr00t-n1.6-vla-w7h SEED=1 GPU_MIN=9 SEARCH_S=400 NO_REF=1 bash benchmarks/campaign.sh vla-search RUNS OUT
#   NAME=gr00t-n1.6-vla-w7h VLA_REF=benchmarks/reports/gr00t-n1.6-vla_config_h200_2026-12-01.yaml PROFILE=0 \
#     VARIANTS=wb_alt,wb_config,wb_alt,wb_config bash benchmarks/campaign.sh vla-compare RUNS OUT
# What of the best known config's 1% over w7h's export the fused Triton norm holds (w7h's export with and without
# it, three interleaved pairs):
#   W7H=benchmarks/reports/gr00t-n1.6-w7h_config_h200_2026-12-07.yaml; WB_CONFIG=$W7H WB_ALT=$W7H REFERENCE=wb_config \
#     WB_ALT_SET="loongforge.compute_domain.ops.rmsnorm=triton loongforge.compute_domain.fused_residual_norm=true" \
#     VARIANTS=wb_config,wb_alt,wb_alt,wb_config,wb_config,wb_alt bash benchmarks/campaign.sh compare RUNS OUT
#
# RUNS: the tuner's --out (studies, trials, exported config.yaml, report.html); OUT: benchmark results.
# Each phase prints a short table last; the CSVs land under OUT.
set -euo pipefail
phase=${1:?phase: search, grid, compare or replay}
RUNS=${2:-runs}
OUT=${3:-benchmarks/out/campaign}
mkdir -p "$RUNS" "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1

case "$phase" in
search)
    # stops starting trials after 500 s (SEARCH_S); a second call resumes the same study (Optuna storage under
    # RUNS). SEED: the sampler's seed, a study of its own (gr00t-n1.6-sSEED, or NAME): the same search from another
    # start. GPU_MIN: a GPU-minute budget (8.5 fits one call with the validation); NO_REF=1: no plain-loop
    # reference after it (compare measures the references side by side)
    name=${NAME:-gr00t-n1.6${SEED:+-s$SEED}}
    python -m workbench.tune --study gr00t-n1.6 --study-name "$name" --out "$RUNS" --timeout "${SEARCH_S:-500}" \
        --no-progress ${SEED:+--seed "$SEED"} ${STORAGE:+--storage "$STORAGE"} ${GPU_MIN:+--gpu-minutes "$GPU_MIN"} \
        ${NO_REF:+--no-reference}
    cp "$RUNS/$name/config.yaml" "$OUT/exported-config.yaml"
    cp "$RUNS/$name/report.html" "$OUT/report-$name.html"   # for benchmarks/reports/
    mkdir -p "$OUT/$name" && cp "$RUNS/$name/tune.json" "$RUNS/$name/study.db" "$OUT/$name/"  # study_results.py's
    cp "$RUNS/$name/validation.json" "$RUNS/$name/environment.json" "$OUT/$name/"  # versions: environment.json
    ;;
compare)
    # each variant in its own process, interleaved: the exported config, the compiled reference loop and
    # torchtitan's one-GPU FP8 recipe (reference_loop.py --recipe) twice each at the recipe's usual micro-batch of 16
    # (their ratios per pair give the intervals), the recipe at 8 and 24 once (the ratio tables divide by each
    # reference family's fastest member); every ref_* accumulates to the study's global batch of 32 sequences
    # (24 + 8 at micro-batch 24), so optimizer steps per token match. VARIANTS and WB_ALT (a second config, with
    # WB_ALT_SET's overrides, KEY=VALUE separated by spaces; REFERENCE=wb_alt divides by it) change what runs;
    # NAME: the study whose export runs (search's NAME), or WB_CONFIG: a config file in its place. Compiles read
    # that study's compile cache, as its trials did.
    name=${NAME:-gr00t-n1.6}
    alt_set=()
    for kv in ${WB_ALT_SET:-}; do alt_set+=(--wb-alt-set "$kv"); done
    export TORCHINDUCTOR_CACHE_DIR="$RUNS/$name/compile-cache/inductor" \
        TRITON_CACHE_DIR="$RUNS/$name/compile-cache/triton"
    python benchmarks/loop_bench.py --preset gr00t-n1.6 --micro-batch 8 --seq-len 2048 --global-batch 32 \
        --steps "${STEPS:-6}" --warmup 3 --log-every 3 --timeout 200 --wb-config "${WB_CONFIG:-$RUNS/$name/config.yaml}" \
        ${WB_ALT:+--wb-alt "$WB_ALT"} ${alt_set[@]+"${alt_set[@]}"} ${REFERENCE:+--reference "$REFERENCE"} \
        --variants "${VARIANTS:-ref_recipe@16,wb_config,ref_compiled,ref_recipe@8,ref_recipe@24,wb_config,ref_recipe@16,ref_compiled}" \
        --out "$OUT/compare"
    ;;
converge)
    python benchmarks/convergence.py --preset gr00t-n1.6 --steps 500 --micro-batch 4 --seq-len 2048 \
        --variants bf16,fp8_tensorwise --out "$OUT/convergence"
    ;;
quick)
    python -m workbench.tune --study gr00t-n1.6-proxy --out "$RUNS" --timeout 420 --no-progress
    ;;
grid)
    python -m workbench.tune --study gr00t-n1.6-grid --out "$RUNS" --timeout 520 --no-progress --no-report
    ;;
replay)
    python benchmarks/sampler_efficiency.py --grid "$RUNS/gr00t-n1.6-grid" --spec gr00t-n1.6-proxy --seeds 200 \
        --out "$OUT/sampler_efficiency"
    ;;
vla-search)
    # TRIALS: a smaller budget than the spec's, to end the study in this call; NAME, SEED, GPU_MIN, NO_REF: as
    # search's (GPU_MIN=9 with SEARCH_S=400 fits one call)
    name=${NAME:-gr00t-n1.6-vla}
    python -m workbench.tune --study gr00t-n1.6-vla --study-name "$name" --out "$RUNS" --timeout "${SEARCH_S:-380}" \
        --no-progress ${TRIALS:+--trials "$TRIALS"} ${SEED:+--seed "$SEED"} ${GPU_MIN:+--gpu-minutes "$GPU_MIN"} \
        ${NO_REF:+--no-reference}
    cp "$RUNS/$name/config.yaml" "$OUT/exported-config-vla.yaml"
    cp "$RUNS/$name/report.html" "$OUT/report-$name.html"
    mkdir -p "$OUT/$name" && cp "$RUNS/$name/tune.json" "$RUNS/$name/study.db" "$RUNS/$name/validation.json" \
        "$RUNS/$name/environment.json" "$OUT/$name/"
    ;;
vla-compare)
    # a process each, interleaved: the exported config and the base under torch.compile twice each (their ratio
    # per pair gives the interval), the base eager once; the same data, global batch and warm-up for all, each
    # traced afterwards in a run of its own for the launch overhead (workbench.train.profiling.launch_overhead;
    # PROFILE=0: no traces). Compiles read the study's compile cache, as its trials did. VLA_REF: a config to run
    # as wb_alt in place of the compiled base (issue 38's reference: VLA_REF=benchmarks/reports/
    # gr00t-n1.6-vla_config_h200_2026-12-01.yaml, the export of the seeded study).
    # NAME: the study whose export runs (vla-search's NAME)
    name=${NAME:-gr00t-n1.6-vla}
    base="$RUNS/$name/baseline/0/config.yaml"
    alt_set=(--wb-alt-set loongforge.compute_domain.compile=default)
    [ -n "${VLA_REF:-}" ] && alt_set=()
    export TORCHINDUCTOR_CACHE_DIR="$RUNS/$name/compile-cache/inductor" \
        TRITON_CACHE_DIR="$RUNS/$name/compile-cache/triton"
    python benchmarks/loop_bench.py --preset gr00t-n1.6-vla --micro-batch 16 --seq-len 512 --steps 10 --warmup 4 \
        --log-every 5 --timeout 280 --launch-profile "${PROFILE:-2}" --wb-config "$RUNS/$name/config.yaml" \
        --wb-base "$base" --wb-alt "${VLA_REF:-$base}" ${alt_set[@]+"${alt_set[@]}"} \
        --reference wb_alt --variants "${VARIANTS:-wb_alt,wb_config,wb_base,wb_alt,wb_config}" --out "$OUT/compare-vla"
    ;;
vla-fit)
    python -m workbench.memory fit --config "$RUNS/gr00t-n1.6-vla/baseline/0/config.yaml" --suggest \
        --multiple 8 --steps 2 --timeout 240 --out "$OUT/fit-vla"
    ;;
hf-search)
    # STORAGE: one Optuna storage for this and the search phase, so the HF study starts from the built-in loop's
    # winner on the same model and GPU (the tuner's warm start: the values of the knobs both studies search).
    # benchmarks/storage/gr00t-n1.6_h200_2026-12-04.db holds the H200 study of 2026-12-04 (study.csv run ahead1):
    # copy it under RUNS, write to the copy (cp ... runs/shared.db; STORAGE=sqlite:///runs/shared.db)
    python -m workbench.tune --study studies/hf-llama.yaml --out "$RUNS" --timeout "${SEARCH_S:-420}" --no-progress \
        ${STORAGE:+--storage "$STORAGE"}
    cp "$RUNS/hf-llama/config.yaml" "$OUT/exported-config-hf.yaml"
    ;;
hf-compare)
    # a process each, interleaved: the hf-llama study's untuned base (bf16, SDPA, per-layer compile, fused AdamW,
    # micro-batch 8) twice, run.prepare's levers (the vocabulary padded, Liger's fused loss, FP8 on the decoder's
    # Linears cast by torchao or by the project's Triton kernels (fp8t), the project's Triton RMSNorm and SwiGLU
    # (ops), the project's loss op in place of HF's head and loss, no Liger: its fused Triton linear cross-entropy
    # (loss) or the head's matmuls in FP8 (head), the residual add inside the norm (fused), no host waits inside
    # a step (nosync), bigger micro-batches)
    # and the workbench's exported gr00t-n1.6
    # config (WB_CONFIG), 32 sequences of 2,048 tokens an optimizer step for all. HF_CONFIG: an hf-llama study's
    # export (hf-search), run as the hf_config variant (VARIANTS=hf_base,hf_config,wb_config,hf_base,hf_config for
    # the study's goal).
    python - "$OUT/hf-base.yaml" <<'PY'
import sys
from workbench.config import dump_config
from workbench.tune.study import load_study_spec
dump_config(load_study_spec("studies/hf-llama.yaml").trial_config({}), sys.argv[1], comments=False)
PY
    lever="hf.liger=true;loongforge.compute_domain.fp8=tensorwise"
    # the project's FP8 casts and Triton RMSNorm/SwiGLU (with Liger only compiled: it then patches only its loss)
    ours="loongforge.compute_domain.fp8_cast=triton;loongforge.compute_domain.ops.rmsnorm=triton"
    ours="$ours;loongforge.compute_domain.ops.swiglu=triton"
    # the project's loss op in place of HF's head and loss (never with Liger: two losses for one head)
    fp8t_ops="loongforge.compute_domain.fp8=tensorwise;$ours;hf.pad_vocab_multiple=64"
    loss="loongforge.compute_domain.ops.loss=triton"
    head="loongforge.compute_domain.fp8_head=true"
    fused="loongforge.compute_domain.fused_residual_norm=true"  # the post-attention add inside the Triton norm
    # no wait for the device inside a step: transformers' packed-sequence check, the Trainer's NaN/Inf check and
    # its blocking batch copies (examples/hf_trainer.py's user knobs)
    nosync="hf.packed_check=false;user.nan_inf_filter=false;user.non_blocking=true"
    python benchmarks/loop_bench.py --seq-len 2048 --global-batch 32 --steps "${STEPS:-6}" --warmup 3 \
        --log-every 3 --timeout 200 --hf-base "$OUT/hf-base.yaml" ${HF_CONFIG:+--hf-config "$HF_CONFIG"} \
        --wb-config "${WB_CONFIG:-benchmarks/reports/gr00t-n1.6_config_h200_2026-12-03.yaml}" \
        --hf-variant "fp8_8:loongforge.compute_domain.fp8=tensorwise" \
        --hf-variant "liger16:hf.liger=true;data.micro_batch_size=16" \
        --hf-variant "ligerfp8_16:$lever;data.micro_batch_size=16" \
        --hf-variant "ligerfp8_32:$lever;data.micro_batch_size=32" \
        --hf-variant "pad:hf.pad_vocab_multiple=64" \
        --hf-variant "pad_ligerfp8_16:$lever;hf.pad_vocab_multiple=64;data.micro_batch_size=16" \
        --hf-variant "pad_ligerfp8_32:$lever;hf.pad_vocab_multiple=64;data.micro_batch_size=32" \
        --hf-variant "pad_ligerfp8t_ops_16:$lever;$ours;hf.pad_vocab_multiple=64;data.micro_batch_size=16" \
        --hf-variant "pad_ligerfp8t_ops_32:$lever;$ours;hf.pad_vocab_multiple=64;data.micro_batch_size=32" \
        --hf-variant "pad_fp8t_ops_16:loongforge.compute_domain.fp8=tensorwise;$ours;hf.pad_vocab_multiple=64;data.micro_batch_size=16" \
        --hf-variant "pad_fp8t_ops_loss_16:$fp8t_ops;$loss;data.micro_batch_size=16" \
        --hf-variant "pad_fp8t_ops_head_16:$fp8t_ops;$head;data.micro_batch_size=16" \
        --hf-variant "pad_fp8t_ops_head_32:$fp8t_ops;$head;data.micro_batch_size=32" \
        --hf-variant "pad_fp8t_ops_loss_fused_16:$fp8t_ops;$loss;$fused;data.micro_batch_size=16" \
        --hf-variant "pad_fp8t_ops_loss_fused_nosync_16:$fp8t_ops;$loss;$fused;$nosync;data.micro_batch_size=16" \
        --hf-variant "ligerfp8_16_model:$lever;data.micro_batch_size=16;loongforge.compute_domain.compile_scope=model" \
        --hf-variant "pad_ligerfp8_16_model:$lever;hf.pad_vocab_multiple=64;data.micro_batch_size=16;loongforge.compute_domain.compile_scope=model" \
        --reference hf_base \
        --variants "${VARIANTS:-hf_base,hf_pad_ligerfp8_16,hf_pad_ligerfp8t_ops_16,wb_config,hf_pad,hf_pad_ligerfp8_32,hf_base}" \
        --out "$OUT/compare-hf"
    ;;
*)
    echo "campaign.sh: unknown phase '$phase' (search, compare, converge, quick, grid, replay, vla-search," \
         "vla-compare, vla-fit, hf-search, hf-compare)" >&2
    exit 2
    ;;
esac
