"""A config's kernel launch parameters are checked on every machine (issue 42): the ``kernels`` package imports its
registry only, so a typo fails at load on a CPU box without Triton as it does on the GPU box; and the tuner's kernel
knobs are the registry's parameters, not a list restated by hand."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from kernels.registry import LAUNCH_SPACES
from workbench.tune.knobs import KNOBS


def test_a_misspelt_launch_parameter_fails_at_load_without_triton(tmp_path, subprocess_env):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("loongforge:\n  compute_domain:\n    kernels: {rmsnorm: {num_wraps: 4}}\n")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["triton"] = None  # a machine without Triton: importing it fails
        from workbench.config import ConfigError, load_config
        import kernels
        assert "torch" not in sys.modules, "importing the config and the kernels' registry imported torch"
        try:
            load_config({str(cfg)!r})
        except ConfigError as e:
            print(e)
            sys.exit(3)
        try:
            kernels.TRITON_OPS
        except ImportError:
            sys.exit(4)  # the kernels themselves need Triton, at their first use
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=subprocess_env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "loongforge.compute_domain.kernels.rmsnorm.num_wraps: is not a launch parameter" in proc.stdout
    assert "'num_warps'" in proc.stdout  # the did-you-mean


def test_every_launch_parameter_is_a_knob_and_no_other():
    kernel_knobs = {k.name: k for k in KNOBS if ".kernels." in k.key}
    expected = {f"{s.kernel}_{p.name}": (f"loongforge.compute_domain.kernels.{s.kernel}.{p.name}", p.doc)
                for s in LAUNCH_SPACES.values() for p in s.params}
    assert {n: (k.key, k.doc.split(" kernel: ", 1)[1]) for n, k in kernel_knobs.items()} == expected
    # the FP8 casts' parameters are searched while the Triton casts run, the others while their op is on Triton
    casts = {"fp8": "tensorwise", "fp8_cast": "triton"}
    for name, k in kernel_knobs.items():
        op = next(s.op for s in LAUNCH_SPACES.values() if name.startswith(s.kernel + "_"))
        if op == "fp8_linear":
            assert k.active(casts) and not k.active({"triton_fusion": True})
        else:
            assert k.active({f"{op}_backend": "triton"}) and not k.active(casts)
