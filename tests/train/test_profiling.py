"""The torch.profiler trace of ``--profile N`` (workbench.train.profiling): a Chrome trace of N steps after the
warm-up with every phase and every step as a named range, named by the run summary; a CUDA memory snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

from workbench.config import Config, merge_overrides, preset_config
from workbench.errors import ConfigError
from workbench.train.profiling import (StepProfiler, kernel_kind, kernel_shares, launch_overhead,
                                       memory_history_conflict)
from workbench.train.timing import PhaseTimer

NAMED_PHASES = ("data_wait", "h2d", "forward", "backward", "grad_sync", "optimizer")
"""The phases that are ranges of the step ('other' is the rest of the step, after the last phase)."""

SMALL = ["--set", "data.seq_len=256", "--set", "data.micro_batch_size=2", "--set", "training.global_batch_size=2",
         "--set", "training.warmup_measure_steps=2", "--set", "training.log_every=3", "--set", "hardware.device=cpu",
         "--set", "training.dtype=fp32"]


def _ranges(trace: dict) -> Counter:
    return Counter(e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation")


def test_profile_flag_writes_a_trace_of_the_steps_after_warmup(tmp_path, subprocess_env):
    out = tmp_path / "prof"
    env = {**subprocess_env, "LOONGFORGE_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--preset", "tiny", "--synthetic", "--profile", "2",
                        "--steps", "6", *SMALL, "--out", str(out), "--summary", str(out / "summary.json"), "-q"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    trace = json.loads((out / "trace.json").read_text())
    ranges = _ranges(trace)
    # each phase once per profiled step, as a record_function range named after it
    for p in NAMED_PHASES:
        assert ranges[p] == 2, (p, ranges)
    steps = {n: c for n, c in ranges.items() if n.startswith("step ")}
    assert steps == {"step 3": 1, "step 4": 1}  # exactly the 2 steps after the 2 warm-up steps
    assert any(e.get("cat") == "cpu_op" and e["name"].startswith("aten::") for e in trace["traceEvents"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["profile/trace_path"] == str(out / "trace.json")
    assert summary["profile/steps"] == 2 and summary["profile/first_step"] == 3
    assert summary["profile/memory_snapshot_path"] is None  # CPU: no allocator history
    assert summary["measured_steps"] == 4  # the profile's end closes a window; every measured step still counts
    assert not (out / "memory_snapshot.pickle").exists()


def test_a_profile_after_the_measurement_leaves_the_summary_as_it_was(tmp_path, monkeypatch):
    """metrics.profile_after_measure: the 2 profiled steps run after the 8 of the measured run, and the summary,
    the windows and the measured steps' rows are those of the same run without them."""
    from workbench.train import synthetic_data_dir
    from workbench.train.trainer import Trainer

    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    data = synthetic_data_dir(vocab_size=4096, seq_len=256, num_docs=300, seed=0)
    over = {"hardware.device": "cpu", "data.seq_len": 256, "data.micro_batch_size": 2, "data.num_workers": 0,
            "training.global_batch_size": 2, "training.dtype": "fp32", "training.max_steps": 8,
            "training.warmup_measure_steps": 2, "training.log_every": 3}
    runs = {}
    fold = {"metrics.profile_steps": 2, "metrics.profile_after_measure": True}
    for name, extra in (("plain", {}), ("profiled", fold)):
        trainer = Trainer(merge_overrides(preset_config("tiny"), {**over, **extra}), data_dir=data,
                          out_dir=tmp_path / name)
        try:
            runs[name] = trainer.run()
        finally:
            trainer.close()
    plain, prof, out = runs["plain"], runs["profiled"], tmp_path / "profiled"
    # the trace: exactly the two steps after the measured 8, each with its phases
    ranges = _ranges(json.loads((out / "trace.json").read_text()))
    assert {n: c for n, c in ranges.items() if n.startswith("step ")} == {"step 9": 1, "step 10": 1}
    assert ranges["forward"] == 2 and ranges["optimizer"] == 2
    assert prof["profile/steps"] == 2 and prof["profile/first_step"] == 9
    assert prof["profile/trace_path"] == str(out / "trace.json") and prof["profile/memory_snapshot_path"] is None
    # the summary: the measured run's, step for step (the same seed and data: the same losses); the data
    # pipeline's counters stop where the measurement did
    assert set(prof) - set(plain) == {k for k in prof if k.startswith("profile/")}
    for k in ("steps", "measured_steps", "windows", "first_loss", "last_loss", "data/batches", "interrupted"):
        assert prof[k] == plain[k], k
    assert (prof["steps"], prof["measured_steps"], prof["windows"]) == (8, 6, 2)
    windows = {n: [json.loads(x) for x in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
               for n in runs}
    assert [(w["step"], w["steps"], w["loss"]) for w in windows["profiled"]] == \
        [(w["step"], w["steps"], w["loss"]) for w in windows["plain"]] == \
        [(5, 3, windows["plain"][0]["loss"]), (8, 3, plain["last_loss"])]
    # phases.csv: the profiled steps are rows of their own, unmeasured
    rows = {n: pd.read_csv(tmp_path / n / "phases.csv") for n in runs}
    assert rows["profiled"]["step"].tolist() == list(range(1, 11))
    assert rows["profiled"]["measured"].tolist() == [0, 0] + [1] * 6 + [0, 0]
    assert rows["profiled"]["loss"].iloc[:8].tolist() == rows["plain"]["loss"].tolist()


def test_a_profiled_step_that_fails_after_the_measurement_leaves_it_standing(tmp_path, monkeypatch):
    """One rank: a step profiled after the measurement that raises (torch 2.11's SystemError under the allocator's
    history, pytorch#179536) ends the run with the measurement's summary, no trace and ``profile/error``; no
    checkpoint is written of the broken step. A failure before the measurement ended still fails the run."""
    from workbench.train import synthetic_data_dir
    from workbench.train.trainer import Trainer

    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    data = synthetic_data_dir(vocab_size=4096, seq_len=256, num_docs=300, seed=0)
    over = {"hardware.device": "cpu", "data.seq_len": 256, "data.micro_batch_size": 2, "data.num_workers": 0,
            "training.global_batch_size": 2, "training.dtype": "fp32", "training.max_steps": 6,
            "training.warmup_measure_steps": 2, "training.log_every": 2, "metrics.profile_steps": 2,
            "metrics.profile_after_measure": True}
    step = Trainer.train_step
    fail_at = {"step": 0}

    def failing(self):
        if self.step + 1 == fail_at["step"]:
            raise SystemError("<built-in method apply of FunctionMeta object> returned NULL without setting an "
                              "exception")
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", failing)
    runs = {}
    for name, at in (("plain", 0), ("broken", 8)):  # step 8: the second of the 2 profiled after the 6 measured
        fail_at["step"] = at
        cfg = merge_overrides(preset_config("tiny"), {**over, "training.checkpoint_dir": str(tmp_path / name / "ck")})
        trainer = Trainer(cfg, data_dir=data, out_dir=tmp_path / name)
        try:
            runs[name] = trainer.run()
        finally:
            trainer.close()
    plain, broken, out = runs["plain"], runs["broken"], tmp_path / "broken"
    assert broken["profile/error"].startswith("SystemError: <built-in method apply") and "profile/error" not in plain
    assert not (out / "trace.json").exists() and broken["profile/trace_path"] is None
    assert broken["profile/steps"] == 1 and plain["profile/steps"] == 2  # step 7 was profiled whole; 8 broke
    for k in ("steps", "measured_steps", "windows", "first_loss", "last_loss", "interrupted"):
        assert broken[k] == plain[k], k
    assert (broken["steps"], broken["measured_steps"], broken["windows"]) == (6, 4, 2)
    assert broken["interrupted"] is False
    # the run that went to its end wrote its checkpoint at step 8; the broken one none
    assert torch.load(tmp_path / "plain" / "ck" / "latest.pt", weights_only=True)["step"] == 8
    assert not (out / "ck" / "latest.pt").exists()
    # a failure inside the measurement is the run's failure
    fail_at["step"] = 4
    trainer = Trainer(merge_overrides(preset_config("tiny"), over), data_dir=data, out_dir=tmp_path / "early")
    try:
        with pytest.raises(SystemError):
            trainer.run()
    finally:
        trainer.close()


def test_no_allocator_history_where_it_breaks_a_checkpointed_compiled_backward():
    """pytorch#179536: from torch 2.11, checkpointed blocks that recompute compiled code fail their backward while
    the allocator's history records; such a profile is written without the memory snapshot, and says why."""
    base = preset_config("gr00t-n1.6")
    both = merge_overrides(base, {"training.activation_checkpointing": "selective",
                                  "loongforge.compute_domain.compile": "default"})
    assert "pytorch/pytorch#179536" in memory_history_conflict(both, "2.11.0+cu130")
    assert memory_history_conflict(both, "2.13.0") is not None
    assert memory_history_conflict(both, "2.10.1+cu128") is None
    assert memory_history_conflict(merge_overrides(both, {"training.activation_checkpointing": "none"}), "2.11.0") \
        is None
    assert memory_history_conflict(merge_overrides(both, {"loongforge.compute_domain.compile": "none"}), "2.11.0") \
        is None
    # the profiler takes the reason on CUDA, where it records the history; the summary carries it
    why = memory_history_conflict(both, "2.11.0")
    cuda = StepProfiler(1, start_after=0, out_dir=Path("/nonexistent"), device=torch.device("cuda"),
                        no_memory_history=why)
    assert cuda.summary()["profile/no_memory_snapshot"] == why
    cpu = StepProfiler(1, start_after=0, out_dir=Path("/nonexistent"), device=torch.device("cpu"), no_memory_history=why)
    assert "profile/no_memory_snapshot" not in cpu.summary()  # the CPU records no history anyway


def test_profile_after_measure_is_checked_where_it_is_set():
    with pytest.raises(ConfigError) as e:
        merge_overrides(Config(), {"metrics.profile_after_measure": True})  # nothing to profile
    assert e.value.key == "metrics.profile_after_measure" and "profile_steps" in str(e.value)
    with pytest.raises(ConfigError) as e:
        merge_overrides(Config(), {"metrics.profile_steps": 2, "metrics.profile_after_measure": "yes"})
    assert e.value.key == "metrics.profile_after_measure"
    assert merge_overrides(Config(), {"metrics.profile_steps": 2, "metrics.profile_after_measure": True}) \
        .metrics.profile_after_measure is True


def test_phase_ranges_only_while_profiling():
    """record_function ranges are opened only while the profiler records (no cost otherwise)."""
    timer = PhaseTimer("cpu", nvtx=False)
    timer.start()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with timer.phase("forward"):
            torch.ones(4).sum()
        timer.record = True
        with timer.phase("backward"):
            torch.ones(4).sum()
        timer.record = False
        timer.step_end()
    names = {e.name for e in prof.events()}
    assert "backward" in names and "forward" not in names
    assert len(timer.flush()) == 1


def test_a_profile_without_an_out_dir_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        StepProfiler(2, start_after=1, out_dir=None, device=torch.device("cpu"))
    assert e.value.key == "metrics.profile_steps"
    assert StepProfiler(0, start_after=1, out_dir=None, device=torch.device("cpu")).summary() == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the memory snapshot records the CUDA allocator")
def test_cuda_profile_writes_a_memory_snapshot(tmp_path):
    import pickle

    dev = torch.device("cuda")
    prof = StepProfiler(1, start_after=0, out_dir=tmp_path, device=dev)
    prof.before_step(1)
    with prof.step_range(1):
        (torch.randn(256, 256, device=dev) @ torch.randn(256, 256, device=dev)).sum().item()
    prof.after_step(1)
    prof.stop()
    s = prof.summary()
    assert s["profile/steps"] == 1 and s["profile/memory_snapshot_path"] == str(tmp_path / "memory_snapshot.pickle")
    snap = pickle.loads((tmp_path / "memory_snapshot.pickle").read_bytes())
    assert "segments" in snap and "device_traces" in snap
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    assert s["profile/launch_calls_per_step"] >= 1 and s["profile/device_busy_ms_per_step"] > 0


def _x(cat: str, name: str, ts: float, dur: float, corr: int | None = None) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def test_launch_overhead_counts_launches_and_device_idle_per_step():
    events = [
        _x("user_annotation", "step 3", 0, 100), _x("user_annotation", "step 4", 100, 100),
        # step 3: two launches; their kernels overlap on two streams over [10, 40] and [30, 50] -> busy 40
        _x("cuda_runtime", "cudaLaunchKernel", 5, 4, corr=1), _x("cuda_runtime", "cudaLaunchKernel", 25, 4, corr=2),
        _x("kernel", "k1", 10, 30, corr=1), _x("kernel", "k2", 30, 20, corr=2),
        # step 4: a graph launch whose kernels run on after the host range ends (to 260), and a copy
        _x("cuda_runtime", "cudaGraphLaunch", 105, 60, corr=3), _x("cuda_driver", "cuLaunchKernelEx", 170, 2, corr=4),
        _x("kernel", "graph k1", 150, 50, corr=3), _x("kernel", "graph k2", 210, 50, corr=3),
        _x("gpu_memcpy", "Memcpy HtoD", 172, 10, corr=4),
        _x("cuda_runtime", "cudaEventSynchronize", 180, 20),  # not a launch
        # before the steps: launched outside them, though it runs inside the span; and uncorrelated work outside
        _x("cuda_runtime", "cudaLaunchKernel", -60, 4, corr=9), _x("kernel", "earlier", 0, 5, corr=9),
        _x("kernel", "no correlation, before", -50, 10),
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 60},
    ]
    r = launch_overhead(events, 2)
    assert r["launch_calls_per_step"] == 2.0  # the 4 launches in the steps; the sync and the earlier launch not
    assert r["launch_call_ms_per_step"] == pytest.approx((4 + 4 + 60 + 2) / 2 / 1e3)
    assert r["step_span_ms"] == pytest.approx(260 / 2 / 1e3)  # to the end of the graph's last kernel
    busy = 40 + 50 + 50  # [10, 50], [150, 200] with the copy inside it, [210, 260]
    assert r["device_busy_ms_per_step"] == pytest.approx(busy / 2 / 1e3)
    assert r["device_idle_ms_per_step"] == pytest.approx((260 - busy) / 2 / 1e3)
    # without correlation ids, device work counts when it starts within the steps' host ranges
    plain = [{k: v for k, v in e.items() if k != "args"} for e in events if e.get("name") != "earlier"]
    p = launch_overhead(plain, 2)
    assert p["device_busy_ms_per_step"] == pytest.approx((40 + 50) / 2 / 1e3)
    assert p["step_span_ms"] == pytest.approx(200 / 2 / 1e3)
    with pytest.raises(ValueError, match="step <n>"):
        launch_overhead([_x("kernel", "k", 0, 1)], 1)


