"""Side-by-side benchmark of the training loop against a plain PyTorch loop.

    python benchmarks/loop_bench.py --preset gr00t-n1.6 --micro-batch 8 --seq-len 2048 \
        --variants ref_eager,wb_eager,wb_eager_notiming,ref_compiled,wb_compiled,wb_compiled_graphs \
        --steps 40 --warmup 10 --out DIR

Each variant runs in its own process (fresh allocator, fresh compile caches),
one after the other in the order given, so an interleaved order (A, B, A, B)
gives repeats. Results: ``DIR/loop_bench.csv`` in long format (one row per
variant, repeat and metric, with GPU name, versions, timestamp and the config),
the per-variant summaries as JSON, and a table printed last.

Variants:
  ref_eager / ref_compiled         benchmarks/reference_loop.py (nanoGPT style), eager / torch.compile, at
                                   --micro-batch; ``ref_compiled@16`` at micro-batch 16 (both accumulate to
                                   --global-batch when it is given)
  ref_recipe                       the same loop trained as torchtitan's float8 docs say for one GPU
                                   (reference_loop.py --recipe: torchao float8 tensorwise on every decoder Linear,
                                   each block compiled apart); ``ref_recipe@24`` at micro-batch 24
  wb_eager                         python -m workbench.train, eager
  wb_eager_notiming                the same with metrics.phase_timing=false (instrumentation overhead)
  wb_compiled                      compile=default
  wb_compiled_graphs               compile=default + graph_capture (CUDA graphs per bucket shape)
  wb_graphs                        eager + graph_capture
  wb_eager_triton                  eager + triton_fusion (every op on the Triton kernels)
  wb_compiled_triton               compile=default + triton_fusion
  wb_default                       the preset's default config as it is (its own micro-batch, buckets, compile)
  wb_base                          --wb-base PATH as it is, plus --wb-config-set: a study's untuned base config
                                   (runs/<study>/baseline/0/config.yaml, what the tuner measures its gains against)
  wb_config                        --wb-config PATH (an exported config.yaml) as it is, plus --wb-config-set
  wb_alt                           --wb-alt PATH as it is, plus --wb-config-set and --wb-alt-set: a second config
                                   to compare (e.g. the winner with FP8 off, or the study's base with compile on)
                                   overrides (e.g. model.config_path=null model.name=gr00t-n1.6 to re-validate a
                                   proxy study's winner at full depth)
  hf_base                          a Hugging Face Trainer run (examples/hf_trainer.py: transformers'
                                   LlamaForCausalLM, run.prepare() on it) of --hf-base PATH as it is (the
                                   hf-llama study's untuned base config)
  hf_config                        the same run of --hf-config PATH (an hf-llama study's exported config)
  hf_NAME                          --hf-base plus the overrides ``--hf-variant NAME:KEY=VALUE;KEY=VALUE`` gives

The ``wb_default``, ``wb_base``, ``wb_config`` and ``wb_alt`` variants keep their config's data settings (micro-batch,
bucket width, packing): they compare production configurations, with the same synthetic corpus
and the same measurement (``--steps`` after ``--warmup``). The other variants pin micro-batch
and full records to match the reference loop exactly. A variant that runs over ``--timeout`` is
killed and recorded as failed (returncode 124); the others still run.

The ratios printed last divide every variant by each reference of ``--reference`` (default: the compiled loop and
the recipe): a reference names a family (``ref_recipe`` covers ``ref_recipe@8``, ``ref_recipe@16``, ...), and the
table divides by its member with the highest median, the reference at its best micro-batch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

from _run import ROOT, child_env, commit, run_logged

sys.path.insert(0, str(ROOT))
from workbench.train.fingerprint import versions  # noqa: E402
from workbench.vocab import (COMPILE_S, MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, PADDED_TOKENS_PER_S, PADDING_RATIO,
                             REAL_TOKENS_PER_S, STEP_S)

WB_SETS = {
    "wb_eager": [],
    "wb_eager_notiming": ["metrics.phase_timing=false"],
    "wb_compiled": ["loongforge.compute_domain.compile=default"],
    "wb_compiled_graphs": ["loongforge.compute_domain.compile=default", "loongforge.compute_domain.graph_capture=true"],
    "wb_graphs": ["loongforge.compute_domain.graph_capture=true"],
    "wb_eager_triton": ["loongforge.compute_domain.triton_fusion=true"],
    "wb_compiled_triton": ["loongforge.compute_domain.compile=default", "loongforge.compute_domain.triton_fusion=true",
                           "loongforge.compute_domain.compile_shapes=static"],
}
LAUNCH_KEYS = ("launch_calls_per_step", "launch_call_ms_per_step", "device_busy_ms_per_step",
               "device_idle_ms_per_step")
"""The ``profile/*`` keys of ``launch_overhead`` a ``--launch-profile`` run adds to its variant's row."""
REF_KINDS = ("ref_eager", "ref_compiled", "ref_recipe")  # reference_loop.py: eager, --compile, --recipe
AS_IS = ("wb_default", "wb_base", "wb_config", "wb_alt")  # configurations run with their own data settings
HF_AS_IS = ("hf_base", "hf_config")  # examples/hf_trainer.py on a config file as it is
METRICS = [REAL_TOKENS_PER_S, PADDED_TOKENS_PER_S, "mfu_pct",
           STEP_S, MAX_RESERVED_GIB, MAX_ALLOCATED_GIB, "last_loss", COMPILE_S,
           PADDING_RATIO, "throughput/samples_per_s_per_gpu", *(f"profile/{k}" for k in LAUNCH_KEYS)]


def hf_command(name: str, a: argparse.Namespace, d: Path, env: dict[str, str]) -> list[str]:
    """The HF Trainer example's command for variant ``name``; its config (the file, its overrides and the bench's
    steps) is written to ``d/config.yaml`` and handed over as the tuner hands a trial's."""
    from workbench.config import dump_config, load_config, merge_overrides, parse_overrides

    path = a.hf_config if name == "hf_config" else a.hf_base
    if not path:
        raise SystemExit(f"loop_bench: variant {name} needs --{'hf-config' if name == 'hf_config' else 'hf-base'} PATH")
    sets = [f"training.max_steps={a.steps + a.warmup}", f"training.warmup_measure_steps={a.warmup}",
            f"training.log_every={a.log_every}"]
    if name not in HF_AS_IS:
        sets += [s_ for s_ in a.hf_variant_sets[name].split(";") if s_]
    cfg = merge_overrides(load_config(path), parse_overrides(sets))
    dump_config(cfg, d / "config.yaml", comments=False)
    env.update(WORKBENCH_CONFIG=str((d / "config.yaml").resolve()), WORKBENCH_OUT=str(d.resolve()),
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
    return [sys.executable, str(ROOT / "examples" / "hf_trainer.py")]


def run_variant(name: str, a: argparse.Namespace, out: Path, rep: int) -> dict:
    d = out / f"{name}-{rep}"
    d.mkdir(parents=True, exist_ok=True)
    env = child_env()
    if name.startswith("hf_"):
        cmd = hf_command(name, a, d, env)
    elif name.startswith("ref_"):
        kind, _, mb = name.partition("@")
        cmd = [sys.executable, str(ROOT / "benchmarks" / "reference_loop.py"), "--preset", a.preset,
               "--micro-batch", mb or str(a.micro_batch), "--seq-len", str(a.seq_len), "--steps", str(a.steps),
               "--warmup", str(a.warmup), "--json", str(d / "summary.json")]
        if a.global_batch:
            cmd += ["--global-batch", str(a.global_batch)]
        if kind == "ref_compiled":
            cmd.append("--compile")
        elif kind == "ref_recipe":
            cmd.append("--recipe")
    elif name in AS_IS:
        sets = [f"training.max_steps={a.steps + a.warmup}", f"training.warmup_measure_steps={a.warmup}",
                f"training.log_every={a.log_every}"]
        if name in ("wb_config", "wb_base", "wb_alt"):
            path = {"wb_config": a.wb_config, "wb_base": a.wb_base, "wb_alt": a.wb_alt}[name]
            if not path:
                raise SystemExit(f"loop_bench: variant {name} needs --{name.replace('_', '-')} PATH")
            src = ["--config", str(Path(path).resolve())]
            sets += list(a.wb_config_set) + (list(a.wb_alt_set) if name == "wb_alt" else [])
        else:
            src = ["--preset", a.preset]
        cmd = [sys.executable, "-m", "workbench.train", *src, "--synthetic", "-q",
               "--summary", str(d / "summary.json"), "--out", str(d)]
        for s_ in sets:
            cmd += ["--set", s_]
    else:
        sets = [f"data.micro_batch_size={a.micro_batch}", f"data.seq_len={a.seq_len}",
                f"data.bucket_width={a.seq_len}", f"data.min_len={a.seq_len}",
                f"training.max_steps={a.steps + a.warmup}", f"training.warmup_measure_steps={a.warmup}",
                f"training.log_every={a.log_every}", *WB_SETS[name], *a.wb_set]
        cmd = [sys.executable, "-m", "workbench.train", "--preset", a.preset, "--synthetic", "-q",
               "--synthetic-packing", "fill",  # full records, like the reference's token-stream windows
               "--summary", str(d / "summary.json"), "--out", str(d)]
        for s in sets:
            cmd += ["--set", s]
    t0 = time.time()
    returncode = run_logged(cmd, d / "log.txt", env=env, timeout=a.timeout, who="loop_bench")
    res = {"variant": name, "repeat": rep, "returncode": returncode, "wall_s": time.time() - t0}
    if returncode == 0 and (d / "summary.json").exists():
        res.update({k: v for k, v in json.loads((d / "summary.json").read_text()).items() if k != "variant"})
    else:
        res["log_tail"] = (d / "log.txt").read_text()[-3000:]
    if returncode == 0 and a.launch_profile and not name.startswith(("ref_", "hf_")):
        # a run of its own (no measured window carries the profiler): the warm-up, then launch_profile steps traced
        p = d / "profile"
        prof = [*cmd[:cmd.index("--summary")], "--summary", str(p / "summary.json"), "--out", str(p),
                *[x for s_ in _sets(cmd) if not s_.startswith(("training.max_steps=", "training.log_every="))
                  for x in ("--set", s_)],
                "--set", f"training.max_steps={a.warmup + a.launch_profile}",
                "--set", f"training.log_every={a.launch_profile}", "--profile", str(a.launch_profile)]
        if run_logged(prof, d / "profile.log", env=env, timeout=a.timeout, who="loop_bench") == 0:
            ps = json.loads((p / "summary.json").read_text())  # the profiler's launch_overhead of the trace
            res.update({f"profile/{k}": ps[f"profile/{k}"] for k in LAUNCH_KEYS if f"profile/{k}" in ps})
            (p / "trace.json").unlink(missing_ok=True)  # tens of MB per variant; the summary keeps its figures
    return res


def _sets(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, x in enumerate(cmd) if x == "--set"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="gr00t-n1.6")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=40, help="measured steps")
    p.add_argument("--warmup", type=int, default=10, help="steps before measuring")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--variants", default="ref_eager,wb_eager")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--out", default="benchmarks/out")
    p.add_argument("--wb-config", help="config.yaml for the wb_config variant (an exported winner)")
    p.add_argument("--wb-config-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for the wb_config, wb_base and wb_alt variants (repeatable)")
    p.add_argument("--wb-base", help="config.yaml for the wb_base variant (a study's base config)")
    p.add_argument("--wb-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for every pinned wb_* variant (repeatable), e.g. compile_shapes=static")
    p.add_argument("--wb-alt", help="config.yaml for the wb_alt variant (a second config to compare)")
    p.add_argument("--wb-alt-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for the wb_alt variant only, after --wb-config-set (repeatable)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step of the ref_* variants")
    p.add_argument("--reference", default="ref_compiled,ref_recipe",
                   help="comma-separated references the ratio tables divide by; a family name (ref_recipe) takes "
                        "its member with the highest median (ref_recipe@16)")
    p.add_argument("--launch-profile", type=int, default=0, metavar="N",
                   help="after each workbench variant, a run of its own tracing N steps after the warm-up: "
                        "the launch calls, their host time and the device idle time per step (workbench.train.profiling)")
    p.add_argument("--hf-base", help="config.yaml of the hf_base variant and the base of every hf_NAME one")
    p.add_argument("--hf-config", help="config.yaml of the hf_config variant (an hf-llama study's export)")
    p.add_argument("--hf-variant", action="append", default=[], metavar="NAME:KEY=VALUE;KEY=VALUE",
                   help="the hf_NAME variant: --hf-base with these overrides (repeatable)")
    a = p.parse_args(argv)
    a.hf_variant_sets = {}
    for v in a.hf_variant:
        label, sep, sets = v.partition(":")
        if not sep or not label:
            p.error(f"--hf-variant {v!r}: expected NAME:KEY=VALUE;KEY=VALUE")
        a.hf_variant_sets[f"hf_{label}"] = sets
    unknown = [v for v in a.variants.split(",") if v not in WB_SETS and v not in AS_IS and v not in HF_AS_IS
               and v not in a.hf_variant_sets and v.partition("@")[0] not in REF_KINDS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: "
                f"{', '.join([*REF_KINDS, *WB_SETS, *AS_IS, *HF_AS_IS, *a.hf_variant_sets])}")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ver = versions(("gpu", "torch", "triton", "cuda", "python"))
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    seen: dict[str, int] = {}
    results = []
    config = f"preset={a.preset} micro_batch={a.micro_batch} seq_len={a.seq_len} steps={a.steps} warmup={a.warmup}"
    if a.global_batch:
        config += f" global_batch={a.global_batch}"
    if a.wb_set:
        config += " wb_set=" + ";".join(a.wb_set)
    if a.wb_config_set:  # the overrides of wb_config / wb_base: part of what was measured
        config += " wb_config_set=" + ";".join(a.wb_config_set)
    if a.hf_base or a.hf_config:  # the HF runs' own configs: the preset and micro-batch above are not theirs
        config += f" hf_base={a.hf_base} hf_config={a.hf_config} " + " ".join(a.hf_variant)
    common = {"gpu": ver["gpu"], "torch": ver["torch"], "triton": ver["triton"], "cuda": ver["cuda"],
              "commit": commit(), "timestamp": stamp, "config": config}
    import pandas as pd

    df = pd.DataFrame()
    for name in a.variants.split(","):
        rep = seen[name] = seen.get(name, -1) + 1
        res = run_variant(name, a, out, rep)
        results.append(res)
        status = "ok" if res["returncode"] == 0 else f"FAILED rc={res['returncode']}"
        print(f"[{name}#{rep}] {status} in {res['wall_s']:.0f} s: "
              f"{res.get(REAL_TOKENS_PER_S) or 0:,.0f} tok/s", flush=True)
        if res["returncode"]:
            print(res.get("log_tail", "")[-1500:], flush=True)
        # written after every variant: a run cut short keeps what it measured
        (out / "loop_bench.json").write_text(json.dumps(results, indent=1, default=str))
        rows = []
        for r in results:
            values = [(m, r[m]) for m in METRICS if r.get(m) is not None]
            values += [(f"time/{ph}_s", v) for ph, v in (r.get("phase_s_per_step") or {}).items() if v is not None]
            rows += [{"benchmark": "loop", "variant": r["variant"], "repeat": r["repeat"], "metric": m, "value": v,
                      **common} for m, v in values]
        df = pd.DataFrame(rows)
        df.to_csv(out / "loop_bench.csv", index=False)
    if df.empty:
        print("no results")
        return
    wide = df.pivot_table(index="variant", columns="metric", values="value", aggfunc="median")
    cols = [c for c in [REAL_TOKENS_PER_S, "throughput/samples_per_s_per_gpu",
                        "profile/device_idle_ms_per_step", "profile/launch_calls_per_step",
                        PADDED_TOKENS_PER_S, "mfu_pct",
                        STEP_S, MAX_RESERVED_GIB, "time/data_wait_s", "time/forward_s",
                        "time/backward_s", "time/optimizer_s", "last_loss"] if c in wide.columns]
    print(f"\n{ver}\n{config}")
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.float_format", "{:,.4g}".format):
        print(wide[cols].rename(columns=lambda c: c.split("/")[-1]))
    for reference in a.reference.split(","):
        print(ratio_table(df, reference))


def best_of_family(tok, reference: str) -> str | None:
    """The variant ``reference`` names: itself where it is one of a run's variants (``ref_recipe@16``), else the
    member of its family (``ref_recipe``, ``ref_recipe@8``, ...) with the highest median real tokens/s."""
    names = list(dict.fromkeys(tok["variant"]))
    if reference in names and "@" in reference:
        return reference
    family = [n for n in names if n == reference or n.startswith(reference + "@")]
    if not family:
        return None
    return max(family, key=lambda n: tok[tok["variant"] == n]["value"].median())


def ratio_table(df, reference: str) -> str:
    """Each variant's real tokens/s over the reference's (``best_of_family``), repeat by repeat (repeat i of a
    variant against repeat i of the reference, else the reference's median), with the median and, from two pairs
    on, the 95% t-interval of the ratio (workbench.tune.stats.speedup_interval)."""
    from workbench.tune.stats import speedup_interval

    tok = df[df["metric"] == REAL_TOKENS_PER_S]
    chosen = best_of_family(tok, reference)
    if chosen is None:
        return f"no {reference} run to divide by"
    ref = tok[tok["variant"] == chosen].sort_values("repeat")["value"].tolist()
    best = " (its best micro-batch of this run)" if chosen != reference else ""
    lines = [f"real tokens/s over {chosen}{best} (median {statistics.median(ref):,.0f}):"]
    for name, g in tok.groupby("variant", sort=False):
        vals = g.sort_values("repeat")["value"].tolist()
        ratios = [v / (ref[i] if i < len(ref) else statistics.median(ref)) for i, v in enumerate(vals)]
        iv = speedup_interval(ratios)
        ci = f"[{iv.low:.3f}, {iv.high:.3f}]" if len(ratios) > 1 else "(one pair)"
        lines.append(f"  {name:22s} {iv.median:.3f}x {ci} over {len(ratios)} run(s)")
    return "\n".join(lines)



if __name__ == "__main__":
    main()
