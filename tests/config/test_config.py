"""Tests of workbench.config: schema defaults, YAML round trip, strict validation, overrides."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import pytest

from workbench import config as C
from workbench.config import typecheck
from workbench.config import (
    AllocatorConfig,
    ComputeDomainConfig,
    Config,
    ConfigError,
    DataConfig,
    OpsConfig,
    OverlapConfig,
    Provenance,
    config_hash,
    dump_config,
    dumps_config,
    field_docs,
    from_dict,
    load_config,
    loads_config,
    merge_overrides,
    parse_overrides,
    preset_config,
    to_dict,
    validate,
)
from workbench.train.allocator import apply_allocator_env

SEED = Path(__file__).resolve().parents[2] / "docs" / "seed-config.yaml"


def _sections(cls: type = Config) -> list[type]:
    """Every section dataclass reachable from ``cls``, ``cls`` included."""
    out = [cls]
    for f in dataclasses.fields(cls):
        section = typecheck.section_class(typecheck.type_hints_of(cls)[f.name])
        if section is not None and section not in out:
            out.extend(s for s in _sections(section) if s not in out)
    return out


def _rejects(text: str, *fragments: str) -> str:
    """Load ``text`` expecting a ConfigError whose message holds every fragment."""
    with pytest.raises(ConfigError) as info:
        loads_config(text, source="run.yaml")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def _full_config() -> Config:
    """A config with every section away from its defaults, and strings that YAML likes to mangle (run it in a
    scratch working directory: the checkpoint it names is made there, since a missing one is an error)."""
    Path("1e3").touch()
    return merge_overrides(
        Config(),
        {
            "model.name": "custom",
            "model.config_path": "/models/x: y/config.json",
            "model.checkpoint_path": "1e3",  # a float to our loader unless quoted
            "data.loongbin_dir": "yes",  # a bool to YAML 1.1 unless quoted
            "data.micro_batch_size": 3,
            "data.seq_len": 1000,
            "data.bucket_width": 999,
            "data.num_workers": 0,
            "training.global_batch_size": 24,
            "training.learning_rate": 1e-10,
            "training.weight_decay": 1e16,
            "training.grad_clip": 0.1 + 0.2,  # not representable in few digits: repr must survive
            "training.scheduler": "constant",
            "training.dtype": "bf16",
            "training.checkpoint_dir": "null",
            "training.checkpoint_every": 50,
            "loongforge.io_domain.io_backend": "threadpool",
            "loongforge.io_domain.io_uring_entries": 4096,
            "loongforge.memory_domain.pinned_block_kb": 256,
            "loongforge.memory_domain.allocator.expandable_segments": False,
            "loongforge.memory_domain.allocator.roundup_power2_divisions": 4,
            "loongforge.memory_domain.allocator.max_split_size_mb": 20,
            "loongforge.memory_domain.allocator.garbage_collection_threshold": 0.6,
            "loongforge.compute_domain.compile": "max-autotune-no-cudagraphs",
            "loongforge.compute_domain.compile_shapes": "static",
            "loongforge.compute_domain.graph_capture": True,
            "loongforge.compute_domain.ops.rope": "triton",
            "loongforge.compute_domain.kernels": {
                "rmsnorm": {"num_warps": 8, "num_stages": 2, "block_size": 1024},
                "swiglu": {},
            },
            "loongforge.overlap.bucket_size_mb": 12.5,
            "loongforge.overlap.overlap_ratio": 0,
            "hardware.gpus": 2,
            "hardware.device": "cuda",
            "hardware.peak_tflops": 989,
            "metrics.prometheus_port": C.DEFAULT_PROMETHEUS_PORT,
            "metrics.phase_timing": False,
            "metrics.out_dir": "",
            "provenance": {
                "study": "line\nbreak # not a comment",
                "trial": 17,
                "tokens_per_s_per_gpu": 12345.678,
                "speedup": 1.31,
                "speedup_ci": [1.2, 1.4],
                "significant": True,
                "baseline_tokens_per_s_per_gpu": 9424.0,
                "fingerprint": {"gpu": "NVIDIA H200", "driver": "550.54", "torch": "2.5.1", "nccl": "~", "ünï": "-"},
                "created": "2025-01-31T12:00:00+00:00",
            },
        },
    )


# --------------------------------------------------------------------------- schema


def test_defaults_are_valid_and_cpu_friendly() -> None:
    cfg = Config()
    assert cfg.version == C.CONFIG_VERSION
    assert cfg.model.name == "tiny" and cfg.provenance is None
    assert cfg.hardware.device == "auto" and cfg.loongforge.compute_domain.graph_capture == "none"
    assert cfg.effective_grad_accum_steps() == 1
    assert cfg.effective_global_batch_size() == cfg.data.micro_batch_size


def test_every_field_has_a_one_line_docstring() -> None:
    for cls in [*_sections(), Provenance]:
        assert dataclasses.is_dataclass(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
            assert "\n" not in docs[f.name]
            assert f.kw_only


# --------------------------------------------------------------------------- YAML round trip


def test_default_config_round_trips_exactly(tmp_path: Path) -> None:
    cfg = Config()
    path = dump_config(cfg, tmp_path / "sub" / "config.yaml")
    assert load_config(path) == cfg
    assert loads_config(dumps_config(cfg, comments=False)) == cfg
    assert to_dict(load_config(path)) == to_dict(cfg)


def test_full_config_round_trips_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _full_config()
    assert cfg.effective_grad_accum_steps() == 4  # 24 / (3 per GPU x 2 GPUs)
    loaded = load_config(dump_config(cfg, tmp_path / "config.yaml"))
    assert loaded == cfg
    assert type(loaded.training.learning_rate) is float and type(loaded.hardware.peak_tflops) is float
    assert loaded.provenance is not None and loaded.provenance.study == "line\nbreak # not a comment"
    assert loads_config(dumps_config(cfg, comments=False)) == cfg


def test_dump_keeps_schema_order_and_documents_keys() -> None:
    text = dumps_config(Config())
    top = [line.split(":")[0] for line in text.splitlines() if line[:1].isalpha()]
    assert top == [f.name for f in dataclasses.fields(Config)]
    data_keys = list(to_dict(loads_config(text))["data"])
    assert data_keys == [f.name for f in dataclasses.fields(DataConfig)]
    assert f"# {field_docs(DataConfig)['micro_batch_size']}\n  micro_batch_size: 4\n" in text
    assert config_hash(Config()) in text.splitlines()[0]


def test_dump_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.yaml"
    dump_config(Config(), path)
    before = path.read_text()

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    full = _full_config()
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        dump_config(full, path)
    assert path.read_text() == before  # the old file is untouched
    assert sorted(os.listdir(tmp_path)) == ["config.yaml", "sub"]  # and no temp file is left


def test_seed_config_loads() -> None:
    cfg = load_config(SEED)
    assert cfg.model.name == "gr00t-n1.6" and cfg.model.config_path
    assert (cfg.data.micro_batch_size, cfg.data.seq_len) == (8, 2048)
    assert cfg.hardware.gpus == 8 and cfg.training.global_batch_size == 512
    assert cfg.effective_grad_accum_steps() == 8
    assert cfg.training.learning_rate == 3e-4
    io = cfg.loongforge.io_domain
    assert (io.io_uring_entries, io.zstd_dict_size) == (256, 112640)
    compute = cfg.loongforge.compute_domain
    assert compute.graph_capture == "fwd_bwd+optimizer" and compute.triton_fusion  # true: both segments
    assert set(compute.effective_ops().values()) == {"triton"}
    assert cfg.loongforge.memory_domain.allocator.to_env() == "expandable_segments:True"
    assert "#" in SEED.read_text()  # written with comments, in the orchestrator's style


def test_yaml_quirks() -> None:
    # 3e-4 is a float (PyYAML alone reads it as a string); unquoted timestamps stay strings.
    cfg = loads_config(
        "training:\n  learning_rate: 3e-4\nprovenance:\n  study: s\n  created: 2025-01-02T03:04:05\n"
    )
    assert cfg.training.learning_rate == 3e-4
    assert cfg.provenance is not None and cfg.provenance.created == "2025-01-02T03:04:05"
    # an empty (or comments-only) file is a mistake, refused in one line; a NUL byte likewise
    for text in ("", "\n\n", "# nothing here\n"):
        with pytest.raises(ConfigError, match=r"^run\.yaml: is empty; expected a YAML config \(to run a preset's "
                                              r"defaults, pass --preset NAME instead of --config\)$"):
            loads_config(text, source="run.yaml")
    with pytest.raises(ConfigError, match=r"^run\.yaml:2: holds a NUL byte \(character 11\); expected a YAML "
                                          r"config \(is it a binary file\?\)$"):
        loads_config("model:\n  na\0me: tiny\n", source="run.yaml")
    # an int is accepted where a float is expected, and stored as a float
    assert type(loads_config("training:\n  learning_rate: 1\n").training.learning_rate) is float


# --------------------------------------------------------------------------- rejections


def test_unknown_key_names_path_and_suggests() -> None:
    message = _rejects("data:\n  micro_batch: 8\n", "run.yaml", "data.micro_batch", "'micro_batch_size'")
    assert "seq_len" in message  # lists the allowed keys of the section
    _rejects("daat: {}\n", "daat", "'data'")
    _rejects(
        "loongforge:\n  io_domain:\n    io_uring_entry: 64\n",
        "loongforge.io_domain.io_uring_entry",
        "'io_uring_entries'",
    )
    _rejects("data:\n  learning_rate: 0.1\n", "data.learning_rate", "'training.learning_rate'")


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("data:\n  micro_batch_size: '8'\n", ["data.micro_batch_size", "'8' (str)", "an integer >= 1"]),
        ("data:\n  micro_batch_size: true\n", ["data.micro_batch_size", "True (bool)", "an integer"]),
        (
            "loongforge:\n  compute_domain:\n    kernels: [8, 2]\n",
            ["loongforge.compute_domain.kernels", "[8, 2] (list)", "a mapping"],
        ),
        ("loongforge:\n  compute_domain:\n    kernels:\n      rmsnorm: {num_warps: 4.0}\n",
         ["kernels.rmsnorm.num_warps", "4.0 (float)", "an integer"]),
        ("model:\n  name: 7\n", ["model.name", "7 (int)", "a string"]),
        ("hardware:\n  peak_tflops: high\n", ["hardware.peak_tflops", "'high'", "a number > 0 or null"]),
        ("training:\n  learning_rate: .inf\n", ["training.learning_rate", "finite"]),
        ("metrics:\n  phase_timing: 1\n", ["metrics.phase_timing", "1 (int)", "a boolean"]),
        ("data: 5\n", ["data", "5 (int)", "a mapping"]),
        ("provenance:\n  study: s\n  speedup_ci: [1.1, x]\n", ["provenance.speedup_ci[1]", "'x'"]),
        ("provenance:\n  study: s\n  fingerprint: {gpu: 1}\n", ["provenance.fingerprint.gpu", "a string"]),
        ("provenance:\n  trial: 1\n", ["provenance", "missing", "study"]),
        (
            "loongforge:\n  compute_domain:\n    compile: max-autotun\n",
            ["loongforge.compute_domain.compile", "one of", "did you mean 'max-autotune'"],
        ),
        ("model:\n  name: tinny\n", ["model.name", "'tiny'", "config_path"]),
        ("- 1\n", ["run.yaml", "top level", "a mapping"]),
    ],
)
def test_wrong_type_names_path_value_and_expected(text: str, fragments: list[str]) -> None:
    _rejects(text, "run.yaml", *fragments)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (
            "loongforge:\n  io_domain:\n    io_uring_entries: 100\n",
            ["loongforge.io_domain.io_uring_entries", "100", "power of two", "[1, 4096]"],
        ),
        ("loongforge:\n  io_domain:\n    io_uring_entries: 8192\n", ["io_uring_entries", "8192", "[1, 4096]"]),
        ("loongforge:\n  overlap:\n    overlap_ratio: 1.5\n", ["loongforge.overlap.overlap_ratio", "1.5", "[0, 1]"]),
        ("data:\n  micro_batch_size: 0\n", ["data.micro_batch_size", "0", ">= 1"]),
        ("training:\n  learning_rate: 0\n", ["training.learning_rate", "> 0"]),
        (
            "loongforge:\n  memory_domain:\n    allocator:\n      garbage_collection_threshold: 1.0\n",
            ["allocator.garbage_collection_threshold", "(0, 1)"],
        ),
        (
            "loongforge:\n  memory_domain:\n    allocator:\n      max_split_size_mb: 16\n",
            ["allocator.max_split_size_mb", ">= 20"],
        ),
        ("loongforge:\n  memory_domain:\n    pinned_block_kb: 6\n", ["pinned_block_kb", "multiple of 4"]),
        (
            "loongforge:\n  compute_domain:\n    kernels: {rmsnorm: {num_warps: 0}}\n",
            ["loongforge.compute_domain.kernels.rmsnorm.num_warps", ">= 1"],
        ),
        (  # the kernels' launch parameters: the registry's checks that hold at every shape, at load
            "loongforge:\n  compute_domain:\n    kernels: {rmsnorm: {num_warps: 3}}\n",
            ["loongforge.compute_domain.kernels.rmsnorm.num_warps: got 3; must be one of [1, 2, 4, 8, 16, 32]"],
        ),
        (
            "loongforge:\n  compute_domain:\n    kernels: {rmsnrom: {num_warps: 4}}\n",
            ["loongforge.compute_domain.kernels.rmsnrom: unknown kernel; kernels: rmsnorm, swiglu, rope"],
        ),
        (
            "loongforge:\n  compute_domain:\n    kernels: {swiglu: {block_sise: 1024}}\n",
            ["kernels.swiglu.block_sise: is not a launch parameter of this kernel", "'block_size'"],
        ),
        (
            "loongforge:\n  compute_domain:\n    kernels:\n"
            "      rmsnorm: {block_rows: 256, block_size: 65536, num_warps: 4}\n",
            ["kernels.rmsnorm.block_rows: got 256; with block_size=65536 and num_warps=4 gives a tile of 16777216"],
        ),
        ("provenance:\n  study: s\n  speedup_ci: [1.4, 1.2]\n", ["provenance.speedup_ci", "low must be <= high"]),
        ("provenance:\n  study: s\n  created: yesterday\n", ["provenance.created", "ISO 8601"]),
        ("metrics:\n  prometheus_port: 70000\n", ["metrics.prometheus_port", "[1, 65535]"]),
    ],
)
def test_out_of_range_names_path_and_range(text: str, fragments: list[str]) -> None:
    _rejects(text, "run.yaml", *fragments)


def test_incompatible_toggles() -> None:
    _rejects(
        "loongforge:\n  compute_domain:\n    compile: reduce-overhead\n    graph_capture: true\n",
        "loongforge.compute_domain.graph_capture",
        "compile",
        "'reduce-overhead'",
    )
    _rejects(
        "hardware:\n  device: cpu\nloongforge:\n  compute_domain:\n    graph_capture: true\n",
        "graph_capture",
        "hardware.device",
    )
    _rejects(
        "data:\n  micro_batch_size: 8\nhardware:\n  gpus: 8\ntraining:\n  global_batch_size: 100\n",
        "training.global_batch_size",
        "multiple",
        "64",
    )
    _rejects(
        "training:\n  global_batch_size: 16\n  grad_accum_steps: 3\n", "training.grad_accum_steps", "means 4"
    )
    _rejects("training:\n  checkpoint_every: 50\n", "training.checkpoint_every", "checkpoint_dir")
    _rejects("data:\n  seq_len: 32\n", "data.bucket_width", "seq_len")


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError, match=r"micro_batch_size: got 0, out of range"):
        DataConfig(micro_batch_size=0)
    with pytest.raises(ConfigError, match=r"overlap_ratio"):
        OverlapConfig(overlap_ratio=1.5)
    with pytest.raises(ConfigError, match=r"graph_capture.*compile"):
        ComputeDomainConfig(compile="max-autotune", graph_capture=True)
    with pytest.raises(ConfigError, match=r"^data\.seq_len"):
        Config(data={"seq_len": 8})  # a mapping for a section is built (and checked) with its path
    assert type(OverlapConfig(bucket_size_mb=10).bucket_size_mb) is float


def test_validate_catches_in_place_edits() -> None:
    cfg = Config()
    cfg.data.seq_len = 8
    with pytest.raises(ConfigError, match=r"^data\.seq_len: got 8"):
        validate(cfg)


def test_newer_version_is_rejected_before_anything_else() -> None:
    _rejects(
        f"version: {C.CONFIG_VERSION + 1}\nnew_section: {{}}\n", "run.yaml", "version", "newer", "update the workbench"
    )
    with pytest.raises(ConfigError, match="newer"):
        Config(version=C.CONFIG_VERSION + 1)
    _rejects("version: 0\n", "version", ">= 1")


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  name: tiny\ndata:\n  micro_batch_size: [4\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:5:")
    assert info.value.source == str(path) and info.value.line == 5
    # an error in a valid YAML file names the file too
    path.write_text("data:\n  micro_batch_size: 0\n")
    with pytest.raises(ConfigError, match=rf"^{path}: data\.micro_batch_size"):
        load_config(path)


def test_unreadable_file_names_file_and_reason(tmp_path: Path) -> None:
    cases = {
        tmp_path / "missing.yaml": "no such config file",
        tmp_path / "adir.yaml": "is a directory; expected a config file",
        tmp_path / "binary.yaml": "not UTF-8 text (byte 0); expected a YAML config",
    }
    (tmp_path / "adir.yaml").mkdir()
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00data")
    for path, why in cases.items():
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == f"{path}: {why}"
        assert info.value.source == str(path)


def test_duplicate_keys_are_rejected() -> None:
    _rejects("data:\n  num_workers: 2\n  num_workers: 4\n", "run.yaml:3", "duplicate key 'num_workers'")


def test_config_error_pickles() -> None:
    error = ConfigError("got 0", key="data.seq_len", source="a.yaml", line=3)
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) == "a.yaml:3: data.seq_len: got 0"
    assert isinstance(again, ValueError)


# --------------------------------------------------------------------------- overrides and helpers


def test_merge_overrides_applies_and_validates() -> None:
    base = Config()
    cfg = merge_overrides(
        base,
        {
            "data.micro_batch_size": 8,
            "loongforge.compute_domain.kernels.rmsnorm.num_warps": 8,
            "loongforge.overlap": {"overlap_ratio": 0.5},  # a mapping merges into the section
            "provenance.study": "s1",
        },
    )
    assert cfg.data.micro_batch_size == 8 and base.data.micro_batch_size == 4  # base untouched
    assert cfg.loongforge.compute_domain.kernels == {"rmsnorm": {"num_warps": 8}}
    assert cfg.loongforge.overlap == OverlapConfig(overlap_ratio=0.5)
    assert cfg.provenance == Provenance(study="s1")
    assert merge_overrides(cfg, {}) == cfg
    with pytest.raises(ConfigError, match=r"data\.micro_batch_size: got 0"):
        merge_overrides(base, {"data.micro_batch_size": 0})


def test_merge_overrides_rejects_unknown_keys() -> None:
    with pytest.raises(ConfigError, match=r"^data\.micro_batch: unknown key; did you mean 'micro_batch_size'"):
        merge_overrides(Config(), {"data.micro_batch": 8})
    with pytest.raises(ConfigError, match=r"^loongforge\.io: unknown key"):
        merge_overrides(Config(), {"loongforge.io.io_uring_entries": 8})
    with pytest.raises(ConfigError, match=r"^data\.seq_len: .*no key 'x'"):
        merge_overrides(Config(), {"data.seq_len.x": 1})
    with pytest.raises(ConfigError, match="malformed"):
        merge_overrides(Config(), {"data..seq_len": 1})


def test_parse_overrides() -> None:
    parsed = parse_overrides(["data.micro_batch_size=8", "training.learning_rate=3e-4", "training.dtype=bf16",
                              "loongforge.compute_domain.graph_capture=true", "metrics.out_dir=null"])
    assert parsed == {
        "data.micro_batch_size": 8,
        "training.learning_rate": 3e-4,
        "training.dtype": "bf16",
        "loongforge.compute_domain.graph_capture": True,
        "metrics.out_dir": None,
    }
    assert merge_overrides(Config(), parsed).training.dtype == "bf16"
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["data.micro_batch_size"])


def test_allocator_to_env() -> None:
    assert AllocatorConfig().to_env() == ""
    assert AllocatorConfig(expandable_segments=True, max_split_size_mb=128).to_env() == (
        "expandable_segments:True,max_split_size_mb:128"
    )
    full = AllocatorConfig(
        expandable_segments=False, roundup_power2_divisions=4, max_split_size_mb=256, garbage_collection_threshold=0.8
    )
    assert full.to_env() == (
        "expandable_segments:False,roundup_power2_divisions:4,max_split_size_mb:256,garbage_collection_threshold:0.8"
    )


def test_apply_allocator_env_merges_with_the_environment() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,backend:native"}
    assert apply_allocator_env(Config(), env) == "" and list(env) == ["PYTORCH_CUDA_ALLOC_CONF"]
    cfg = merge_overrides(Config(), {"loongforge.memory_domain.allocator": {"max_split_size_mb": 128,
                                                                             "expandable_segments": True}})
    value = apply_allocator_env(cfg, env)
    assert value == "max_split_size_mb:128,backend:native,expandable_segments:True"
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": value, "PYTORCH_ALLOC_CONF": value}


def test_preset_config() -> None:
    assert preset_config("tiny") == Config()
    assert preset_config("gr00t-n1.6").model.name == "gr00t-n1.6"
    with pytest.raises(ConfigError, match=r"^model\.name: got 'gr00t'.*did you mean 'gr00t-n1.6'"):
        preset_config("gr00t")


def test_effective_ops() -> None:
    ops = OpsConfig(rmsnorm="triton", loss="triton")
    mixed = ComputeDomainConfig(ops=ops)
    assert mixed.effective_ops() == {"rmsnorm": "triton", "swiglu": "torch", "rope": "torch", "loss": "triton"}
    fused = ComputeDomainConfig(ops=ops, triton_fusion=True)
    assert fused.effective_ops() == dict.fromkeys(["rmsnorm", "swiglu", "rope", "loss"], "triton")


def test_config_hash_is_stable_and_ignores_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _full_config()
    assert config_hash(cfg) == config_hash(loads_config(dumps_config(cfg)))
    assert config_hash(cfg) == config_hash(dataclasses.replace(cfg, provenance=None))
    assert config_hash(Config()) != config_hash(merge_overrides(Config(), {"data.num_workers": 3}))
    assert len(config_hash(cfg)) == 12


def test_a_key_added_later_counts_in_the_hash_only_off_its_default() -> None:
    """metrics.profile_after_measure came after studies were stored: at its default a config hashes as it did
    without the key (a stored study's baseline and A/B pairs are still its own on resume)."""
    import hashlib
    import json

    cfg = merge_overrides(Config(), {"metrics.profile_steps": 2})
    data = to_dict(cfg)
    data.pop("provenance", None)
    data.pop("hf")  # a later section at its defaults
    del data["metrics"]["profile_after_measure"]
    before = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    assert config_hash(cfg) == before
    assert config_hash(merge_overrides(cfg, {"metrics.profile_after_measure": True})) != before
    # hf.packed_check came after the hf-llama studies were stored with a padded vocabulary (hf off its defaults)
    hf = merge_overrides(cfg, {"hf.pad_vocab_multiple": 64})
    data = to_dict(hf)
    data.pop("provenance", None)
    del data["metrics"]["profile_after_measure"], data["hf"]["packed_check"]
    before = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    assert config_hash(hf) == before
    assert config_hash(merge_overrides(hf, {"hf.packed_check": False})) != before


def test_from_dict_on_a_section_prefixes_its_path() -> None:
    with pytest.raises(ConfigError, match=r"^loongforge\.overlap\.overlap_ratio"):
        from_dict(OverlapConfig, {"overlap_ratio": 2}, path="loongforge.overlap")
    assert from_dict(OverlapConfig, {"bucket_size_mb": 5}) == OverlapConfig(bucket_size_mb=5.0)
