"""Study specs: the built-ins load; bad specs are rejected naming the file and the key path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from workbench.config import ConfigError, load_config
from workbench.tune.study import builtin_studies, load_study_spec, loads_study_spec

GOOD = """
name: t
space:
  num_workers: {low: 0, high: 2}
"""


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "bad.yaml"
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_builtins_load_and_make_valid_trial_configs():
    assert {"tiny-cpu", "gr00t-n1.6"} <= set(builtin_studies())
    tiny = load_study_spec()  # the default
    assert tiny.name == "tiny-cpu" and tiny.model == "tiny"
    assert set(tiny.space) == {"micro_batch_size", "activation_checkpointing"} and tiny.sampler.name == "grid"
    assert tiny.budget.trials == 4 and tiny.protocol.ab_min_rounds == 3  # the whole grid; sequential A/B
    for mbs in tiny.space["micro_batch_size"].choices:
        cfg = tiny.trial_config({"micro_batch_size": mbs})
        assert cfg.effective_global_batch_size() == 8  # tuning never changes the optimisation
        assert cfg.training.max_steps == tiny.protocol.steps
        assert cfg.training.log_every == tiny.protocol.window_steps
    assert tiny.export_config({}).training.max_steps == 60  # the export keeps the base's run length
    gr = load_study_spec("gr00t-n1.6")
    base = gr.base_config()
    assert gr.gpus == 1 and base.data.seq_len == 2048 and base.model.name == "gr00t-n1.6"  # full depth, no proxy
    assert base.loongforge.compute_domain.compile == "default" and base.loongforge.compute_domain.compile_scope \
        == "layer" and base.data.packing == "fill" and base.effective_global_batch_size() == 32
    assert gr.space["micro_batch_size"].choices == [8, 16, 32]
    assert {"fp8", "fp8_cast", "activation_checkpointing", "packing", "loss_backend",
            "expandable_segments"} <= set(gr.space)
    # no seeds: the search finds its answer within ten GPU-minutes, screening each config on one window first
    assert gr.seed_trials == [] and (gr.budget.trials, gr.budget.gpu_minutes) == (40, 10)
    assert (gr.pruner.name, gr.pruner.reduction_factor, gr.protocol.windows) == ("successive_halving", 3, 3)
    # conditional knob: selective checkpointing's N only when selective
    cfg = gr.trial_config({"activation_checkpointing": "selective", "activation_checkpointing_every": 4})
    assert cfg.training.activation_checkpointing_every == 4
    bf16 = load_study_spec("gr00t-n1.6-bf16")
    assert "fp8" not in bf16.space and set(bf16.space) == set(gr.space) - {"fp8", "fp8_cast", "fp8_head"}
    # the seeds: the plain compiled loop (the base itself) and the hand-picked config, every knob pinned
    assert bf16.export_config(bf16.seed_params(0)) == bf16.export_config({})
    hand = bf16.trial_config(bf16.seed_params(1))
    assert (hand.data.micro_batch_size, hand.loongforge.compute_domain.ops.loss, hand.effective_grad_accum_steps()) \
        == (16, "triton", 2)
    assert set(bf16.seed_params(1)) == set(bf16.space)


def test_the_hf_llama_study_searches_the_projects_casts_and_ops_beside_liger():
    """studies/hf-llama.yaml: the project's FP8 casts and Triton RMSNorm/SwiGLU are knobs of the HF run too, and
    under the study's compiled base they combine with Liger (the campaign's hf_pad_ligerfp8t_ops_16)."""
    hf = load_study_spec("hf-llama")
    assert {"liger", "fp8", "fp8_cast", "rmsnorm_backend", "swiglu_backend"} <= set(hf.space)
    assert hf.space["fp8_cast"].choices == ["torchao", "triton"]
    assert hf.space["rmsnorm_backend"].choices == hf.space["swiglu_backend"].choices == ["torch", "triton"]
    assert hf.base_config().loongforge.compute_domain.compile == "default"
    params = {"liger": True, "fp8": "tensorwise", "fp8_cast": "triton", "rmsnorm_backend": "triton",
              "swiglu_backend": "triton", "hf_pad_vocab": 64, "micro_batch_size": 16}
    cd = hf.trial_config(params).loongforge.compute_domain
    assert hf.trial_config(params).hf.liger and (cd.fp8, cd.fp8_cast) == ("tensorwise", "triton")
    assert (cd.ops.rmsnorm, cd.ops.swiglu, cd.ops.rope, cd.ops.loss) == ("triton", "triton", "torch", "torch")
    assert hf.knob("liger").active({**hf.base_knob_values(), **params})  # compiled: sampled beside the ops
    # fp8_cast acts under tensorwise only: with fp8 none the trial writes torchao
    assert hf.knob_overrides({"fp8": "none"})["loongforge.compute_domain.fp8_cast"] == "torchao"


def test_the_hf_llama_study_searches_the_host_waits_inside_a_step():
    """The best HF run measured on the H200 (1.60x) waits for the device nowhere inside a step: transformers'
    packed-sequence check, the Trainer's NaN/Inf filter and its blocking batch copies are knobs of the study, their
    base values the HF defaults."""
    hf = load_study_spec("hf-llama")
    base = hf.base_knob_values()
    assert (base["hf_packed_check"], base["user.nan_inf_filter"], base["user.non_blocking"]) == (True, True, False)
    cfg = hf.trial_config({"hf_packed_check": False, "user.nan_inf_filter": False, "user.non_blocking": True})
    assert cfg.hf.packed_check is False and cfg.user == {"optim": "adamw_torch_fused", "nan_inf_filter": False,
                                                         "non_blocking": True}
    assert hf.base_config().hf.packed_check is True and hf.base_config().user["nan_inf_filter"] is True


def test_the_hf_llama_study_searches_the_projects_loss_instead_of_ligers():
    """run.prepare runs an HF model's head and loss through the project's loss op: the fused Triton linear
    cross-entropy (loss_backend) or the FP8 head (fp8_head, under tensorwise); Liger's fused loss is the other
    choice for the same head, so Liger is not sampled beside either (the campaign's hf_pad_fp8t_ops_loss_16 and
    hf_pad_fp8t_ops_head_16)."""
    hf = load_study_spec("hf-llama")
    assert hf.space["loss_backend"].choices == ["torch", "triton"]
    assert hf.space["fp8_head"].choices == [False, True]
    base = hf.base_knob_values()
    for params in ({"loss_backend": "triton"}, {"fp8": "tensorwise", "fp8_head": True}):
        assert not hf.knob("liger").active({**base, **params}), params
    cd = hf.trial_config({"fp8": "tensorwise", "fp8_cast": "triton", "fp8_head": True, "liger": False}
                         ).loongforge.compute_domain
    assert cd.fp8_head and cd.effective_ops()["loss"] == "fp8"
    assert hf.trial_config({"loss_backend": "triton"}).loongforge.compute_domain.effective_ops()["loss"] == "triton"
    # fp8_head acts under tensorwise only: with fp8 none the trial writes false
    assert hf.knob_overrides({"fp8": "none"})["loongforge.compute_domain.fp8_head"] is False


def test_the_hf_llama_study_searches_the_fused_residual_norm_under_the_triton_norm():
    """The export's fused residual norm is a knob of the HF run too (run.prepare fuses the post-attention add):
    sampled where RMSNorm runs on Triton only, so a warm start from the built-in loop's winner keeps it."""
    hf = load_study_spec("hf-llama")
    assert hf.space["fused_residual_norm"].choices == [False, True]
    base = hf.base_knob_values()
    assert not hf.knob("fused_residual_norm").active({**base, "rmsnorm_backend": "torch"})
    assert hf.knob("fused_residual_norm").active({**base, "rmsnorm_backend": "triton"})
    cd = hf.trial_config({"rmsnorm_backend": "triton", "fused_residual_norm": True}).loongforge.compute_domain
    assert cd.fused_residual_norm and cd.ops.rmsnorm == "triton"


