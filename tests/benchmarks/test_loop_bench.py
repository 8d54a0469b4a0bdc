"""benchmarks/loop_bench.py's production-config variants on the CPU: wb_default runs the preset as it is,
wb_config and wb_base run a config.yaml with --wb-config-set overrides, all measured as the other variants are;
a variant over --timeout is recorded as failed and the others still run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from workbench.config import dump_config, merge_overrides, preset_config
from workbench.vocab import PADDED_TOKENS_PER_S as PADDED
from workbench.vocab import REAL_TOKENS_PER_S as REAL

REPO = Path(__file__).resolve().parents[2]


def loop_bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/loop_bench.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_wb_config_wb_default_and_wb_base_variants_and_a_timeout(tmp_path):
    cfg = merge_overrides(preset_config("tiny"), {"training.global_batch_size": 8})
    dump_config(cfg, tmp_path / "config.yaml")
    base = merge_overrides(preset_config("tiny"), {"data.micro_batch_size": 3, "training.global_batch_size": 6})
    dump_config(base, tmp_path / "base.yaml")
    out = tmp_path / "lb"
    r = loop_bench("--preset", "tiny", "--steps", "3", "--warmup", "1", "--log-every", "1", "--variants",
                   "wb_default,wb_config,wb_base", "--wb-config", str(tmp_path / "config.yaml"), "--wb-config-set",
                   "data.micro_batch_size=2", "--wb-base", str(tmp_path / "base.yaml"), "--timeout", "120",
                   "--out", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    default, tuned, based = (json.loads((out / f"{v}-0" / "summary.json").read_text())
                             for v in ("wb_default", "wb_config", "wb_base"))
    assert default["grad_accum_steps"] == 1  # the preset as it is: micro-batch 4, no global batch
    assert tuned["grad_accum_steps"] == 4  # the file's global batch 8 over the override's micro-batch 2
    assert based["grad_accum_steps"] == 3  # the base file's global batch 6 over the override's micro-batch 2
    assert default["measured_steps"] == tuned["measured_steps"] == based["measured_steps"] == 3
    df = pd.read_csv(out / "loop_bench.csv")
    tps = df[df["metric"] == "throughput/real_tokens_per_s_per_gpu"].set_index("variant")["value"]
    assert set(tps.index) == {"wb_default", "wb_config", "wb_base"} and (tps > 0).all()
    # the same with a timeout no process can meet: both recorded as killed, the run itself ends normally
    r = loop_bench("--preset", "tiny", "--variants", "wb_base,ref_eager", "--wb-base", str(tmp_path / "base.yaml"),
                   "--timeout", "1", "--out", str(tmp_path / "slow"))
    assert r.returncode == 0 and "no results" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    runs = json.loads((tmp_path / "slow" / "loop_bench.json").read_text())
    assert [(x["variant"], x["returncode"]) for x in runs] == [("wb_base", 124), ("ref_eager", 124)]
    assert "killed after --timeout 1 s" in runs[0]["log_tail"]


def test_unknown_variant_is_named():
    r = loop_bench("--variants", "wb_eager,wb_turbo", timeout=120)
    assert r.returncode == 2 and "unknown variants ['wb_turbo']" in r.stderr


def test_references_accumulate_to_the_global_batch_and_the_recipe_runs_fp8_emulated(tmp_path):
    """ref_eager@N runs the plain loop at micro-batch N; with --global-batch every optimizer step accumulates
    to that many sequences (3 + 1 here, what the workbench's loop does), and tokens/s counts all of them.
    ref_recipe (torchtitan's one-GPU float8 recipe: torchao tensorwise on every decoder Linear, each block
    compiled apart) runs on the CPU with torchao emulating FP8, and the ratios are printed over each reference;
    its loss on the same windows is FP8's, near the eager one."""
    out = tmp_path / "lb"
    r = loop_bench("--preset", "tiny", "--seq-len", "64", "--micro-batch", "3", "--global-batch", "4", "--steps",
                   "2", "--warmup", "0", "--variants", "ref_eager,ref_eager@4,ref_recipe",
                   "--reference", "ref_eager,ref_recipe", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    eager, whole, recipe = (json.loads((out / f"{v}-0" / "summary.json").read_text())
                            for v in ("ref_eager", "ref_eager@4", "ref_recipe"))
    assert (eager["micro_batch"], eager["global_batch"], eager["grad_accum_steps"]) == (3, 4, 2)
    assert (whole["micro_batch"], whole["global_batch"], whole["grad_accum_steps"]) == (4, 4, 1)
    assert (recipe["micro_batch"], recipe["global_batch"], recipe["grad_accum_steps"]) == (3, 4, 2)
    for run in (eager, recipe):
        step_tokens = run["throughput/real_tokens_per_s_per_gpu"] * run["time/step_s"]
        assert abs(step_tokens - 4 * 64) < 1e-6 * step_tokens  # G x T tokens per optimizer step
    assert recipe["fp8_linears"] == 4 * 7 and eager["fp8_linears"] == 0  # q, k, v, o, gate, up, down of 4 blocks
    assert recipe["last_loss"] != eager["last_loss"]
    assert abs(recipe["last_loss"] - eager["last_loss"]) < 0.02 * eager["last_loss"]
    # each family's ratios are over its fastest member: here ref_eager@4 of the two plain loops
    assert "real tokens/s over ref_eager" in r.stdout and "over ref_recipe (median" in r.stdout
    assert "ref_eager@4 " in r.stdout.split("real tokens/s over ref_eager")[1]


def test_hf_variants_run_the_hf_trainer_example_with_their_overrides(tmp_path):
    pytest = __import__("pytest")
    pytest.importorskip("transformers")
    from workbench.tune.study import load_study_spec

    dump_config(load_study_spec(str(REPO / "examples" / "hf_trainer.yaml")).trial_config({}), tmp_path / "base.yaml")
    out = tmp_path / "lb"
    r = loop_bench("--seq-len", "64", "--steps", "2", "--warmup", "1", "--log-every", "1", "--hf-base",
                   str(tmp_path / "base.yaml"), "--hf-variant", "mb8:data.micro_batch_size=8;hf.attention=eager",
                   "--reference", "hf_base", "--variants", "hf_base,hf_mb8", "--out", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    base, mb8 = (json.loads((out / f"{v}-0" / "summary.json").read_text()) for v in ("hf_base", "hf_mb8"))
    assert base["measured_steps"] == mb8["measured_steps"] == 2
    assert base["hf/patches"] == [] and mb8["hf/patches"] == ["attention: eager"]  # run.prepare() saw the override
    assert 0 < mb8["last_loss"] < 10  # the callback reports the Trainer's loss
    df = pd.read_csv(out / "loop_bench.csv")
    assert set(df["variant"]) == {"hf_base", "hf_mb8"}
    assert "real tokens/s over hf_base" in r.stdout and "hf_mb8" in r.stdout
    r = loop_bench("--variants", "hf_nope", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "hf_nope" in r.stderr


def test_an_hf_run_of_documents_padding_free_or_padded(tmp_path):
    """examples/hf_trainer.py on documents of 8 to 64 tokens (user.doc_lengths: varied), batched by run.collator():
    fill is padding-free (every token real), bucket pads; the same documents give the same loss either way."""
    pytest = __import__("pytest")
    pytest.importorskip("transformers")
    from workbench.tune.study import load_study_spec

    dump_config(load_study_spec(str(REPO / "examples" / "hf_trainer.yaml")).trial_config({}), tmp_path / "base.yaml")
    docs = "user.doc_lengths=varied;data.min_len=8;data.micro_batch_size=4"
    r = loop_bench("--seq-len", "64", "--steps", "2", "--warmup", "1", "--log-every", "1", "--hf-base",
                   str(tmp_path / "base.yaml"), "--hf-variant", f"fill:{docs};data.packing=fill", "--hf-variant",
                   f"bucket:{docs};data.packing=bucket;data.bucket_width=16", "--variants", "hf_fill,hf_bucket",
                   "--out", str(tmp_path / "lb"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    fill, bucket = (json.loads((tmp_path / "lb" / f"{v}-0" / "summary.json").read_text())
                    for v in ("hf_fill", "hf_bucket"))
    assert fill[REAL] == pytest.approx(fill[PADDED])  # no padding row, no padding token
    assert bucket[REAL] < 0.9 * bucket[PADDED]  # rows padded to 16, 32, 48 or 64
    assert fill["last_loss"] == pytest.approx(bucket["last_loss"], rel=1e-4)
