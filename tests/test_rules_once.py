"""Rules between config keys are stated once (issue 42): each is a function or property of workbench.config.schema
(or of the sections it imports) that every other place reads. A second statement of one of them in the product's code is found here by its shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.config import (GRAPH_CAPTURING_COMPILE_MODES, accumulation, bucket_bytes, graph_capture_on,
                              merge_overrides, preset_config)
from workbench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("workbench", "kernels", "loaders", "reports", "benchmarks", "examples")
# the schema's modules: the rules between sections, and the sections whose fields a rule reads
SCHEMA = ("workbench/config/schema.py", "workbench/config/_domains.py", "workbench/config/_sections.py")

RULES = {
    # the compile modes that capture CUDA graphs themselves, as a literal list of both
    "capturing compile modes": r"""["']reduce-overhead["'],\s*["']max-autotune["']\s*[)\]]""",
    # MiB to bytes for gradient buckets
    "bucket bytes": r"bucket_size_mb\s*\*|\*\s*bucket_size_mb",
    # the overlap ratio in effect under graph capture
    "overlap ratio under capture": r"0(\.0)?\s+if\s+[\w.]*(captures|graphs_on)\s+else|captures.*overlap_ratio\s*=\s*0",
    # DDP and graph capture refused together
    "ddp with capture": r"'ddp' cannot be combined",
    # the global-batch arithmetic: samples over micro-batch times processes
    "global batch": r"[%/]\s*\(?\s*\w*(micro_batch\w*|mb)\s*\*\s*\w*(world|gpus)|[%/]{1,2}\s*per_step",
    # graph capture read as on/off from its value
    "capture on": r"""graph_capture["')]*\s*(!=|==|in|not in)\s*\(?\s*(None,\s*False,\s*)?["']none""",
}


def _product_files() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_is_stated_in_the_schema_only(rule):
    pattern = re.compile(RULES[rule])
    hits = []
    for path in _product_files():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert hits, f"the rule {rule!r} is not found at all: the pattern is out of date"
    elsewhere = [h for h in hits if not h.startswith(SCHEMA)]
    assert not elsewhere, f"{rule} restated outside {', '.join(SCHEMA)}:\n" + "\n".join(elsewhere)


def test_the_rules_compute_what_they_say():
    assert accumulation(32, 8, 2) == 2 and accumulation(32, 8, 3) is None and accumulation(8, 8, 1) == 1
    assert bucket_bytes(25.0) == 25 * 2**20 and bucket_bytes(1e-9) == 1
    assert [graph_capture_on(v) for v in (None, False, "none", "fwd_bwd", "fwd_bwd+optimizer")] == \
        [False, False, False, True, True]
    assert set(GRAPH_CAPTURING_COMPILE_MODES) == {"reduce-overhead", "max-autotune"}
    cfg = preset_config("tiny")
    cfg = merge_overrides(cfg, {"loongforge.overlap.overlap_ratio": 0.5, "loongforge.overlap.mode": "ddp"})
    assert cfg.effective_overlap_ratio == 0.5 and cfg.ddp_capture_conflict(4) is None
    assert cfg.loongforge.overlap.bucket_bytes == bucket_bytes(cfg.loongforge.overlap.bucket_size_mb)
    captured = merge_overrides(cfg, {"loongforge.compute_domain.graph_capture": "fwd_bwd",
                                     "hardware.device": "cuda"})
    assert captured.effective_overlap_ratio == 0.0
    assert captured.ddp_capture_conflict(1) is None and "4 processes" in captured.ddp_capture_conflict(4)
    with pytest.raises(ConfigError, match=r"loongforge\.overlap\.mode: 'ddp' cannot be combined"):
        merge_overrides(captured, {"hardware.gpus": 2})
    with pytest.raises(ConfigError, match="must be a multiple of data.micro_batch_size x hardware.gpus = 4 x 1 = 4"):
        merge_overrides(cfg, {"data.micro_batch_size": 4, "training.global_batch_size": 6})


def test_shared_metric_keys_are_written_once_in_the_vocabulary():
    """A metric key read in several modules is a constant of workbench.vocab; no product file spells it out."""
    import workbench.vocab as vocab

    keys = {v: k for k, v in vars(vocab).items() if k.isupper() and isinstance(v, str) and "/" in v}
    assert {"memory/max_reserved_gib", "time/step_s", REAL := "throughput/real_tokens_per_s_per_gpu"} <= set(keys)
    pattern = re.compile("|".join(re.escape(f'"{k}"') + "|" + re.escape(f"'{k}'") for k in keys))
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in _product_files() if p.name != "vocab.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, f"spelt out instead of workbench.vocab's constants (e.g. {keys[REAL]}):\n" + "\n".join(hits)


def test_files_are_replaced_atomically_by_one_helper():
    """The temp file, fsync, ``os.replace`` and fsync of the folder are workbench.files.atomic_write's, which every
    writer of the packages uses (the trust rule: a reader sees the old file or the whole new one)."""
    pattern = re.compile(r"os\.replace\(|mkstemp\(")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for top in ("workbench", "loaders", "kernels", "reports")
            for p in sorted((ROOT / top).rglob("*.py")) if p.relative_to(ROOT).as_posix() != "workbench/files.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line.split("#", 1)[0])]
    assert not hits, "a temp file replaced by hand; use workbench.files.atomic_write:\n" + "\n".join(hits)
