"""benchmarks/kernels_bench.py's plumbing on the CPU: the smoke run on the interpreter, the end-to-end variants, their
isolation and pairing."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from _kernel_testing import DEVICE

import kernels
from kernels import registry

ROOT = Path(__file__).resolve().parents[2]


def _kernels_bench():
    """benchmarks/kernels_bench.py, imported once as the module ``kernels_bench`` (it is a script, not a package
    module); it puts benchmarks/ on sys.path for its helper modules."""
    if "kernels_bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("kernels_bench", ROOT / "benchmarks" / "kernels_bench.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["kernels_bench"] = module
        spec.loader.exec_module(module)
    return sys.modules["kernels_bench"]


def _kbench(name: str):
    """The benchmark's helper module benchmarks/_kbench_<name>.py (setup, cases, e2e, summary), where the names
    the tests patch are looked up."""
    _kernels_bench()
    return importlib.import_module(f"_kbench_{name}")


def _one_block_e2e(monkeypatch, setup) -> None:
    """The in-process end-to-end step on the tiny preset cut to one block (its dims, every op of a block, a quarter
    of the Triton interpreter's work): the tests check the benchmark's plumbing, not a deep model. A worker process
    (--e2e-isolation process) looks its preset up by name, so the test of those keeps "tiny"."""
    from workbench.train import model

    monkeypatch.setitem(model.PRESETS, "tiny-1block", dataclasses.replace(model.TINY, num_hidden_layers=1))
    monkeypatch.setattr(setup, "E2E_PRESET", "tiny-1block")


def test_bench_needs_cuda_and_says_so(capsys):
    bench = _kernels_bench()

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the benchmark would run")
    assert bench.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_compiled_references_backward_expects_gradients_laid_out_like_its_outputs():
    import torch._functorch.config as aot_config

    before = aot_config.guess_tangent_strides_as_outputs
    aot_config.guess_tangent_strides_as_outputs = False  # torch 2.11's default: contiguous gradients
    try:
        with _kbench("cases")._tangents_like_outputs():
            assert aot_config.guess_tangent_strides_as_outputs is True
        assert aot_config.guess_tangent_strides_as_outputs is False  # restored
    finally:
        aot_config.guess_tangent_strides_as_outputs = before


def test_bench_smoke_run_on_the_interpreter(tmp_path, monkeypatch):
    """The whole benchmark at toy shapes with a fake timer: rows, best launch, summary, report sweep file."""
    import json

    import pandas as pd

    bench = _kernels_bench()
    setup = _kbench("setup")
    bench_e2e = _kbench("e2e")

    def fake_do_bench(fn, quick):
        fn()
        fn()  # do_bench runs fn many times: the fused loss's backward cannot run twice on one graph
        return 1.0, 0.9, 1.1

    monkeypatch.setattr(setup, "do_bench", fake_do_bench)
    # each kernel's default launch and one step of its sweep: under the interpreter every launch runs in Python
    ofat = _kbench("cases")._ofat
    monkeypatch.setattr(_kbench("cases"), "_ofat", lambda *a: ofat(*a)[:2])
    # the tiny preset's dims, so the launch parameters picked at these shapes fit its end-to-end step too
    monkeypatch.setattr(setup, "MODELS", {"toy": dict(hidden=128, ffn=384, heads=4, kv_heads=2, vocab=4096)})
    monkeypatch.setattr(setup, "MAIN_MODEL", "toy")
    _one_block_e2e(monkeypatch, setup)
    monkeypatch.setattr(setup, "BATCH", 1)
    monkeypatch.setattr(setup, "SEQ", 6)
    monkeypatch.setattr(setup, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # inductor is not what this test is about
    args = bench._parser().parse_args(["--quick", "--e2e", "--e2e-profile", "--out", str(tmp_path),
                                       "--providers", "triton,torch",
                                       "--kernel-sweep", str(tmp_path / "study" / "kernel_sweep.csv")])
    assert bench.run(args, DEVICE) == 0
    df = pd.read_csv(tmp_path / "kernels_bench.csv")
    assert list(df.columns) == setup.CSV_COLUMNS
    op_kernels = set(registry.KERNEL_OF_OP.values())  # the FP8 casts have a benchmark of their own
    assert {p for k in op_kernels for p in registry.get_space(k).param_names()} <= set(setup.CSV_COLUMNS)
    kern = df[df["kernel"].isin(list(registry.LAUNCH_SPACES))]
    assert set(kern["kernel"]) == op_kernels and not kern["error"].notna().any()
    assert set(kern["mode"]) == {"fwd", "bwd", "full"} and set(kern["provider"]) == {"triton", "torch"}
    # the same-size copy moves the op's bytes: under the fake timer (1 ms for everything) the op is at 100% of it
    sized = kern[kern["mode"].isin(["fwd", "bwd"]) & (kern["kernel"] != "fused_linear_ce")]
    assert sized["pct_of_size_copy"].to_numpy() == pytest.approx(100, rel=0.02)
    assert kern[kern["mode"] == "full"]["pct_of_size_copy"].isna().all()
    derived = kern[kern["note"].notna()]
    assert set(derived["kernel"]) == {"fused_linear_ce"} and set(derived["mode"]) == {"bwd"}
    assert set(derived["provider"]) == {"triton"} and (derived["median_ms"] > 0).all()
    assert (df["provider"].str.endswith(("_eager", "_compile")) == (df["kernel"] == "e2e_step")).all()
    e2e = df[df["kernel"] == "e2e_step"].set_index("provider")
    assert e2e.loc["triton_ops_eager", "loss"] == pytest.approx(e2e.loc["torch_ops_eager", "loss"], rel=1e-2)
    best = json.loads((tmp_path / "best_launch.json").read_text())["loongforge.compute_domain.kernels"]
    assert set(best) == op_kernels
    kernels.configure(best)  # what the benchmark recommends is a valid config
    summary = (tmp_path / "summary.md").read_text()
    assert "| rmsnorm | toy 1x6x128 | fwd |" in summary and "end to end" in summary
    sweep = pd.read_csv(tmp_path / "study" / "kernel_sweep.csv")
    assert {"kernel", "num_warps", "median_ms"} <= set(sweep.columns) and set(sweep["mode"]) == {"full"}
    # --e2e-profile: per variant, the ops by self time per step (kernels on CUDA), shares of the profiled time
    prof = pd.read_csv(tmp_path / "e2e_profile.csv")
    assert set(prof["provider"]) == set(e2e.index) and {"gpu", "torch", "timestamp"} <= set(prof.columns)
    for provider, g in prof.groupby("provider"):
        assert list(g["rank"]) == list(range(1, len(g) + 1)) and len(g) <= bench_e2e.PROFILE_TOP
        assert (g["self_ms_per_step"].diff().dropna() <= 0).all() and (g["self_ms_per_step"] > 0).all()
        assert 0 < g["share"].sum() <= 1 + 1e-9
    names = " ".join(prof[prof["provider"] == "torch_ops_eager"]["name"])
    assert "aten::mm" in names or "aten::addmm" in names or "aten::linear" in names  # the matmuls are seen


def test_bench_e2e_keeps_the_variants_measured_before_one_fails(tmp_path, monkeypatch):
    """A variant that raises (on the GPU: a compile error, an illegal access) becomes an error row; the variants
    measured before it keep their numbers, the ones after it are marked not run, and the summary says FAIL."""
    import pandas as pd

    bench = _kernels_bench()
    setup = _kbench("setup")

    def broken_compile(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("boom in the compiled step")
        return run

    _one_block_e2e(monkeypatch, setup)
    monkeypatch.setattr(setup, "BATCH", 1)
    monkeypatch.setattr(setup, "SEQ", 6)
    monkeypatch.setattr(setup, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(setup, "do_bench", lambda fn, quick: (fn(), 1.0, 0.9, 1.1)[1:])
    monkeypatch.setattr(torch, "compile", broken_compile)
    args = bench._parser().parse_args(["--quick", "--e2e", "--kernels", "none", "--out", str(tmp_path)])
    assert bench.run(args, DEVICE) == 0
    e2e = pd.read_csv(tmp_path / "kernels_bench.csv").query("kernel == 'e2e_step'").set_index("provider")
    assert list(e2e.index) == ["torch_ops_eager", "triton_ops_eager", "torch_ops_compile", "triton_ops_compile"]
    for ok in ("torch_ops_eager", "triton_ops_eager"):
        assert e2e.loc[ok, "median_ms"] > 0 and pd.isna(e2e.loc[ok, "error"])
    assert "boom in the compiled step" in e2e.loc["torch_ops_compile", "error"]
    assert pd.isna(e2e.loc["torch_ops_compile", "median_ms"])
    assert e2e.loc["triton_ops_compile", "error"].startswith("not run")
    summary = (tmp_path / "summary.md").read_text()
    assert "FAIL end to end compile: not measured (RuntimeError: boom in the compiled step)" in summary
    assert "end to end eager: triton ops" in summary  # the eager pair is still compared


def test_bench_e2e_pairs_interleaved_rounds_with_the_torch_ops(tmp_path, monkeypatch):
    """--e2e-rounds in one process: per round, the torch ops' median step over the other variant's (note column),
    and every timed step with its round in e2e_steps.csv."""
    import pandas as pd

    bench = _kernels_bench()
    setup = _kbench("setup")

    _one_block_e2e(monkeypatch, setup)
    monkeypatch.setattr(setup, "BATCH", 1)
    monkeypatch.setattr(setup, "SEQ", 6)
    monkeypatch.setattr(setup, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(setup, "do_bench", lambda fn, quick: (fn(), 1.0, 0.9, 1.1)[1:])
    # rounds run torch's 4 timed steps, then triton's: 10 ms against 8, except round 2 (11: slower there)
    scripted = iter([10.0] * 4 + [8.0] * 4 + [10.0] * 4 + [8.0] * 4 + [10.0] * 4 + [11.0] * 4)
    monkeypatch.setattr(setup._Device, "time_ms", lambda self, fn: (fn(), next(scripted)))
    args = bench._parser().parse_args(["--quick", "--e2e", "--kernels", "none", "--out", str(tmp_path),
                                       "--e2e-isolation", "none", "--e2e-rounds", "3",
                                       "--e2e-variants", "torch:eager,triton:eager"])
    assert bench.run(args, DEVICE) == 0
    e2e = pd.read_csv(tmp_path / "kernels_bench.csv").query("kernel == 'e2e_step'").set_index("provider")
    assert e2e.loc["triton_ops_eager", "note"] == (
        "paired over 3 rounds: torch ops' step / this step, per round: median 1.2500, min 0.9091, max 1.2500; "
        "faster in 2 of 3")
    assert pd.isna(e2e.loc["torch_ops_eager", "note"])
    steps = pd.read_csv(tmp_path / "e2e_steps.csv")
    assert len(steps) == 24 and list(steps.groupby("provider")["round"].nunique()) == [3, 3]
    per_round = steps.groupby(["provider", "round"])["ms"].median().unstack()
    assert per_round.loc["triton_ops_eager"].tolist() == [8.0, 8.0, 11.0]


def test_bench_e2e_one_process_per_variant(tmp_path, monkeypatch):
    """--e2e-isolation process: each variant runs in a worker process of its own (python benchmarks/kernels_bench.py
    --e2e-worker) whose rows come back to the parent; losses agree across the isolated processes (same seed)."""
    import pandas as pd

    bench = _kernels_bench()
    setup = _kbench("setup")
    bench_e2e = _kbench("e2e")

    monkeypatch.setattr(setup, "E2E_PRESET", "tiny")
    monkeypatch.setattr(setup, "BATCH", 1)
    monkeypatch.setattr(setup, "SEQ", 6)
    monkeypatch.setattr(setup, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(setup, "do_bench", lambda fn, quick: (fn(), 1.0, 0.9, 1.1)[1:])
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the workers run the Triton ops on the CPU too
    args = bench._parser().parse_args(["--quick", "--e2e", "--kernels", "none", "--out", str(tmp_path),
                                       "--e2e-isolation", "process", "--e2e-variants", "torch:eager,triton:eager"])
    assert bench.run(args, DEVICE) == 0
    e2e = pd.read_csv(tmp_path / "kernels_bench.csv").query("kernel == 'e2e_step'").set_index("provider")
    assert list(e2e.index) == ["torch_ops_eager", "triton_ops_eager"]
    assert (e2e["median_ms"] > 0).all() and e2e["error"].isna().all() and (e2e["gpu"] == "cpu").all()
    assert e2e.loc["triton_ops_eager", "loss"] == pytest.approx(e2e.loc["torch_ops_eager", "loss"], rel=1e-3)
    with pytest.raises(SystemExit, match="not one of"):
        bench_e2e._variants(bench._parser().parse_args(["--e2e-variants", "triton:turbo"]))


def test_bench_e2e_variants_include_the_fused_residual_add_on_request():
    import argparse

    bench_e2e = _kbench("e2e")

    assert bench_e2e._variants(argparse.Namespace(e2e_variants=None)) == bench_e2e.E2E_VARIANTS  # not by default
    got = bench_e2e._variants(argparse.Namespace(e2e_variants="triton:compile,triton_fused:compile"))
    assert got == [("triton", "compile"), ("triton_fused", "compile")]
    assert bench_e2e._e2e_row("triton_fused", "compile", {"rmsnorm": {"num_warps": 8}}, {})["sweep"] == "best"
    with pytest.raises(SystemExit, match="'fused' needs the Triton rmsnorm"):
        bench_e2e._variants(argparse.Namespace(e2e_variants="fused:eager"))


def test_bench_e2e_mixes_run_triton_for_the_named_ops_only():
    import argparse

    bench_e2e = _kbench("e2e")
    from workbench.train.ops import OP_NAMES, resolve

    got = bench_e2e._variants(argparse.Namespace(e2e_variants="rmsnorm+loss:compile,rmsnorm+fused+rope:eager"))
    assert got == [("rmsnorm+loss", "compile"), ("rmsnorm+fused+rope", "eager")]
    assert bench_e2e._e2e_ops("rmsnorm+loss") == ({"rmsnorm": "triton", "loss": "triton"}, False)
    assert bench_e2e._e2e_ops("rmsnorm+fused+rope") == ({"rmsnorm": "triton", "rope": "triton"}, True)
    assert bench_e2e._e2e_ops("triton") == ({op: "triton" for op in OP_NAMES}, False)
    assert bench_e2e._e2e_ops("torch") == ({}, False)
    chosen = resolve(*bench_e2e._e2e_ops("rmsnorm+loss")[:1]).backends
    assert chosen == {"rmsnorm": "triton", "swiglu": "torch", "rope": "torch", "loss": "triton"}
    assert bench_e2e._e2e_row("rmsnorm+loss", "compile", {}, {})["provider"] == "rmsnorm+loss_ops_compile"
    with pytest.raises(SystemExit, match=r"\['swigloo'\] not in"):
        bench_e2e._variants(argparse.Namespace(e2e_variants="rmsnorm+swigloo:eager"))
    with pytest.raises(SystemExit, match="mode 'turbo' is not one of eager, compile, graphs"):
        bench_e2e._variants(argparse.Namespace(e2e_variants="rope:turbo"))
