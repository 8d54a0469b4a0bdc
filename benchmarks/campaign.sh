#!/bin/bash
# The one-GPU campaign for gr00t-n1.6 (issue 8), in phases that each fit a 10-minute command and resume where a
# previous call stopped (the studies' storage lives under $RUNS; carry it between calls).
#
#   bash benchmarks/campaign.sh search   RUNS OUT   # the proxy study (4 blocks): search, validate, export
#   bash benchmarks/campaign.sh grid     RUNS OUT   # the 18-configuration grid of the proxy (resumable)
#   bash benchmarks/campaign.sh compare  RUNS OUT   # full depth: exported vs base config vs reference (PASS=2: again)
#   bash benchmarks/campaign.sh replay   RUNS OUT   # CPU: the samplers replayed against the measured grid
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
    # stops starting trials after 420 s; a second call resumes the same study (Optuna storage under RUNS)
    python -m workbench.tune --study gr00t-n1.6-proxy --out "$RUNS" --timeout 420 --no-progress
    cp "$RUNS/gr00t-n1.6-proxy/config.yaml" "$OUT/exported-proxy-config.yaml"
    cp "$RUNS/gr00t-n1.6-proxy/report.html" "$OUT/report-gr00t-n1.6-proxy.html"   # for benchmarks/reports/
    ;;
grid)
    python -m workbench.tune --study gr00t-n1.6-grid --out "$RUNS" --timeout 520 --no-progress --no-report
    ;;
compare)
    # the exported winner and the study's untuned base config at full depth (the proxy's model file swapped for
    # the gr00t-n1.6 preset), against the plain reference loop eager and compiled: one pass of the four (about
    # 7 minutes on an H200); PASS=2 runs them in a rotated order into compare2 (a second call, or a second GPU)
    if [ "${PASS:-1}" = 2 ]; then
        variants=wb_config,ref_compiled,wb_base,ref_eager; dest=compare2
    else
        variants=ref_eager,wb_base,wb_config,ref_compiled; dest=compare
    fi
    python benchmarks/loop_bench.py --preset gr00t-n1.6 --micro-batch 8 --seq-len 2048 --steps 16 --warmup 6 \
        --log-every 4 --timeout 330 --wb-config "$RUNS/gr00t-n1.6-proxy/config.yaml" \
        --wb-base "$RUNS/gr00t-n1.6-proxy/baseline/0/config.yaml" \
        --wb-config-set model.name=gr00t-n1.6 --wb-config-set model.config_path=null \
        --variants $variants --out "$OUT/$dest"
    ;;
replay)
    python benchmarks/sampler_efficiency.py --grid "$RUNS/gr00t-n1.6-grid" --spec gr00t-n1.6-proxy --seeds 200 \
        --out "$OUT/sampler_efficiency"
    ;;
*)
    echo "campaign.sh: unknown phase '$phase' (search, grid, compare, replay)" >&2
    exit 2
    ;;
esac
