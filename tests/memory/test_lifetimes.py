"""The gradient-lifetime analysis (workbench/memory/lifetimes.py) on the CPU: the production order derived from the
autograd DAG against the order backward hooks fire in a real backward, the bucket plan against overlap.py's, the
plans' numbers worked by hand, the DAG cache and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from workbench.config import merge_overrides, preset_config
from workbench.memory import lifetimes as lt
from workbench.memory.__main__ import main as memory_main
from workbench.train.model import Llama
from workbench.train.ops import resolve
from workbench.config import MIB
from workbench.train.overlap import layer_units, plan_buckets
from workbench.train.trainer import build_model_args

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def _cfg(preset: str = "tiny", **overrides):
    return merge_overrides(preset_config(preset), overrides) if overrides else preset_config(preset)


def _hooked_backward(model: torch.nn.Module, loss_of) -> list[str]:
    """Names of ``model``'s parameters in the order their post-accumulate-grad hooks fire in one real backward."""
    fired: list[str] = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, name=name: fired.append(name))
    loss_of(model).backward()
    return fired


def _llama(cfg) -> Llama:
    t = cfg.training
    torch.manual_seed(0)
    model = Llama(build_model_args(cfg), resolve(fused_residual_norm=cfg.loongforge.compute_domain.fused_residual_norm))
    model.set_activation_checkpointing(t.activation_checkpointing, t.activation_checkpointing_every)
    return model.train()


def _llama_loss(model: Llama) -> torch.Tensor:
    ids_BT = torch.randint(0, model.args.vocab_size, (2, 32))
    loss_sum, n_tok = model.loss(ids_BT, torch.arange(32).expand(2, 32), torch.ones_like(ids_BT, dtype=torch.bool))
    return loss_sum / n_tok


# --------------------------------------------------------------------------- the production order


@pytest.mark.parametrize("overrides", [
    {},
    {"training.activation_checkpointing": "full"},
    {"training.activation_checkpointing": "selective", "training.activation_checkpointing_every": 2,
     "loongforge.compute_domain.fused_residual_norm": True},
    {"model.config_path": str(ASSETS / "gqa_config.json"), "model.name": "gqa"},  # untied head, 2 kv heads of 4
], ids=["plain", "full-checkpointing", "selective-fused-norm", "gqa-config"])
def test_order_from_the_dag_is_the_order_backward_hooks_fire(overrides, tmp_path):
    cfg = _cfg(**overrides)
    dag, cached, _ = lt.load_dag(cfg, cache_dir=tmp_path)
    assert not cached and dag["nodes"][0][0] == "DivBackward0"  # the loss, divided as the training step does
    fired = _hooked_backward(_llama(cfg), _llama_loss)
    assert lt.production_order(dag["nodes"]) == fired
    assert len(fired) == len(dag["params"])


class _Branches(torch.nn.Module):
    """Two branches computed interleaved: a(x) and b(x) (in the order ``first``), then f(a), g(b). The engine runs
    the ready node made last first, so with a, b first the gradients come g, f, b, a, not g, b, f, a as a
    depth-first walk from the loss would have it; with b, a first they come g, f, a, b, not the reverse of
    registration (g, f, b, a)."""

    def __init__(self, first: str) -> None:
        super().__init__()
        self.a, self.b, self.f, self.g = (torch.nn.Linear(4, 4, bias=False) for _ in range(4))
        self.first = first

    def forward(self, x):
        if self.first == "ab":
            ha, hb = self.a(x), self.b(x)
        else:
            hb, ha = self.b(x), self.a(x)
        return (self.f(ha) + self.g(hb)).sum()


@pytest.mark.parametrize("first", ["ab", "ba"])
def test_order_follows_the_engines_sequence_numbers_across_branches(first):
    m = _Branches(first)
    names = {id(p): n for n, p in m.named_parameters()}
    x = torch.randn(3, 4)
    derived = lt.production_order(lt._walk(m(x).grad_fn, names))
    fired = _hooked_backward(m, lambda mod: mod(x))
    assert derived == fired
    assert fired == (["g.weight", "f.weight", "b.weight", "a.weight"] if first == "ab"
                     else ["g.weight", "f.weight", "a.weight", "b.weight"])


class _Stacked(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(3)) for _ in range(n))

    def forward(self, x):
        return (torch.stack(list(self.ws)) * x).sum()


def test_ties_between_gradients_ready_at_once_break_as_the_engines_heap_does():
    """One node hands n AccumulateGrad nodes their gradient at once; all have sequence_nr UINT64_MAX, and the
    engine's std::priority_queue pops them in an order that is neither arrival nor its reverse."""
    m = _Stacked(10)
    names = {id(p): n for n, p in m.named_parameters()}
    x = torch.randn(3)
    derived = lt.production_order(lt._walk(m(x).grad_fn, names))
    fired = _hooked_backward(m, lambda mod: mod(x))
    assert derived == fired
    assert [int(n.split(".")[1]) for n in fired] == [0, 2, 6, 9, 8, 5, 7, 4, 1, 3]


