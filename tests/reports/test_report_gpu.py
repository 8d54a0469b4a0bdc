"""The "GPU time" section: the winner's trace by kind of work, busy and idle, TFLOP/s against the peak and the top
kernels, from a CUDA trace fixture whose every figure is worked out by hand below, and from a CPU trace.

``add_gpu_trace`` also serves ``test_report_browser.py``: it gives the browser's fixture study a winner's trace.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from reports import build_report, compute_sections
from reports.sections.gpu import KIND_GROUPS, KINDS, device_time, device_waits, work_kind
from test_report_traces import CPU_EVENTS
from workbench.vocab import KERNEL_KINDS

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel"
GEMM2 = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
FLASH = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
       "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, MulFunctor>>"
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "FusedOptimizerTensorListMetadata<4>, FusedAdamMathFunctor<float, 4>>")
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COPY = "Memcpy HtoD (Pinned -> Device)"


def _ev(name, ts, dur, cat, corr=None, pid=1, tid=1):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def _step(n: int, t0: float, corr0: int, last: tuple[float, float]) -> list[dict]:
    """One 1000 us step on the host (its optimizer phase the last 200 us) and its work on the device."""
    host = [_ev(f"step {n}", t0, 1000, "user_annotation"), _ev("optimizer", t0 + 800, 200, "user_annotation")]
    work = [  # (name, cat, launched at, starts, lasts, stream)
        (COPY, "gpu_memcpy", 5, 10, 30, 7), (GEMM, "kernel", 10, 50, 300, 7), (FLASH, "kernel", 20, 350, 100, 7),
        (ADD, "kernel", 30, 450, 50, 7), (NCCL, "kernel", 600, 600, 100, 9), (GEMM2, "kernel", 610, 650, 100, 7),
        (MUL, "kernel", 810, 820, 80, 7), (ADAM, "kernel", 850, *last, 7)]
    for i, (name, cat, at, start, dur, stream) in enumerate(work):
        host.append(_ev("cudaLaunchKernel", t0 + at, 4, "cuda_runtime", corr=corr0 + i))
        host.append(_ev(name, t0 + start, dur, cat, corr=corr0 + i, pid=0, tid=stream))
    return host


CUDA_STEPS = [
    # a kernel launched before the profiled steps (the warm-up's) is no step's work
    _ev("cudaLaunchKernel", -50, 4, "cuda_runtime", corr=99), _ev(GEMM, -40, 30, "kernel", corr=99, pid=0, tid=7),
    *_step(3, 0, 1, last=(900, 60)),
    *_step(4, 1000, 101, last=(950, 150)),  # its update runs on 100 us after the host has left the step
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
]
"""Busy, by hand: step 3's work covers 10-40, 50-500, 600-750 (the all-reduce under GEMM2) and 820-960: 770 us;
step 4's the same but for its update, 1820-1900 and 1950-2100: 860 us. The span runs 0-2100 us: 1.05 ms a step."""


def add_gpu_trace(study_dir: Path, trial: int) -> Path:
    """Give a study a winner's CUDA trace (traces/winner/, with the trace run's metrics and summary) in tune.json's
    result.traces, and a measured run of the winner: what the tuner keeps after the validation."""
    run = study_dir / "traces" / "winner"
    run.mkdir(parents=True, exist_ok=True)
    (run / "trace.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": CUDA_STEPS}))
    # the profiled window: 400 GFLOP a step in 2 ms steps (200 TFLOP/s, profiler included)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 4, "steps": 2, "time/step_s": 0.002,
                                                   "flops/achieved_tflops_per_gpu": 200.0}) + "\n")
    (run / "summary.json").write_text(json.dumps({"peak_tflops": 989.0, "device": "cuda"}))
    trial_dir = study_dir / "trials" / str(trial)
    trial_dir.mkdir(parents=True, exist_ok=True)
    with (trial_dir / "metrics.jsonl").open("a") as f:  # a measured run: 266 TFLOP/s, no profiler
        f.write(json.dumps({"step": 40, "steps": 10, "time/step_s": 0.0015,
                            "flops/achieved_tflops_per_gpu": 266.0}) + "\n")
    tune_path = study_dir / "tune.json"
    tune = json.loads(tune_path.read_text()) if tune_path.exists() else {"study_name": study_dir.name}
    result = tune.setdefault("result", {})
    result["traces"] = {"steps": 2, "baseline": None,
                        "winner": {"trial": trial, "run_dir": str(run), "path": str(run / "trace.json"),
                                   "memory_snapshot": None, "status": "ok"}}
    tune_path.write_text(json.dumps(tune))
    return run / "trace.json"