def test_a_spec_file_by_path_and_a_model_config_json(tmp_path):
    (tmp_path / "model.json").write_text(
        Path(__file__).parents[1].joinpath("assets").joinpath("gqa_config.json").read_text())
    path = _write(tmp_path, "name: mine\nmodel: model.json\n" + GOOD.split("\n", 2)[2])
    spec = load_study_spec(path)
    assert spec.source == path
    assert spec.base_config().model.config_path == str((tmp_path / "model.json").resolve())


@pytest.mark.parametrize(("text", "key", "words"), [
    ("name: t\nspace:\n  bucket_widht: {choices: [32]}\n", "space.bucket_widht", "unknown knob"),
    ("name: t\nspace:\n  num_workers: {low: 3, high: 1}\n", "space.num_workers.low", "empty range"),
    ("name: t\nspace:\n  bucket_width: {choices: []}\n", "space.bucket_width.choices", "empty choices"),
    ("name: t\nspace:\n  num_workers: {low: 0.5, high: 2}\n", "space.num_workers.low", "takes integers"),
    ("name: t\nspace:\n  compile: {low: 1, high: 2}\n", "space.compile", "give choices"),
    ("name: t\nspace:\n  micro_batch_size: {choices: [true, 2]}\n", "space.micro_batch_size.choices[0]", "int"),
    ("name: t\nbudget: {trials: ten}\n" + GOOD.split("\n", 2)[2], "budget.trials", "expected an integer"),
    ("name: t\nprotocol: {windowz: 3}\n" + GOOD.split("\n", 2)[2], "protocol.windowz", "unknown key"),
    ("name: t\nsampler: {name: cmaes}\n" + GOOD.split("\n", 2)[2], "sampler.name", "'tpe'"),
    ("name: t\nbase: {data: {micro_batch: 2}}\n" + GOOD.split("\n", 2)[2], "base.data.micro_batch", "unknown key"),
    ("name: t\nspace:\n  io_uring_entries: {choices: [8, 24]}\n", "space.io_uring_entries.choices[1]",
     "power of two"),
    ("name: t\nspace: {}\n", "space", "empty search space"),
    ("name: t\nwat: 1\n" + GOOD.split("\n", 2)[2], "wat", "unknown key"),
])
def test_bad_specs_name_file_and_key(tmp_path, text, key, words):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError) as e:
        load_study_spec(path)
    assert isinstance(e.value, ConfigError)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {key}:"), msg
    assert words in msg