# kernels of gr00t-n1.6's step on one H200 as torch.profiler named them (benchmarks/results/profile.csv, runs Q,
# R and fp8head), one of each kind a knob acts on
H200_KERNELS = {
    "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN": "matmul",
    "nvjet_sm90_qqtst_256x128_128x4_1x2_h_bz_coopA_TNT": "matmul",  # FP8
    "void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_bf16_128x64_64x6_nt_align8>(cutlass_80": "matmul",
    "triton_mm_102": "matmul",  # inductor's max-autotune GEMM
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0":
        "attention",
    "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*": "attention",
    "triton_poi_fused__scaled_mm__to_copy_clamp_mul_reciprocal_t_view_4": "cast",  # the cast feeding _scaled_mm
    "triton_red_fused_abs_max_view_5": "cast",
    "_amax_kernel": "cast",
    "triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_7": "norm",
    "triton_per_fused__to_copy_add_div_expand_mul_pow_sum_view_10": "norm",  # RMSNorm's backward
    "_rmsnorm_bwd_kernel": "norm",
    "triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_6": "activation",
    "_swiglu_fwd_kernel": "activation",
    "triton_poi_fused__to_copy_add_cat_clone_index_mul_neg_slice_transpose_unsqueeze_9": "rope",
    "_rope_bwd_kernel": "rope",
    "triton_red_fused__log_softmax__to_copy_prepare_softmax_online_slice_11": "loss",
    "_ce_fwd_kernel": "loss",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOpti":
        "optimizer",
    "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, {lambda":
        "elementwise",
    "triton_poi_fused__to_copy_view_4": "elementwise",  # inductor's dtype copy, fused: not a copy kernel
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)":
        "copy",
    "Memset (Device)": "copy",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "communication",
    "MmBackward0": "other",
}


