"""run.prepare(model) on a tiny Hugging Face LlamaForCausalLM (issue 41): each patch keeps the loss and the gradients
of the unpatched model within tolerance (fp32; FP8 emulated by torchao on the CPU; the project's Triton ops, loss and
FP8 casts under the interpreter, in a process of their own), says what it did, and a model the patches do not know
is refused with one line naming its type and the knob. Liger-Kernel's kernels do not run under Triton's CPU
interpreter: its patch is measured on the GPU (benchmarks/); here a stand-in records what it was asked."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from workbench.config import ConfigError, merge_overrides, preset_config  # noqa: E402
from workbench.train.hf_prepare import prepare  # noqa: E402

CPU = torch.device("cpu")


def _model(layers: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
                                   num_hidden_layers=layers, vocab_size=256, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _cfg(**over):
    return merge_overrides(preset_config("tiny"), {"hardware.device": "cpu", **over})


def _loss_and_grads(model: torch.nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    model.train()
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _compare(over: dict, *, rel: float, lines: list[str], layers: int = 4) -> None:
    ref_loss, ref_grads = _loss_and_grads(_model(layers))
    model, applied = prepare(_model(layers), _cfg(**over), CPU)
    assert applied == lines
    loss, grads = _loss_and_grads(model)
    assert loss == pytest.approx(ref_loss, rel=rel)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        err = (g - ref_grads[name]).norm() / ref_grads[name].norm().clamp_min(1e-12)
        assert err < max(rel * 10, 1e-5), name


def test_nothing_asked_leaves_the_model_alone():
    model = _model()
    same, applied = prepare(model, _cfg(), CPU)
    assert same is model and applied == []


@pytest.mark.parametrize("over, lines", [
    ({"hf.attention": "eager"}, ["attention: eager"]),
    ({"training.activation_checkpointing": "full"}, ["activation checkpointing: 4 of 4 decoder layers"]),
    ({"training.activation_checkpointing": "selective", "training.activation_checkpointing_every": 2},
     ["activation checkpointing: 2 of 4 decoder layers"]),
])
def test_each_patch_keeps_the_loss_and_gradients(over, lines):
    _compare(over, rel=1e-5, lines=lines)


def test_selective_checkpointing_recomputes_the_layers_the_built_in_model_would():
    model, _ = prepare(_model(), _cfg(**{"training.activation_checkpointing": "selective",
                                         "training.activation_checkpointing_every": 2}), CPU)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [False, True, False, True]


def test_fp8_converts_the_decoder_linears_only():
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    over = {"loongforge.compute_domain.fp8": "tensorwise", "loongforge.compute_domain.fp8_modules.size_filter": False}
    _compare(over, rel=0.02, lines=["fp8 tensorwise (torchao): 28 decoder Linears"])  # 4 layers x 7 Linears
    model, _ = prepare(_model(), _cfg(**over), CPU)
    assert isinstance(model.model.layers[0].mlp.up_proj, Float8Linear)
    assert not isinstance(model.lm_head, Float8Linear)  # the head stays in the compute dtype


@pytest.mark.slow  # the compiled layer with every patch matches the same patches eager: the Liger test below
def test_compile_each_decoder_layer(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    _compare({"loongforge.compute_domain.compile": "default", "loongforge.compute_domain.compile_shapes": "static"},
             rel=1e-4, lines=["torch.compile (default): each of 1 decoder layers"], layers=1)


_INTERPRETED = textwrap.dedent("""
    import os
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is imported
    import json, sys, types, torch, transformers
    from workbench.config import merge_overrides, preset_config
    from workbench.train.hf_prepare import prepare

    def model(layers=2):
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=layers, vocab_size=256))

    def cfg(**over):
        return merge_overrides(preset_config("tiny"), {"hardware.device": "cpu", **over})

    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))  # 32 rows: FP8 wants 16k

    def run(m):
        m.train()
        out = m(input_ids=x, labels=x)
        out.loss.backward()
        return out, {n: p.grad for n, p in m.named_parameters()}

    def rel(a, b):
        return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()