def test_kernel_kinds_by_name():
    assert [work_kind(n) for n in (GEMM, GEMM2, FLASH, ADD, ADAM, NCCL)] == [
        "matmul", "matmul", "attention", "elementwise/norm", "optimizer", "communication"]
    assert work_kind(COPY, "gpu_memcpy") == work_kind("Memset (Device)", "gpu_memset") == "copy/cast/memset"
    assert work_kind(MUL, in_optimizer=True) == "optimizer" and work_kind(NCCL, in_optimizer=True) == "communication"
    # Inductor's fused kernels name the ops they fuse, a copy among them: elementwise, not a copy
    assert work_kind("triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_5") == "elementwise/norm"
    assert work_kind("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>") == "copy/cast/memset"
    assert work_kind("_rmsnorm_fwd_kernel") == work_kind("_swiglu_bwd_kernel") == "elementwise/norm"
    assert work_kind("_cast_transpose_kernel") == "copy/cast/memset" and work_kind("triton_tem_fused_mm_4") == "matmul"
    assert [work_kind(n) for n in ("aten::mm", "aten::addmm", "aten::_foreach_add_", "aten::fill_", "aten::mul",
                                   "aten::_scaled_dot_product_flash_attention_for_cpu", "MmBackward0",
                                   "aten::empty")] == [
        "matmul", "matmul", "optimizer", "copy/cast/memset", "elementwise/norm", "attention", "other", "other"]
    assert set(KIND_GROUPS.values()) == set(KINDS)
    assert set(KIND_GROUPS) == set(KERNEL_KINDS) - {"alloc", "idle", "padding"}  # every kind a kernel can be


def test_device_time_of_a_cuda_trace():
    dt = device_time(CUDA_STEPS)
    assert (dt.device, dt.steps, dt.step_ranges) == ("GPU", 2, 2)
    assert dt.span_ms == pytest.approx(1.05) and dt.busy_ms == pytest.approx((770 + 860) / 2 / 1e3)
    assert len(dt.work) == 16  # the warm-up's kernel left out
    by_kind = dt.work.groupby("kind")["ms"].sum()
    assert by_kind.to_dict() == pytest.approx({"matmul": 0.8, "attention": 0.2, "elementwise/norm": 0.1,
                                               "copy/cast/memset": 0.06, "communication": 0.2,
                                               "optimizer": 0.16 + 0.06 + 0.15})


def test_device_time_of_a_cpu_trace():
    """CPU_EVENTS (test_report_traces): two steps on the host, an op on the autograd thread, the update inside the
    optimizer range; busy is the union of the ops over the steps, 10-600, 610-990 and 1010-1210 us."""
    dt = device_time(CPU_EVENTS)
    assert (dt.device, dt.steps, dt.step_ranges) == ("CPU", 2, 2)
    assert dt.span_ms == pytest.approx(0.9) and dt.busy_ms == pytest.approx(1.17 / 2)
    by_kind = dt.work.groupby("kind")["ms"].sum()
    assert by_kind.to_dict() == pytest.approx({"matmul": 0.9, "copy/cast/memset": 0.1, "elementwise/norm": 0.1505,
                                               "optimizer": 0.38})
    with pytest.raises(ValueError, match="no kernel"):
        device_time([_ev("step 1", 0, 10, "user_annotation")])