def test_gr00t_order_is_the_one_measured_on_an_h200(tmp_path):
    """The gr00t-n1.6 order derived on the CPU's fake tensors equals the hook order of a real backward on an H200
    under bf16 autocast with flash SDPA (no checkpointing and full, fused norm off and on: the same order)."""
    golden = json.loads((ASSETS / "grad_order_h200_gr00t-n1.6_2026-12-01.json").read_text())
    dag, _, _ = lt.load_dag(_cfg("gr00t-n1.6"), cache_dir=tmp_path)
    assert lt.production_order(dag["nodes"]) == golden["order"]


# --------------------------------------------------------------------------- the buckets and the plans


def test_buckets_are_overlap_py_plan_of_the_real_model(tmp_path):
    cfg = _cfg(**{"loongforge.overlap.bucket_size_mb": 1.0, "training.grad_clip": 0.0})
    doc = lt.analyze_lifetimes(cfg, cache_dir=tmp_path)
    model = _llama(cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    plan = plan_buckets(layer_units(model), int(1.0 * MIB))
    assert len(plan) == len(doc["buckets"]) >= 3
    assert [{names[id(p)] for p in b.params} for b in plan] == \
        [{p["name"] for p in doc["params"] if p["bucket"] == i} for i in range(len(plan))]
    assert [list(b.layers) for b in plan] == [b["layers"] for b in doc["buckets"]]
    assert [b.nbytes for b in plan] == [b["bytes"] for b in doc["buckets"]]
    assert doc["total_bytes"] == sum(p.numel() * 4 for p in model.parameters())
    assert doc["today"]["peak_live_bytes"] == doc["total_bytes"]
    assert doc["lifetime"]["applies"] and doc["saved_bytes"] == doc["lifetime"]["saved_bytes"] > 0


def test_plans_worked_by_hand():
    # five gradients produced in this order; three buckets, in plan (launch) order
    order = ["e", "d", "c", "b", "a"]
    nbytes = {"a": 100, "b": 10, "c": 30, "d": 20, "e": 40}
    buckets = [lt.Bucket(("L2",), ("e", "d")), lt.Bucket(("L1",), ("c",)), lt.Bucket(("L0",), ("b", "a"))]
    p = lt.plan_lifetimes(order, nbytes, buckets)
    assert p["total_bytes"] == 200 and p["today"]["peak_live_bytes"] == 200
    # bucket 0: ticks 0-1, ready 1, launched 1, freed at bucket 1's launch (2); bucket 1: tick 2, freed at 4;
    # bucket 2: ticks 3-4, launched and freed at 4
    got = [(b["alloc_tick"], b["ready_tick"], b["launch_tick"], b["release_tick"], b["slot"])
           for b in p["buckets"]]
    assert got == [(0, 1, 1, 2, 0), (2, 2, 2, 4, 1), (3, 4, 4, 4, 0)]
    # live: 60, 60, 60 + 30, 30 + 110, 30 + 110
    assert [x["lifetime_bytes"] for x in p["timeline"]] == [60, 60, 90, 140, 140]
    assert [x["today_bytes"] for x in p["timeline"]] == [40, 60, 90, 100, 200]
    life = p["lifetime"]
    assert (life["peak_live_bytes"], life["slots"], life["slot_bytes"]) == (140, 2, [110, 30])
    assert (life["buffer_bytes"], life["saved_bytes"]) == (140, 60)
    assert [(x["name"], x["production_index"], x["bucket"]) for x in p["params"]][:2] == [("e", 0, 0), ("d", 1, 0)]

    # only the first bucket overlapped: the other two launch after the backward (ticks 5, 6), so bucket 1 lives
    # until 6 and all three share tick 5
    p = lt.plan_lifetimes(order, nbytes, buckets, n_overlap=1)
    assert [(b["launch_tick"], b["release_tick"]) for b in p["buckets"]] == [(1, 5), (5, 6), (6, 6)]
    assert p["lifetime"]["peak_live_bytes"] == 200 and p["lifetime"]["slots"] == 3

    # a parameter with no gradient in the graph: its bucket is ready only after the backward
    p = lt.plan_lifetimes(["e", "d", "c", "b"], nbytes, buckets)
    assert p["buckets"][2]["ready_tick"] == 4 and p["total_bytes"] == 200

    # accumulation: every buffer lives across the micro-batches, one slot per bucket, nothing saved
    p = lt.plan_lifetimes(order, nbytes, buckets, grad_accum=4)
    assert [(b["first_tick"], b["alloc_tick"], b["release_tick"]) for b in p["buckets"]] == [(0, 0, 4), (2, 0, 4),
                                                                                             (3, 0, 4)]
    life = p["lifetime"]
    assert (life["peak_live_bytes"], life["slots"], life["buffer_bytes"], life["saved_bytes"]) == (200, 3, 200, 0)


def test_accumulation_and_clipping_report_no_saving(tmp_path):
    base = {"loongforge.overlap.bucket_size_mb": 1.0}
    free = lt.analyze_lifetimes(_cfg(**base, **{"training.grad_clip": 0.0}), cache_dir=tmp_path)
    clipped = lt.analyze_lifetimes(_cfg(**base, **{"training.grad_clip": 1.0}), cache_dir=tmp_path)
    assert clipped["dag"]["cached"]  # the same graph: clipping is not part of the DAG's key
    assert clipped["saved_bytes"] == 0 and not clipped["lifetime"]["applies"]
    assert "grad_clip" in clipped["lifetime"]["blocked_by"][0]
    assert clipped["lifetime"]["saved_bytes"] == free["saved_bytes"] > 0  # what the plan would save without it
    accum = lt.analyze_lifetimes(_cfg(**base, **{"training.grad_clip": 0.0, "data.micro_batch_size": 2,
                                                  "training.global_batch_size": 8}), cache_dir=tmp_path)
    assert accum["grad_accum_steps"] == 4 and accum["saved_bytes"] == 0
    assert accum["lifetime"]["peak_live_bytes"] == accum["total_bytes"]
    assert "accumulation over 4 micro-batches" in accum["lifetime"]["blocked_by"][0]


# --------------------------------------------------------------------------- the cache and the CLI


def test_cache_key_follows_what_changes_the_graph():
    base = lt.dag_key(_cfg())
    assert lt.dag_key(_cfg(**{"data.micro_batch_size": 2, "loongforge.overlap.bucket_size_mb": 1.0})) == base
    for over in ({"training.activation_checkpointing": "full"},
                 {"loongforge.compute_domain.fused_residual_norm": True},
                 {"model.name": "gr00t-n1.6"}):
        assert lt._hash(lt.dag_key(_cfg(**over))) != lt._hash(base)
    assert base["torch"] == torch.__version__


def test_cli_writes_lifetimes_json_and_caches_the_dag(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["lifetimes", "--preset", "tiny", "--out", str(out), "--set", "loongforge.overlap.bucket_size_mb=1"]
    assert memory_main(args) == 0
    first = json.loads((out / "lifetimes.json").read_text())
    text = capsys.readouterr().out
    assert not first["dag"]["cached"] and "built in" in text and f"wrote {out / 'lifetimes.json'}" in text
    assert Path(first["dag"]["path"]).parent == tmp_path / "cache" / "lifetimes"
    assert first["schema_version"] == lt.SCHEMA_VERSION and len(first["buckets"]) >= 3

    assert memory_main(args) == 0
    second = json.loads((out / "lifetimes.json").read_text())
    assert second["dag"]["cached"] and "cached (" in capsys.readouterr().out
    assert second["params"] == first["params"] and second["lifetime"] == first["lifetime"]

    assert memory_main([*args, "--rebuild-dag"]) == 0
    assert not json.loads((out / "lifetimes.json").read_text())["dag"]["cached"]

    # a damaged cache file is rebuilt, not trusted
    Path(first["dag"]["path"]).write_text("{")
    assert memory_main(args) == 0
    assert not json.loads((out / "lifetimes.json").read_text())["dag"]["cached"]


def test_cli_config_error_exits_2(tmp_path, capsys):
    assert memory_main(["lifetimes", "--preset", "tiny", "--out", str(tmp_path),
                        "--set", "loongforge.overlap.bucket_size_mb=-1"]) == 2
    assert "error (invalid_config)" in capsys.readouterr().err
    assert not (tmp_path / "lifetimes.json").exists()


def test_the_tuner_writes_lifetimes_once_and_a_failure_is_one_line(study_spec_file, tmp_path, monkeypatch):
    """``measure.write_lifetimes`` with the writer the tune CLI hands the Tuner (``study_lifetimes``): the base
    config as the baseline measures it, into the study directory, once; a writer that raises costs one line."""
    from workbench.config import config_hash
    from types import SimpleNamespace

    from workbench.tune.measure import write_lifetimes
    from workbench.tune.study import load_study_spec

    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    spec = load_study_spec(str(study_spec_file("lt")))

    def session():  # what write_lifetimes reads of the study session: the spec, the study folder, a log
        lines: list[str] = []
        (tmp_path / "study").mkdir(exist_ok=True)
        return SimpleNamespace(spec=spec, study_dir=tmp_path / "study", log=lines.append, lines=lines)

    def boom(cfg, study_dir):
        raise RuntimeError("boom")

    c = session()
    write_lifetimes(c, boom)
    assert c.lines == ["gradient lifetimes: not written (RuntimeError: boom)"]
    assert not (c.study_dir / "lifetimes.json").exists()
    c = session()
    write_lifetimes(c, lt.study_lifetimes)
    doc = json.loads((c.study_dir / "lifetimes.json").read_text())
    assert doc["config_hash"] == config_hash(spec.measured_base_config()) and doc["model"] == "tiny"
    assert c.lines[0].startswith(f"gradient lifetimes: {c.study_dir / 'lifetimes.json'}; lifetime-aware plan")
    write_lifetimes(c, boom)  # written once per study: not called again
    assert len(c.lines) == 1