""")


def _interpreted(script: str, env: dict[str, str]) -> dict:
    """Run ``script`` after :data:`_INTERPRETED`'s set-up in a process of its own (TRITON_INTERPRET=1 must be set
    before the kernels are imported); returns the JSON object it prints last."""
    r = subprocess.run([sys.executable, "-c", _INTERPRETED + textwrap.dedent(script)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_projects_triton_ops_replace_the_norms_and_mlps(subprocess_env):
    got = _interpreted("""
        ref_out, ref_grads = run(model())
        m, applied = prepare(model(), cfg(**{"loongforge.compute_domain.ops.rmsnorm": "triton",
                                             "loongforge.compute_domain.ops.swiglu": "triton"}), torch.device("cpu"))
        out, grads = run(m)
        print(json.dumps({"applied": applied, "loss": abs(out.loss.item() - ref_out.loss.item()) / ref_out.loss.item(),
                          "grad": rel(grads["model.layers.0.mlp.up_proj.weight"],
                                      ref_grads["model.layers.0.mlp.up_proj.weight"])}))
    """, subprocess_env)
    assert got["applied"] == ["rmsnorm: the project's Triton kernel in 5 modules",
                              "swiglu: the project's Triton kernel in 2 MLPs"]
    assert got["loss"] < 1e-5 and got["grad"] < 1e-4


def test_the_fused_residual_norm_keeps_the_loss_and_gradients(subprocess_env):
    """fused_residual_norm with the Triton RMSNorm: each layer's post-attention residual add runs inside the norm
    (rmsnorm_add). The same sums in the same order: loss and every gradient as with the unfused Triton ops, and
    within the interpreter's float error of HF's own model."""
    got = _interpreted("""
        ops = {"loongforge.compute_domain.ops.rmsnorm": "triton", "loongforge.compute_domain.ops.swiglu": "triton"}
        ref_out, ref_grads = run(model())
        uf_out, uf_grads = run(prepare(model(), cfg(**ops), torch.device("cpu"))[0])
        m, applied = prepare(model(), cfg(**ops, **{"loongforge.compute_domain.fused_residual_norm": True}),
                             torch.device("cpu"))
        out, grads = run(m)
        print(json.dumps({"applied": applied, "patched": ["forward" in vars(layer) for layer in m.model.layers],
                          "loss_vs_unfused": abs(out.loss.item() - uf_out.loss.item()),
                          "loss_vs_hf": abs(out.loss.item() - ref_out.loss.item()) / ref_out.loss.item(),
                          "grads_vs_unfused": max(rel(grads[n], uf_grads[n]) for n in uf_grads),
                          "grads_vs_hf": max(rel(grads[n], ref_grads[n]) for n in ref_grads),
                          "all_grads": sorted(grads) == sorted(ref_grads)}))
    """, subprocess_env)
    assert got["applied"] == ["rmsnorm: the project's Triton kernel in 5 modules",
                              "fused_residual_norm: the post-attention residual add inside the norm in 2 decoder "
                              "layers", "swiglu: the project's Triton kernel in 2 MLPs"]
    assert got["patched"] == [True, True] and got["all_grads"]
    assert got["loss_vs_unfused"] < 1e-6 and got["grads_vs_unfused"] < 1e-5, got
    assert got["loss_vs_hf"] < 1e-5 and got["grads_vs_hf"] < 1e-4, got


def test_the_fused_residual_norm_is_refused_for_a_layer_it_does_not_know():
    """A decoder layer whose forward returns a tuple (older transformers) is not the layer the fused forward
    replaces: refused naming the key, before anything is patched."""
    class TupleLayer(transformers.models.llama.modeling_llama.LlamaDecoderLayer):
        def forward(self, hidden_states, **kwargs) -> tuple:
            return (super().forward(hidden_states, **kwargs),)

    model = _model(2)
    model.model.layers[1].__class__ = TupleLayer
    over = {**_OPS, "loongforge.compute_domain.fused_residual_norm": True}
    with pytest.raises(ConfigError, match=r"^loongforge\.compute_domain\.fused_residual_norm: got true, but "
                                          r"TupleLayer is not a pre-norm decoder layer .* returns tuple\)"):
        prepare(model, _cfg(**over), CPU)
    assert not any("forward" in vars(m) for m in model.modules())


def test_fp8_cast_triton_puts_the_projects_casts_in_the_decoder_linears(subprocess_env):
    """fp8_cast: triton makes every selected decoder Linear an Fp8Linear (the head stays a plain Linear). Its casts
    are torchao's bit for bit and its matmuls the same _scaled_mm calls (tests/kernels/test_fp8_linear.py), so the
    logits and every gradient equal torchao's exactly; against the unpatched fp32 model they carry FP8's error,
    bounded as for torchao (test_fp8_converts_the_decoder_linears_only) and above fp32 rounding, so FP8 ran."""
    got = _interpreted("""
        fp8 = {"loongforge.compute_domain.fp8": "tensorwise",
               "loongforge.compute_domain.fp8_modules.size_filter": False}
        cpu = torch.device("cpu")
        ref_out, ref_grads = run(model())
        ao_out, ao_grads = run(prepare(model(), cfg(**fp8), cpu)[0])
        m, applied = prepare(model(), cfg(**fp8, **{"loongforge.compute_domain.fp8_cast": "triton"}), cpu)
        linears = {n: type(mod).__name__ for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
        out, grads = run(m)
        print(json.dumps({
            "applied": applied, "linears": linears,
            "same_logits_as_torchao": torch.equal(out.logits, ao_out.logits),
            "grads_unlike_torchao": sorted(n for n in grads if not torch.equal(grads[n], ao_grads[n])),
            "loss": abs(out.loss.item() - ref_out.loss.item()) / ref_out.loss.item(),
            "logits": rel(out.logits, ref_out.logits),
            "grads": {n: rel(g, ref_grads[n]) for n, g in grads.items()}}))
    """, subprocess_env)
    assert got["applied"] == ["fp8 tensorwise (the project's Triton casts): 14 decoder Linears"]  # 2 layers x 7
    assert got["linears"].pop("lm_head") == "Linear"
    assert len(got["linears"]) == 14 and set(got["linears"].values()) == {"Fp8Linear"}
    assert got["same_logits_as_torchao"] and got["grads_unlike_torchao"] == []
    assert got["loss"] < 0.02
    assert 1e-3 < got["logits"] < 0.2  # FP8's error (about 0.04 here), far above fp32's rounding
    assert got["grads"].keys() and all(err < 0.2 for err in got["grads"].values()), got["grads"]


def test_the_projects_ops_casts_and_fused_norm_go_with_ligers_fused_loss_under_compile(subprocess_env, tmp_path):
    """The export's levers on an HF layer compiled apart, with Liger (the campaign's pad_ligerfp8t_ops_16 plus the
    fused residual norm) on the CPU. Under compile Liger patches only its fused loss, so the project's Triton
    RMSNorm and SwiGLU replace the modules, the post-attention norm takes the residual, and the FP8 Linears are the
    project's; the layer, compiled apart in one graph, keeps them all (no FP8 fallback line; the kernels'
    launchers counted in one step) and computes what the same patches compute eagerly (compared with the
    unpatched model in the tests above). Liger is a stand-in recording what it was asked: its kernels need a GPU,
    so its own loss is not computed here (the GPU test below and benchmarks/ measure it)."""
    env = {**subprocess_env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    got = _interpreted("""
        import kernels.fp8_cast, kernels.rmsnorm, kernels.swiglu

        asked, launched, with_residual = [], {"rmsnorm": 0, "swiglu": 0, "fp8_cast": 0}, []
        liger = types.ModuleType("liger_kernel.transformers")
        liger.apply_liger_kernel_to_llama = lambda **kw: asked.append({k: v for k, v in kw.items() if k != "model"})
        sys.modules["liger_kernel"], sys.modules["liger_kernel.transformers"] = types.ModuleType("liger_kernel"), liger

        def counted(name, module, attr):
            fn = getattr(module, attr)

            def call(*args, **kwargs):
                launched[name] += 1
                if name == "rmsnorm":
                    with_residual.append(args[1] is not None)  # _rmsnorm_fwd(x, residual, ...)
                return fn(*args, **kwargs)
            setattr(module, attr, call)

        counted("rmsnorm", kernels.rmsnorm, "_rmsnorm_fwd")
        counted("swiglu", kernels.swiglu, "_swiglu_fwd")
        counted("fp8_cast", kernels.fp8_cast, "_fp8_cast_transpose")
        over = {"loongforge.compute_domain.ops.rmsnorm": "triton", "loongforge.compute_domain.ops.swiglu": "triton",
                "loongforge.compute_domain.fp8": "tensorwise", "loongforge.compute_domain.fp8_cast": "triton",
                "loongforge.compute_domain.fp8_modules.size_filter": False,
                "loongforge.compute_domain.fused_residual_norm": True}
        eager_out, eager_grads = run(prepare(model(1), cfg(**over), torch.device("cpu"))[0])
        eager_launched, eager_residual = dict(launched), list(with_residual)
        launched.update(dict.fromkeys(launched, 0))
        with_residual.clear()
        m, applied = prepare(model(1), cfg(**over, **{"hf.liger": True, "loongforge.compute_domain.compile": "default",
                                                     "loongforge.compute_domain.compile_shapes": "static"}),
                             torch.device("cpu"))
        out, grads = run(m)
        print(json.dumps({"applied": applied, "asked": asked, "eager": eager_launched, "launched": launched,
                          "eager_residual": eager_residual, "residual": with_residual,
                          "linears": sorted({type(mod).__name__ for mod in m.model.layers.modules()
                                             if isinstance(mod, torch.nn.Linear)}),
                          "logits": rel(out.logits, eager_out.logits),
                          "grad": max(rel(g, eager_grads[n]) for n, g in grads.items())}))
    """, env)
    assert got["applied"] == [
        "rmsnorm: the project's Triton kernel in 3 modules",
        "fused_residual_norm: the post-attention residual add inside the norm in 1 decoder layers",
        "swiglu: the project's Triton kernel in 1 MLPs",
        "liger: fused_linear_cross_entropy (llama; the compiled layers' rmsnorm and swiglu are the project's Triton "
        "kernels, the rest Inductor's)",
        "fp8 tensorwise (the project's Triton casts): 7 decoder Linears",
        "torch.compile (default): each of 1 decoder layers"]  # and no "fp8: decoder layer 0 breaks" line
    assert got["asked"] == [{"rope": False, "swiglu": False, "rms_norm": False, "cross_entropy": False,
                             "fused_linear_cross_entropy": True}]
    assert got["linears"] == ["Fp8Linear"]
    # one step: 2 norms in the layer + the final one; 1 MLP; eagerly 7 Linears x (input, weight; output gradient)
    assert got["eager"] == {"rmsnorm": 3, "swiglu": 1, "fp8_cast": 21}
    # compiled, the casts of an input shared by q/k/v and by gate/up are one each (the same pure op on the same
    # tensor, deduplicated in the graph): 3 fewer, as the built-in model's shared-input cast
    assert got["launched"] == {"rmsnorm": 3, "swiglu": 1, "fp8_cast": 18}
    # the layer's input norm, its post-attention norm with the residual, the final norm; compiled the same
    assert got["eager_residual"] == got["residual"] == [False, True, False]
    assert got["logits"] < 1e-5 and got["grad"] < 1e-4  # Inductor's fusions reorder fp32 sums, no more


_OPS = {"loongforge.compute_domain.ops.rmsnorm": "triton", "loongforge.compute_domain.ops.swiglu": "triton"}
_FP8 = {"loongforge.compute_domain.fp8": "tensorwise", "loongforge.compute_domain.fp8_modules.size_filter": False}


_LOSS = textwrap.dedent("""
    import inspect

    cpu = torch.device("cpu")
    fp8 = {"loongforge.compute_domain.fp8": "tensorwise", "loongforge.compute_domain.fp8_modules.size_filter": False}
    over = {"triton": {"loongforge.compute_domain.ops.loss": "triton"},
            "fp8": {**fp8, "loongforge.compute_domain.fp8_head": True}}[BACKEND]
    # what the patched model is compared with: HF's head and loss on the same decoder (FP8's too for the head)
    same_decoder = {"triton": {}, "fp8": fp8}[BACKEND]
    labels = x.clone()
    labels[0, :5] = -100  # a prompt that does not count
    labels[1, 9] = -100   # and one token in the middle
    n_items = (labels[:, 1:] != -100).sum() * 2  # the Trainer's count over two accumulated micro-batches
    names = ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"]

    def step(m, **kw):
        m.train()
        out = m(input_ids=x, labels=labels, **kw)
        out.loss.backward()
        return out, {n: p.grad for n, p in m.named_parameters()}

    def errors(a, b):
        (out, grads), (ref_out, ref_grads) = a, b
        return {"loss": abs(out.loss.item() - ref_out.loss.item()) / ref_out.loss.item(),
                "grads": {n: rel(grads[n], ref_grads[n]) for n in names},
                "all_grads": max(rel(g, ref_grads[n]) for n, g in grads.items()),
                "same_grads": sorted(ref_grads) == sorted(n for n, g in grads.items() if g is not None)}

    m, applied = prepare(model(), cfg(**over), cpu)
    got = {"applied": applied,
           "signature": str(inspect.signature(m.forward)) == str(inspect.signature(model().forward))}
    patched = step(m)
    got["logits"] = patched[0].logits is None
    got["mean"] = errors(patched, step(model()))
    got["mean_same_decoder"] = errors(patched, step(prepare(model(), cfg(**same_decoder), cpu)[0]))
    got["sum"] = errors(step(prepare(model(), cfg(**over), cpu)[0], num_items_in_batch=n_items),
                        step(model(), num_items_in_batch=n_items))
    m.zero_grad()
    got["tuple"] = type(m(input_ids=x, labels=labels, return_dict=False)[0]).__name__
    with torch.no_grad():  # HF's forward, logits and all: without labels, and in evaluation
        ref = prepare(model(), cfg(**same_decoder), cpu)[0] if same_decoder else model()
        got["no_labels"] = torch.equal(m(input_ids=x).logits, ref(input_ids=x).logits)
        m.eval()
        ref.eval()
        ev, ref_ev = m(input_ids=x, labels=labels), ref(input_ids=x, labels=labels)
        got["eval"] = torch.equal(ev.logits, ref_ev.logits) and ev.loss.item() == ref_ev.loss.item()
    whole = prepare(model(1), cfg(**over, **{"loongforge.compute_domain.compile": "default",
                                            "loongforge.compute_domain.compile_scope": "model"}), cpu)
    got["whole"] = whole[1][-1]
    got["compiled_apart"] = whole[0].model._compiled_call_impl is not None and whole[0]._compiled_call_impl is None
    print(json.dumps(got))