def test_unreadable_spec_files_name_file_and_reason(tmp_path):
    (tmp_path / "adir.yaml").mkdir()
    (tmp_path / "binary.yaml").write_bytes(b"name: t\n\xff\n")
    for name, why in (("missing.yaml", "no such study spec file"),
                      ("adir.yaml", "is a directory; expected a study spec file"),
                      ("binary.yaml", "not UTF-8 text (byte 8); expected a YAML study spec")):
        with pytest.raises(ConfigError) as e:
            load_study_spec(str(tmp_path / name))
        assert str(e.value) == f"{tmp_path / name}: {why}"


def test_unknown_study_name_lists_the_builtins():
    with pytest.raises(ValueError, match="built-in studies: .*tiny-cpu"):
        load_study_spec("no-such-study")


def test_spec_round_trips_through_plain_data():
    from workbench.tune.study import spec_from_dict

    spec = load_study_spec("gr00t-n1.6")
    again = spec_from_dict(spec.to_dict(), source="<storage>")
    assert again.to_dict() == spec.to_dict()
    assert loads_study_spec(GOOD).space["num_workers"].high == 2


def test_exported_base_config_loads(tmp_path):
    from workbench.config import dump_config

    spec = load_study_spec()
    p = dump_config(spec.export_config({"micro_batch_size": 8}), tmp_path / "c.yaml")
    assert load_config(p).data.micro_batch_size == 8


def test_gpu_studies_search_the_memory_domain_and_the_multi_gpu_ones_the_overlap_knobs():
    for name in ("gr00t-n1.6", "gr00t-n1.6-bf16", "gr00t-n1.6-proxy", "gr00t-n1.6-2gpu", "gr00t-n1.6-8gpu",
                 "gr00t-n1.6-vla", "gr00t-n1.6-vla-2gpu"):
        spec = load_study_spec(name)
        assert spec.base_config().hardware.device == "cuda"
        # the full-depth and VLA studies leave out pinned staging blocks: data wait is 0.5 ms of a 1 s step there
        memory = {"expandable_segments"} if name in ("gr00t-n1.6", "gr00t-n1.6-bf16") or "vla" in name else \
            {"pinned_block_kb", "expandable_segments"}
        assert memory <= set(spec.space), name
        multi = {"bucket_size_mb", "overlap_ratio"} <= set(spec.space)
        assert multi == (spec.gpus > 1), name
        if "vla" in name:  # the VLA's levers: capture and compile of each block, at static shapes
            assert {"graph_capture", "compile", "micro_batch_size"} <= set(spec.space), name
            assert spec.base_config().loongforge.compute_domain.compile_shapes == "static"
    two = load_study_spec("gr00t-n1.6-2gpu")
    assert two.gpus == 2 and two.space["bucket_size_mb"].log
    cfg = two.trial_config({"bucket_size_mb": 37.5, "overlap_ratio": 0.25})
    assert cfg.hardware.gpus == 2 and cfg.loongforge.overlap.bucket_size_mb == 37.5
    assert cfg.loongforge.overlap.overlap_ratio == 0.25 and cfg.loongforge.overlap.mode == "scheduler"
    proxy = load_study_spec("gr00t-n1.6-proxy").base_config()
    from workbench.train.hf import read_hf_config
    from workbench.train.model import get_preset
    import dataclasses
    cut = read_hf_config(proxy.model.config_path)
    assert cut.num_hidden_layers == 4  # the proxy differs from the preset in depth only
    assert dataclasses.replace(cut, num_hidden_layers=28) == get_preset("gr00t-n1.6")