def test_kernel_kind_sorts_the_kernels_of_a_measured_step():
    assert {n: kernel_kind(n) for n in H200_KERNELS} == H200_KERNELS


def test_kernel_shares_split_the_busy_time_by_kind_and_add_the_idle():
    events = [
        _x("user_annotation", "step 1", 0, 100),
        _x("cuda_runtime", "cudaLaunchKernel", 1, 2, corr=1), _x("cuda_runtime", "cudaLaunchKernel", 3, 2, corr=2),
        _x("cuda_runtime", "cudaLaunchKernel", 5, 2, corr=3),
        # a GEMM [10, 50], attention [50, 70] and a norm on another stream [60, 80]: busy 70 of 100
        _x("kernel", "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", 10, 40, corr=1),
        _x("kernel", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 50, 20, corr=2),
        _x("kernel", "_rmsnorm_fwd_kernel", 60, 20, corr=3),
        _x("gpu_user_annotation", "Optimizer.step#AdamW.step", 10, 70),  # a range on the device track, not work
    ]
    shares = kernel_shares(events)
    # 80 of kernel time over 70 busy: each kind's time is scaled by 70 / 80
    assert shares["matmul"] == pytest.approx(40 / 80 * 0.7) and shares["attention"] == pytest.approx(20 / 80 * 0.7)
    assert shares["norm"] == pytest.approx(20 / 80 * 0.7) and shares["idle"] == pytest.approx(0.3)
    assert sum(shares.values()) == pytest.approx(1.0) and shares["optimizer"] == 0.0
    # a cudaFree at [75, 90] (the device runs the norm until 80) and a cudaMalloc before the step: the device
    # waited 10 on the allocator, and the idle is what is left
    shares = kernel_shares([*events, _x("cuda_runtime", "cudaFree", 75, 15), _x("cuda_runtime", "cudaMalloc", -9, 5)])
    assert shares["alloc"] == pytest.approx(0.1) and shares["idle"] == pytest.approx(0.2)
    assert shares["matmul"] == pytest.approx(40 / 80 * 0.7) and sum(shares.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="step <n>"):
        kernel_shares([_x("kernel", "k", 0, 1)])