""")


@pytest.mark.parametrize("backend", ["triton", "fp8"])
def test_the_projects_loss_replaces_hfs_head_and_loss(subprocess_env, backend):
    """ops.loss: triton and fp8_head: true run the head and the loss through the project's loss op on the final
    hidden states and lm_head.weight, in place of HF's lm_head + cross-entropy. The loss and the gradients of the
    embedding, a decoder weight and the head keep the unpatched model's, with labels -100 where a prompt or a token
    does not count, both reductions (HF's mean; the sum over the Trainer's num_items_in_batch); the logits are never
    made. Without labels or in evaluation the forward is HF's (its logits bit for bit). Tolerances: the Triton
    loss, fp32 sums in another order (gradients about 5e-7 here); the FP8 head as FP8 on the decoder's Linears
    (test_fp8_converts_the_decoder_linears_only: loss 2 %, gradients 20 %; about 0.07 % and 5-14 % here), and the
    head's gradient away from that of the same FP8 decoder with HF's head (about 3 %: FP8 ran in the head)."""
    got = _interpreted(f"BACKEND = {backend!r}\n" + _LOSS, subprocess_env)
    line = {"triton": "loss: the project's fused linear cross-entropy (triton)",
            "fp8": "loss: the project's linear cross-entropy, the LM head's matmuls in FP8 (fp8 head)"}[backend]
    fp8 = ["fp8 tensorwise (torchao): 14 decoder Linears"] if backend == "fp8" else []
    assert got["applied"] == [*fp8, line]
    assert got["signature"]  # the Trainer reads it: its batch columns, and num_items_in_batch through **kwargs
    assert got["logits"] and got["tuple"] == "Tensor"  # return_dict=False: (loss,), no logits
    assert got["no_labels"] and got["eval"]
    assert got["whole"] == "torch.compile (default): the whole decoder (the head and the project's loss apart)"
    assert got["compiled_apart"]
    for reduction in ("mean", "sum"):
        err = got[reduction]
        assert err["same_grads"], reduction
        if backend == "triton":
            assert err["loss"] < 1e-5 and err["all_grads"] < 1e-4, (reduction, err)
        else:
            assert err["loss"] < 0.02 and err["all_grads"] < 0.2, (reduction, err)
    if backend == "fp8":
        head = got["mean_same_decoder"]
        assert 1e-3 < head["grads"]["lm_head.weight"] < 0.2 and head["loss"] < 0.02, head


_COMPILED = {"loongforge.compute_domain.compile": "default"}


@pytest.mark.parametrize("over, match", [
    ({"loongforge.compute_domain.ops.rope": "triton"}, r"^loongforge\.compute_domain\.ops\.rope: got 'triton'.*"
                                                       r"hf\.liger: true"),
    # eagerly Liger patches RMSNorm and SwiGLU too: the same modules twice (under compile, see the test above)
    ({"hf.liger": True, **_OPS}, r"^hf\.liger: got true .*compile: none.*same modules"),
    # the FP8 head is the tensorwise recipe's (rowwise: the config itself refuses it, below)
    ({"loongforge.compute_domain.fp8_head": True}, r"^loongforge\.compute_domain\.fp8_head: got true with fp8: "
                                                   r"'none'; .*set fp8: tensorwise or fp8_head: false"),
    # Liger's fused loss and the project's are two losses for one head, compiled or not
    ({"hf.liger": True, "loongforge.compute_domain.ops.loss": "triton"},
     r"^hf\.liger: got true with the project's loss \(ops\.loss: triton\): .*two losses"),
    ({"hf.liger": True, "loongforge.compute_domain.ops.loss": "triton", **_COMPILED, **_OPS},
     r"^hf\.liger: got true with the project's loss \(ops\.loss: triton\)"),
    ({"hf.liger": True, **_FP8, "loongforge.compute_domain.fp8_head": True, **_COMPILED},
     r"^hf\.liger: got true with the project's loss \(fp8_head: true\)"),
    # per layer, a mode that captures CUDA graphs: the layers' replays write over what the next layer saved
    ({"loongforge.compute_domain.compile": "reduce-overhead"},
     r"^loongforge\.compute_domain\.compile: got 'reduce-overhead' with compile_scope: layer: .*CUDA graph"),
    ({"loongforge.compute_domain.compile": "max-autotune"}, r"^loongforge\.compute_domain\.compile: got "
                                                            r"'max-autotune' with compile_scope: layer"),
])
def test_what_a_hugging_face_model_cannot_take_is_refused_naming_the_key(over, match):
    model = _model()
    with pytest.raises(ConfigError, match=match):
        prepare(model, _cfg(**over), CPU)
    assert "forward" not in vars(model)  # the forward is not patched before a refusal


def test_the_fp8_head_under_a_rowwise_recipe_is_refused_by_the_config():
    with pytest.raises(ConfigError, match=r"fp8_head: got true with fp8: 'rowwise'.*set fp8: tensorwise"):
        _cfg(**{"loongforge.compute_domain.fp8": "rowwise", "loongforge.compute_domain.fp8_head": True})


def test_the_projects_loss_on_the_cpu_without_the_interpreter(subprocess_env):
    """Without TRITON_INTERPRET (a process of its own) the Triton loss cannot run on the CPU: the model keeps HF's
    loss and the run says so, as the project's Triton RMSNorm and SwiGLU do; the FP8 head's casts are refused
    naming fp8_head (workbench.train.fp8)."""
    env = {k: v for k, v in subprocess_env.items() if k != "TRITON_INTERPRET"}
    script = textwrap.dedent("""
        import json, torch, transformers
        from workbench.config import ConfigError, merge_overrides, preset_config
        from workbench.train.hf_prepare import prepare

        def model():
            return transformers.LlamaForCausalLM(transformers.LlamaConfig(
                hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
                num_hidden_layers=1, vocab_size=256))

        def cfg(**over):
            return merge_overrides(preset_config("tiny"), {"hardware.device": "cpu", **over})

        m, applied = prepare(model(), cfg(**{"loongforge.compute_domain.ops.loss": "triton"}), torch.device("cpu"))
        try:
            prepare(model(), cfg(**{"loongforge.compute_domain.fp8": "tensorwise",
                                    "loongforge.compute_domain.fp8_modules.size_filter": False,
                                    "loongforge.compute_domain.fp8_head": True}), torch.device("cpu"))
            refused = None
        except ConfigError as e:
            refused = str(e)
        print(json.dumps({"applied": applied, "patched": "forward" in vars(m), "refused": refused}))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["applied"] == [] and not got["patched"]
    assert "the Triton loss requested on the CPU: the model keeps HF's loss" in r.stderr
    assert got["refused"].startswith("loongforge.compute_domain.fp8_head: got true, but the Triton casts run on CUDA")