def test_export_pins_the_winners_resolved_launch_parameters(tmp_path):
    """The winner's kernels/launch record is pinned in the exported config (searched values kept); a kernel
    resolved differently at two shapes is not pinned; a baseline export pins nothing."""
    from workbench.tune.export import export_config, pinned_launch_params

    spec = load_study_spec("gr00t-n1.6")
    record = [
        {"kernel": "rmsnorm", "rows": 16384, "hidden": 2048, "num_warps": 16, "num_stages": 2, "block_rows": 2,
         "block_size": 2048, "programs_per_sm": 2, "configured": ["num_warps"]},
        {"kernel": "rope", "tokens": 16384, "q_heads": 32, "k_heads": 32, "head_dim": 64, "num_warps": 4,
         "num_stages": 2, "block_h": 32, "configured": []},
        {"kernel": "swiglu", "numel": 100, "num_warps": 4, "block_size": 1024, "configured": []},
        {"kernel": "swiglu", "numel": 10 ** 8, "num_warps": 8, "block_size": 2048, "configured": []},
        {"kernel": "not_a_kernel", "num_warps": 4},
    ]
    pinned = pinned_launch_params(record)
    assert set(pinned) == {"rmsnorm", "rope"}  # swiglu ran with two different parameter sets
    assert pinned["rope"] == {"num_warps": 4, "num_stages": 2, "block_h": 32}
    validation = {"winner": {"trial": 3, "significant": True},
                  "candidates": [{"trial": 3, "params": {"triton_fusion": True, "rmsnorm_num_warps": 16},
                                  "runs": [100.0, 102.0], "baseline_runs": [80.0, 81.0], "speedup_median": 1.25,
                                  "ci_low": 1.1, "ci_high": 1.4, "significant": True}]}
    cfg = load_config(export_config(spec, tmp_path, _result(spec, validation), fingerprint={"gpu": "test"},
                                    launch_record=record))
    k = cfg.loongforge.compute_domain.kernels
    assert k["rmsnorm"] == {"num_warps": 16, "num_stages": 2, "block_rows": 2, "block_size": 2048,
                            "programs_per_sm": 2}
    assert k["rope"] == pinned["rope"] and "swiglu" not in k
    assert cfg.provenance.trial == 3 and cfg.loongforge.compute_domain.triton_fusion is True
    base = {"winner": {"trial": None, "significant": False}, "candidates": [], "baseline_runs": [80.0]}
    cfg = load_config(export_config(spec, tmp_path / "b", _result(spec, base), fingerprint={"gpu": "test"},
                                    launch_record=record))
    assert cfg.loongforge.compute_domain.kernels == {}
    assert cfg.provenance.trial is None and cfg.provenance.verdict == "no_candidate"


def _result(spec, validation):
    from workbench.tune.result import build_result

    return build_result(validation, study=spec.name, base_values=spec.base_knob_values(), baseline_repeats=[80.0],
                        searched=list(spec.space), budget={"trials": 1}, data={"source": "synthetic"}, commit=None)


def test_the_winner_launch_record_comes_from_its_search_trial():
    import optuna

    from workbench.tune import winner_launch_record

    study = optuna.create_study(direction="maximize")
    for i in range(3):
        t = study.ask()
        t.set_user_attr("summary", {"kernels/launch": [{"kernel": "rope", "num_warps": 2 ** i}]})
        study.tell(t, float(i))
    assert winner_launch_record(study, {"exported": {"trial": 1}}) == [{"kernel": "rope", "num_warps": 2}]
    assert winner_launch_record(study, {"exported": {"trial": None}}) is None  # the base config was exported
    assert winner_launch_record(study, {"exported": {"trial": 7}}) is None
    assert winner_launch_record(study, {}) is None


def test_the_readmes_own_study_example_loads(tmp_path):
    """The study file in the README's "Tune your own model and data" loads and makes a valid config for each
    value it searches (with a real HF config.json beside it, as step 3 says)."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Tune your own model and data"):readme.index("## Training: checkpoints")]
    text = textwrap.dedent(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(
        Path(__file__).parents[1].joinpath("assets", "gqa_config.json").read_text())
    (tmp_path / "my-study.yaml").write_text(text)
    spec = load_study_spec(str(tmp_path / "my-study.yaml"))
    assert spec.name == "my-model" and spec.base_config().data.loongbin_dir == "/data/shards"
    for knob, rng in spec.space.items():
        for value in rng.choices:
            cfg = spec.trial_config({knob: value})
            assert cfg.effective_global_batch_size() == 32


def test_a_study_stored_before_the_key_existed_resumes_unchanged():
    from workbench.tune.opening import spec_diff

    old = {"protocol": {"windows": 3, "compile_ahead": None}, "budget": {"trials": 4}}
    assert spec_diff(old, {"protocol": {"windows": 3, "compile_ahead": None, "start_ahead": None},
                           "budget": {"trials": 9}}) == []
    assert spec_diff(old, {"protocol": {"windows": 3, "start_ahead": True}}) == ["protocol"]
    assert spec_diff(old, {"protocol": {"windows": 2, "start_ahead": None}}) == ["protocol"]