def test_gpu_time_section_from_the_winners_trace(tmp_path):
    sdir = tmp_path / "s"
    sdir.mkdir()
    add_gpu_trace(sdir, trial=3)
    g = compute_sections(sdir).gpu
    assert g.message is None and (g.device, g.run, g.trial, g.steps) == ("GPU", "winner", 3, 2)
    assert g.trace == g.trace_href == "traces/winner/trace.json"
    k = g.by_kind.set_index("kind")
    assert list(k.index) == ["matmul", "attention", "elementwise/norm", "copy/cast/memset", "optimizer",
                             "communication"]
    assert k.loc["matmul", "ms_per_step"] == pytest.approx(0.4) and k.loc["matmul", "calls_per_step"] == 2
    assert k.loc["matmul", "share_pct"] == pytest.approx(100 * 800 / 1730)
    assert k.loc["matmul", "span_pct"] == pytest.approx(100 * 0.4 / 1.05)
    busy = g.busy.set_index("what")["ms_per_step"]
    assert busy.to_dict() == pytest.approx({"busy": 0.815, "idle": 0.235, "step span": 1.05})
    f = g.flops.set_index("metric")
    assert f.loc["model GFLOP per step, per GPU", "value"] == pytest.approx(400)
    assert f.loc["achieved TFLOP/s, measured runs", "value"] == pytest.approx(266)
    assert f.loc["achieved TFLOP/s, measured runs", "peak_pct"] == pytest.approx(100 * 266 / 989)  # the MFU
    assert f.loc["peak TFLOP/s", "value"] == 989
    assert f.loc["TFLOP/s over device-busy time", "value"] == pytest.approx(4e11 / 0.815e-3 / 1e12)
    assert f.loc["TFLOP/s over matmul + attention time", "value"] == pytest.approx(4e11 / 0.5e-3 / 1e12)
    assert f.loc["TFLOP/s over matmul + attention time", "peak_pct"] == pytest.approx(100 * 800 / 989)
    assert g.flops_message is None
    top = g.top
    assert top["name"].iloc[0] == GEMM and top["ms_per_step"].iloc[0] == pytest.approx(0.3)
    assert list(top.loc[top["name"] == MUL, "kind"]) == ["optimizer"]  # launched in the optimizer phase
    assert top["share_pct"].sum() == pytest.approx(100)
    raw = build_report(sdir).read_text()
    sec = raw.split('<section id="gpu">', 1)[1].split("</section>", 1)[0]
    assert '<h2>5. GPU time</h2>' in raw and 'data-title="GPU time by kind of work"' in sec
    assert '<a href="traces/winner/trace.json">traces/winner/trace.json</a>' in sec
    assert f'<div class="clip" title="{html.escape(ADD, quote=True)}">' in sec  # the full name in its title
    assert "Achieved TFLOP/s" in sec and "Busy and idle" in sec
    # its idle gaps of 50 us or more, by hand: 500-600, 750-820 in step 3; 960-1010, 1500-1600, 1750-1820,
    # 1900-1950 in step 4 (the 10 us ones are the device's own); launched under no op, so no op to name
    assert g.waits.to_dict("records") == [pytest.approx({"what": "idle gap", "where": "-", "count_per_step": 3,
                                                         "ms_per_step": 0.22})]
    assert "Where the GPU waits" in sec