def test_fp8_cast_triton_without_the_interpreter_is_refused_on_the_cpu(subprocess_env):
    """Without TRITON_INTERPRET (a process of its own: this one may have imported the kernels under it) the casts
    cannot run on the CPU, and the refusal names fp8_cast."""
    env = {k: v for k, v in subprocess_env.items() if k != "TRITON_INTERPRET"}
    script = textwrap.dedent("""
        import torch, transformers
        from workbench.config import ConfigError, merge_overrides, preset_config
        from workbench.train.hf_prepare import prepare

        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=1, vocab_size=256))
        cfg = merge_overrides(preset_config("tiny"), {
            "hardware.device": "cpu", "loongforge.compute_domain.fp8": "tensorwise",
            "loongforge.compute_domain.fp8_cast": "triton", "loongforge.compute_domain.fp8_modules.size_filter": False})
        try:
            prepare(model, cfg, torch.device("cpu"))
        except ConfigError as e:
            print(e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith(
        "loongforge.compute_domain.fp8_cast: got 'triton', but the Triton casts run on CUDA")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger-Kernel's Triton kernels need a GPU (they do not run "
                                                          "under the CPU interpreter)")
def test_liger_keeps_the_loss_and_gradients_on_a_gpu():
    pytest.importorskip("liger_kernel")
    gpu = torch.device("cuda")

    def loss_and_grads(model):
        model.train()
        x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1)).to(gpu)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_loss, ref_grads = loss_and_grads(_model().to(gpu))
    model, applied = prepare(_model().to(gpu), merge_overrides(_cfg(), {"hardware.device": "cuda",
                                                                         "hf.liger": True}), gpu)
    assert applied == ["liger: rms_norm, swiglu, rope, fused_linear_cross_entropy (llama)"]
    loss, grads = loss_and_grads(model)
    assert loss == pytest.approx(ref_loss, rel=1e-4)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        assert (g - ref_grads[name]).norm() / ref_grads[name].norm().clamp_min(1e-12) < 1e-3, name


@pytest.mark.parametrize("over, kwargs, lines", [
    ({}, {"rope": True, "swiglu": True, "rms_norm": True},
     ["liger: rms_norm, swiglu, rope, fused_linear_cross_entropy (llama)"]),
    ({"loongforge.compute_domain.compile": "default"}, {"rope": False, "swiglu": False, "rms_norm": False},
     ["liger: fused_linear_cross_entropy (llama; the compiled layers' norms, SwiGLU and RoPE are Inductor's)",
      "torch.compile (default): each of 4 decoder layers"]),
    ({"loongforge.compute_domain.compile": "default", "loongforge.compute_domain.compile_scope": "model"},
     {"rope": False, "swiglu": False, "rms_norm": False},
     ["liger: fused_linear_cross_entropy (llama; the compiled layers' norms, SwiGLU and RoPE are Inductor's)",
      "torch.compile (default): the whole decoder (the head and Liger's fused loss apart)"]),
])
def test_liger_under_compile_keeps_its_kernels_out_of_the_compiled_code(monkeypatch, over, kwargs, lines):
    """Dynamo cannot trace Liger's kernels (torch 2.11 asserts on its RMSNorm inside a compiled layer, measured on
    the H200): under compile only its fused loss is patched, and the compiled code leaves it out. Liger itself is a
    stand-in here that records what it was asked (its kernels need a GPU)."""
    import types

    asked = []
    fake = types.ModuleType("liger_kernel.transformers")
    fake.apply_liger_kernel_to_llama = lambda **kw: asked.append(kw)
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    model, applied = prepare(_model(), _cfg(**{"hf.liger": True, **over}), CPU)
    assert applied == lines
    assert asked == [{"model": model, "cross_entropy": False, "fused_linear_cross_entropy": True, **kwargs}]
    if over.get("loongforge.compute_domain.compile_scope") == "model":
        assert model.model._compiled_call_impl is not None and model._compiled_call_impl is None


def test_pad_vocab_pads_the_embedding_and_head_and_keeps_the_loss_close():
    """GPT-2's 50,257 rows put the LM head's GEMMs on unaligned kernels (the H200 profile, benchmarks/README.md);
    padding adds rows that are never a label: the loss moves by their share of the softmax, no more."""
    def model(vocab: int = 250) -> torch.nn.Module:
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            vocab_size=vocab, max_position_embeddings=64))

    x = torch.randint(0, 250, (2, 32), generator=torch.Generator().manual_seed(1))
    ref = model()(input_ids=x, labels=x).loss.item()
    padded, applied = prepare(model(), _cfg(**{"hf.pad_vocab_multiple": 64}), CPU)
    assert applied == ["vocabulary padded: 250 -> 256 rows (a multiple of 64)"]
    assert padded.get_input_embeddings().weight.shape[0] == padded.lm_head.weight.shape[0] == 256
    assert padded.config.vocab_size == 256
    loss = padded(input_ids=x, labels=x).loss
    assert loss.item() == pytest.approx(ref, rel=0.01) and loss.item() != ref
    loss.backward()
    assert padded.lm_head.weight.grad[250:].abs().sum() > 0  # the new rows learn to stay unlikely
    same, applied = prepare(model(256), _cfg(**{"hf.pad_vocab_multiple": 64}), CPU)
    assert applied == [] and same.lm_head.weight.shape[0] == 256  # already a multiple: nothing to do


def test_a_compiled_fp8_layer_that_breaks_stays_in_the_compute_dtype_and_says_so(tmp_path, monkeypatch, aot_eager):
    """Per-layer compile of FP8 layers asks for one graph each; a layer Dynamo would break (here: a graph break put
    into layer 1's MLP) keeps its Linears in the compute dtype, on the same parameters, and the run says so. The
    break is Dynamo's: the backend is aot_eager (inductor's CPU build of the same layers: the Liger test above)."""
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    over = {"loongforge.compute_domain.fp8": "tensorwise", "loongforge.compute_domain.fp8_modules.size_filter": False,
            "loongforge.compute_domain.compile": "default", "loongforge.compute_domain.compile_shapes": "static"}
    model, applied = prepare(_model(2), _cfg(**over), CPU)
    mlp = model.model.layers[1].mlp
    weights = [p for p in model.model.layers[1].parameters()]
    forward = mlp.forward

    def breaking(x):
        torch._dynamo.graph_break()
        return forward(x)

    mlp.forward = breaking
    ref_loss, _ = _loss_and_grads(_model(2))
    loss, grads = _loss_and_grads(model)
    assert loss == pytest.approx(ref_loss, rel=0.02)
    assert isinstance(model.model.layers[0].mlp.up_proj, Float8Linear)  # the layer in one graph keeps FP8
    assert not any(isinstance(m, Float8Linear) for m in model.model.layers[1].modules())
    assert [p for p in model.model.layers[1].parameters()] == weights  # the optimizer's tensors, unchanged
    assert all(w.grad is not None for w in weights)
    assert applied[-1].startswith("fp8: decoder layer 1 breaks under torch.compile (")
    assert applied[-1].endswith("its 7 Linears stay in the compute dtype")


def test_a_layer_that_breaks_gives_back_the_projects_fp8_linears_too():
    """The fallback above for fp8_cast: triton: each Fp8Linear of the layer becomes an nn.Linear again on the same
    parameter objects (the class swap fp8._use_triton_casts made, undone); the kernels need not run for that."""
    from workbench.train.fp8_linear import Fp8Linear
    from workbench.train.hf_prepare import _unconvert_fp8

    layer = _model(1).model.layers[0]
    weights = list(layer.parameters())
    for m in layer.modules():
        if type(m) is torch.nn.Linear:
            m.__class__ = Fp8Linear
    assert _unconvert_fp8(layer) == 7
    assert not any(isinstance(m, Fp8Linear) for m in layer.modules())
    assert sum(type(m) is torch.nn.Linear for m in layer.modules()) == 7
    assert list(layer.parameters()) == weights


def test_padding_free_and_padded_batches_give_the_same_loss():
    """data.packing for an HF run of documents: fill lays them end to end (no padding, position ids restarting,
    attention kept within each: transformers' block mask), bucket pads each to the bucket above the longest; the
    model sees the same (context, target) pairs either way, so the loss agrees."""
    from workbench.train.hf_prepare import collator

    g = torch.Generator().manual_seed(3)
    docs = [{"input_ids": torch.randint(0, 256, (n,), generator=g).tolist()} for n in (7, 12, 5)]
    fill = collator(_cfg(**{"data.packing": "fill"}))(docs)
    bucket = collator(_cfg(**{"data.packing": "bucket", "data.bucket_width": 8, "data.seq_len": 64}))(docs)
    assert fill["input_ids"].shape == (1, 24) and "attention_mask" not in fill and fill["use_cache"] is False
    assert fill["position_ids"].tolist() == [list(range(7)) + list(range(12)) + list(range(5))]
    assert bucket["input_ids"].shape == (3, 16) and bucket["attention_mask"].sum() == 24
    assert (bucket["labels"] == -100).sum() == 3 * 16 - 24
    model = _model(2).train()  # a training forward: HF's models make a KV cache there too, unless told not to
    with torch.no_grad():
        packed = model(**fill).loss.item()
        padded = model(**bucket).loss.item()
        alone = [model(input_ids=torch.tensor([d["input_ids"]]), labels=torch.tensor([d["input_ids"]])).loss.item()
                 for d in docs]
    assert packed == pytest.approx(padded, rel=1e-5)
    assert packed == pytest.approx(sum(a * (len(d["input_ids"]) - 1) for a, d in zip(alone, docs)) / 21, rel=1e-5)


@pytest.fixture
def mask_builders(monkeypatch):
    """transformers' Llama mask builders and packed-sequence check, restored after the test (prepare patches the
    builders once a process); returns the list of batch sizes the check saw."""
    from transformers import masking_utils
    from transformers.models.llama import modeling_llama

    for name in ("create_causal_mask", "create_sliding_window_causal_mask"):
        if hasattr(modeling_llama, name):
            monkeypatch.setattr(modeling_llama, name, getattr(modeling_llama, name))
    checked: list[int] = []
    check = masking_utils.find_packed_sequence_indices

    def counted(position_ids):
        checked.append(position_ids.shape[0])
        return check(position_ids)
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", counted)
    return checked


def test_the_packed_check_is_skipped_where_the_model_numbers_the_tokens_itself(mask_builders):
    """hf.packed_check: false. transformers checks a forward's position ids for packed sequences with an .all()
    (a wait for the device every micro-batch on a GPU); a forward given neither an attention mask nor position ids
    is numbered by the model itself, so the check is skipped there: the same loss and gradients, no check. A
    padding-free batch, which brings its own position ids, is still checked and gives the same loss."""
    from workbench.train.hf_prepare import collator

    def loss_and_grads(model):  # a training forward without a KV cache, as the Trainer's (with one, no check)
        model.train()
        x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_loss, ref_grads = loss_and_grads(_model(2))
    assert mask_builders == [2]  # unpatched: one check a forward
    mask_builders.clear()
    model, applied = prepare(_model(2), _cfg(**{"hf.packed_check": False}), CPU)
    assert applied == ["packed check: skipped in LlamaModel's forwards given no attention mask or position ids "
                       "(create_causal_mask)"]
    loss, grads = loss_and_grads(model)
    assert mask_builders == [] and loss == ref_loss
    assert grads.keys() == ref_grads.keys() and all(torch.equal(g, ref_grads[n]) for n, g in grads.items())
    g = torch.Generator().manual_seed(3)
    docs = [{"input_ids": torch.randint(0, 256, (n,), generator=g).tolist()} for n in (7, 12, 5)]
    fill = collator(_cfg(**{"data.packing": "fill"}))(docs)
    with torch.no_grad():
        packed = model(**fill).loss.item()
        assert mask_builders == [1]  # its own position ids: checked, and found packed
        assert packed == pytest.approx(_model(2).train()(**fill).loss.item(), rel=1e-6)
    prepare(_model(2), _cfg(**{"hf.packed_check": False}), CPU)  # a second model: the builders patched once
    from transformers.models.llama import modeling_llama
    assert not getattr(modeling_llama.create_causal_mask.__wrapped__, "_workbench_unchecked", False)


def test_the_packed_check_is_kept_where_transformers_has_no_mask_builder_to_patch(mask_builders, monkeypatch):
    from transformers.models.llama import modeling_llama

    monkeypatch.delattr(modeling_llama, "create_causal_mask")
    model = _model(2)
    with pytest.raises(ConfigError, match=r"^hf\.packed_check: got false, but transformers\.models\.llama\."
                                          r"modeling_llama builds its masks without .*create_causal_mask"):
        prepare(model, _cfg(**{"hf.packed_check": False, "hf.pad_vocab_multiple": 64}), CPU)
    assert model.get_input_embeddings().weight.shape[0] == 256  # nothing patched before the refusal
