"""A nanoGPT-style training loop of one's own, tuned by the workbench through its run API.

    python -m workbench.tune --study examples/plain_loop.yaml   # tune it
    python examples/plain_loop.py                               # run it alone, on the default config

The loop reads every knob from ``run.config``: the micro-batch (``data.micro_batch_size``, with gradient
accumulation holding ``training.global_batch_size``), ``torch.compile`` (``loongforge.compute_domain.compile``)
and its own ``user.attention`` (``manual`` or ``sdpa``). It times its phases with ``run.phase`` and reports each
optimizer step with ``run.step``; the tuner does the rest (isolation, watchdog, windows, A/B, report, export).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import workbench

VOCAB, DIM, LAYERS, HEADS = 512, 128, 2, 4


class Block(nn.Module):
    def __init__(self, attention: str) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.attention = attention

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, HEADS, DIM // HEADS).transpose(1, 2) for t in self.qkv(x).split(DIM, dim=2))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # nanoGPT's explicit masked softmax
            att = (q @ k.transpose(-2, -1)) * (k.size(-1) ** -0.5)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, seq_len: int, attention: str) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(seq_len, DIM)
        self.blocks = nn.ModuleList(Block(attention) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln(x)).flatten(0, 1), targets.flatten())


def main() -> None:
    with workbench.run() as run:
        cfg = run.config
        torch.manual_seed(cfg.training.seed)
        B, T, accum = cfg.data.micro_batch_size, cfg.data.seq_len, cfg.effective_grad_accum_steps()
        model = GPT(T, run.user.get("attention", "manual")).to(run.device)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.training.learning_rate,
                                weight_decay=cfg.training.weight_decay)
        mode = cfg.loongforge.compute_domain.compile
        loss_fn = model if mode == "none" else torch.compile(model, mode=mode)
        tokens = torch.randint(0, VOCAB, (100_000,), generator=torch.Generator().manual_seed(cfg.data.seed))
        tokens = tokens.to(run.device)
        g = torch.Generator().manual_seed(cfg.data.seed + 1)  # the same windows whatever the micro-batch
        for _ in range(run.max_steps):
            total = torch.zeros((), device=run.device)
            for _ in range(accum):
                with run.phase("data_wait"):
                    starts = torch.randint(0, len(tokens) - T - 1, (B,), generator=g)  # on the host
                    x = torch.stack([tokens[s:s + T] for s in starts.tolist()])
                    y = torch.stack([tokens[s + 1:s + T + 1] for s in starts.tolist()])
                with run.phase("forward"):
                    loss = loss_fn(x, y) / accum
                with run.phase("backward"):
                    loss.backward()
                total += loss.detach()
            with run.phase("optimizer"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
            run.step(tokens=B * T * accum, loss=total)
            if run.stop_requested:
                break


if __name__ == "__main__":
    main()