def test_where_the_gpu_waits_names_the_ops_that_launched_late_and_the_syncs():
    """One step. A kernel launched inside a compiled region's FP8 cast starts 100 us after the work before it ended;
    an .item() on a tensor's truth value holds the host 210 us until the device is done, and the next kernel, from
    an aten::mm, starts 360 us after the device went idle."""
    events = [
        _ev("step 1", 0, 1000, "user_annotation"),
        _ev("Torch-Compiled Region: 0/0", 0, 400, "cpu_op"), _ev("wb_kernels::fp8_cast", 100, 20, "cpu_op"),
        _ev("cudaLaunchKernel", 5, 4, "cuda_runtime", corr=1), _ev(GEMM, 10, 190, "kernel", corr=1, pid=0, tid=7),
        _ev("cudaLaunchKernel", 110, 4, "cuda_runtime", corr=2), _ev(ADD, 300, 100, "kernel", corr=2, pid=0, tid=7),
        _ev("aten::is_nonzero", 450, 250, "cpu_op"), _ev("aten::_local_scalar_dense", 460, 230, "cpu_op"),
        _ev("cudaStreamSynchronize", 470, 210, "cuda_runtime"),
        _ev("aten::mm", 740, 20, "cpu_op"), _ev("cudaLaunchKernel", 750, 4, "cuda_runtime", corr=3),
        _ev(GEMM2, 760, 140, "kernel", corr=3, pid=0, tid=7),
    ]
    assert device_waits(events).to_dict("records") == [
        pytest.approx({"what": "idle gap", "where": "aten::mm", "count_per_step": 1, "ms_per_step": 0.36}),
        pytest.approx({"what": "host sync", "where": "cudaStreamSynchronize in aten::is_nonzero > "
                       "aten::_local_scalar_dense", "count_per_step": 1, "ms_per_step": 0.21}),
        pytest.approx({"what": "idle gap", "where": "Torch-Compiled Region: 0/0 > wb_kernels::fp8_cast",
                       "count_per_step": 1, "ms_per_step": 0.1})]
    assert device_waits([e for e in events if e["name"] != "step 1"]).empty  # no step ranges: nothing to say


def test_gpu_time_of_a_cpu_trace_says_there_is_no_gpu_and_no_peak(tmp_path):
    sdir = tmp_path / "s"
    add_gpu_trace(sdir, trial=1)
    (sdir / "traces" / "winner" / "trace.json").write_text(json.dumps({"traceEvents": CPU_EVENTS}))
    (sdir / "traces" / "winner" / "summary.json").write_text(json.dumps({"peak_tflops": None, "device": "cpu"}))
    g = compute_sections(sdir).gpu
    assert g.message is None and g.device == "CPU"
    assert g.by_kind["kind"].tolist() == ["matmul", "elementwise/norm", "copy/cast/memset", "optimizer"]
    assert g.flops_message == ("No peak FLOP/s to hold these against: a CPU has none in the peak table "
                               "(hardware.peak_tflops sets one), so no MFU.")
    f = g.flops.set_index("metric")
    assert "peak TFLOP/s" not in f.index and f["peak_pct"].isna().all()
    assert f.loc["TFLOP/s over in-op (CPU) time", "value"] == pytest.approx(4e11 / (1.17e-3 / 2) / 1e12)
    assert g.waits is None  # a CPU trace: no device to wait
    page = html.unescape(build_report(sdir).read_text())
    assert "No GPU: a CPU study" in page and 'data-title="CPU time by kind of work"' in page
    assert "Where the GPU waits" not in page


def test_without_a_trace_the_section_is_one_line(tmp_path):
    g = compute_sections(tmp_path).gpu
    assert g.message.startswith("No GPU time: no profiler traces: the study kept none")
    sdir = tmp_path / "s"
    add_gpu_trace(sdir, trial=1)
    (sdir / "traces" / "winner" / "trace.json").write_text(json.dumps({"traceEvents": []}))
    g = compute_sections(sdir).gpu
    assert g.message == ("No GPU time: the winner's trace could not be used (ValueError: the trace holds no "
                         "kernel, copy or set and no CPU op).")
    sec = build_report(sdir).read_text().split('<section id="gpu">', 1)[1].split("</section>", 1)[0]
    assert re.fullmatch(r'\s*<h2>5\. GPU time</h2>\s*<p class="missing">[^<]*</p>\s*', sec), sec
