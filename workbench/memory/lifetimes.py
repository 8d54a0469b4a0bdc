"""Gradient lifetimes: when one backward produces each parameter's gradient, which bucket all-reduce consumes it, and
how much gradient memory a lifetime-aware buffer plan would need instead of today's (docs/memory.md).

    python -m workbench.memory lifetimes --config config.yaml [--out DIR] [--rebuild-dag]

Three steps, each a function:

1. ``build_dag``: one forward of the config's model on fake tensors (no storage, so the 1.6B preset builds on any
   CPU), its autograd graph walked from ``loss.grad_fn`` through ``next_functions`` into plain data: each node's
   op, sequence number and edges, the AccumulateGrad nodes named by their parameter. ``load_dag`` caches it in
   ``cache_root()/lifetimes/`` by a hash of what shapes the graph (``dag_key``).
2. ``production_order``: the autograd engine's schedule replayed on that data. A node runs once every edge into
   it has delivered; of the ready nodes the engine runs the one with the highest ``sequence_nr`` first
   (``ReadyQueue::CompareNodeTaskTime`` in torch/csrc/autograd/engine.h, a ``std::priority_queue``), and
   AccumulateGrad's sequence_nr is UINT64_MAX (torch/csrc/autograd/function.h, NOTE [ Sequence Number ]), so a
   gradient is accumulated as soon as it is complete. The order in which AccumulateGrad nodes run is the
   gradients' production order, the order ``register_post_accumulate_grad_hook`` hooks fire in.
3. ``plan_lifetimes``: the buckets of ``overlap.plan_buckets`` at ``loongforge.overlap.bucket_size_mb`` (the
   training loop's plan), each gradient's last consumer (its bucket's all-reduce, then the optimizer step), and
   the peak of live gradient bytes under today's plan and under the lifetime-aware one (the rule: docs/memory.md
   and ``plan_lifetimes``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from workbench.files import write_json
from workbench.config import MIB, Config, config_hash
from workbench.train.model import Llama
from workbench.train.ops import resolve
from workbench.train.overlap import layer_units, overlap_count, plan_buckets
from workbench.train.run import cache_root
from workbench.train.trainer import build_model_args

__all__ = [
    "DAG_VERSION",
    "SCHEMA_VERSION",
    "Bucket",
    "analyze_lifetimes",
    "build_dag",
    "dag_key",
    "format_table",
    "load_dag",
    "plan_lifetimes",
    "production_order",
    "study_lifetimes",
    "write_lifetimes",
]

SCHEMA_VERSION = 1
"""Of ``lifetimes.json``."""
DAG_VERSION = 1
"""Of the cached DAG's layout; part of the cache key, so a new layout is rebuilt rather than misread."""
GRAPH_TOKENS = 16
"""Tokens in the one-row batch the graph is built from: the graph's structure does not depend on the shapes."""
TIMELINE_POINTS = 400
"""Most points of the live-bytes timeline kept in lifetimes.json (the peaks are always kept)."""


class Bucket(NamedTuple):
    """One bucket of the training loop's plan, by name: its layers and its parameters, in plan order."""

    layers: tuple[str, ...]
    params: tuple[str, ...]


# --------------------------------------------------------------------------- 1. the DAG


def dag_key(cfg: Config) -> dict[str, Any]:
    """What the autograd graph's structure depends on: the architecture, activation checkpointing, the fused
    residual norm, the torch version (its kernels' autograd formulas) and this module's DAG layout."""
    t = cfg.training
    mode = t.activation_checkpointing
    return {"dag_version": DAG_VERSION, "model": asdict(build_model_args(cfg)),
            "activation_checkpointing": mode,
            # "every" picks the blocks only under selective checkpointing
            "activation_checkpointing_every": t.activation_checkpointing_every if mode == "selective" else None,
            "fused_residual_norm": cfg.loongforge.compute_domain.fused_residual_norm, "torch": torch.__version__}


def _hash(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _walk(root: Any, names: Mapping[int, str]) -> list[list[Any]]:
    """The graph under ``root`` as ``[op, sequence_nr, [next node indices], parameter name or None]``, node 0 the
    root, nodes numbered in the order the walk meets them. An edge to no node (an input that needs no gradient) is
    left out, as the engine skips it."""
    index = {root: 0}
    found = [root]
    i = 0
    while i < len(found):
        for fn, _ in found[i].next_functions:
            if fn is not None and fn not in index:
                index[fn] = len(found)
                found.append(fn)
        i += 1
    nodes = []
    for fn in found:
        var = getattr(fn, "variable", None) if type(fn).__name__ == "AccumulateGrad" else None
        nodes.append([type(fn).__name__, fn._sequence_nr(),
                      [index[f] for f, _ in fn.next_functions if f is not None],
                      names.get(id(var)) if var is not None else None])
    return nodes


def build_dag(cfg: Config) -> dict[str, Any]:
    """One forward of ``cfg``'s model (torch ops, eager, as ``Trainer.train_step`` computes its loss) and its
    autograd graph as data: ``nodes`` (``_walk``), ``params`` (name, shape, dtype, in registration order) and
    ``units`` (``overlap.layer_units``: [layer, [parameter names]], forward order)."""
    t, cd = cfg.training, cfg.loongforge.compute_domain
    args = build_model_args(cfg)
    t0 = time.perf_counter()
    # Fake tensors on the CPU device, not the meta device. On meta the model's norms ask
    # torch.is_autocast_enabled("meta"), which raises, and SDPA takes its math decomposition (matmul, softmax and
    # view nodes) where CPU and CUDA run one fused kernel, so the graph would not be the one that trains. A fake
    # tensor carries the CPU device, so every op takes the CPU kernels' path (fused SDPA, the loss op,
    # non-reentrant checkpointing all run there) and holds no storage: gr00t-n1.6's 1.6B parameters cost nothing.
    # The order derived from this graph equals the one measured on an H200 under bf16 autocast (docs/memory.md).
    with FakeTensorMode():
        model = Llama(args, resolve(fused_residual_norm=cd.fused_residual_norm))
        model.set_activation_checkpointing(t.activation_checkpointing, t.activation_checkpointing_every)
        model.train()
        names = {id(p): n for n, p in model.named_parameters()}
        T = min(GRAPH_TOKENS, args.max_position_embeddings)
        ids_BT = torch.zeros(1, T, dtype=torch.long)
        pos_BT = torch.arange(T).expand(1, T)
        mask_BT = torch.ones(1, T, dtype=torch.bool)
        loss_sum, n_tok = model.loss(ids_BT, pos_BT, mask_BT)
        loss = loss_sum / n_tok.clamp(min=1) / cfg.effective_grad_accum_steps()  # as Trainer.train_step
        nodes = _walk(loss.grad_fn, names)
    return {"nodes": nodes,
            "params": [{"name": n, "shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch.")}
                       for n, p in model.named_parameters()],
            "units": [[layer, [names[id(p)] for p in ps]] for layer, ps in layer_units(model)],
            "build_s": round(time.perf_counter() - t0, 3)}


def load_dag(cfg: Config, *, rebuild: bool = False, cache_dir: str | Path | None = None
             ) -> tuple[dict[str, Any], bool, Path]:
    """The DAG of ``cfg``'s model from the cache (``cache_dir``, default ``cache_root()/lifetimes``), else built
    and stored there; ``rebuild`` builds it anew. Returns (dag, cached, path of the cache file)."""
    key = dag_key(cfg)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "lifetimes"
    path = root / f"dag-{_hash(key)}.json"
    if not rebuild:
        try:
            doc = json.loads(path.read_text())
            if isinstance(doc, dict) and doc.get("key") == json.loads(json.dumps(key, default=str)):
                return doc, True, path
        except (OSError, ValueError):
            pass  # missing or unreadable: built below
    doc = {"key": key, **build_dag(cfg)}
    root.mkdir(parents=True, exist_ok=True)
    write_json(path, doc, indent=None, default=str)  # a reader never sees half a file
    return doc, False, path


# --------------------------------------------------------------------------- 2. the engine's schedule


def _push(heap: list[tuple[int, int]], item: tuple[int, int]) -> None:
    """``std::priority_queue::push`` as libstdc++ does it (``std::push_heap``): a max-heap on sequence_nr.
    Reproduced to the letter because ties (every AccumulateGrad has sequence_nr UINT64_MAX) are broken by where
    items sit in the heap, not by arrival."""
    heap.append(item)
    hole = len(heap) - 1
    while hole > 0:
        parent = (hole - 1) // 2
        if not heap[parent][0] < item[0]:
            break
        heap[hole] = heap[parent]
        hole = parent
    heap[hole] = item


def _pop(heap: list[tuple[int, int]]) -> tuple[int, int]:
    """``std::priority_queue::pop`` as libstdc++ does it (``std::pop_heap``: ``__adjust_heap``, then
    ``__push_heap``)."""
    top, value = heap[0], heap.pop()
    n = len(heap)
    if n == 0:
        return top
    hole = child = 0
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if heap[child][0] < heap[child - 1][0]:
            child -= 1
        heap[hole] = heap[child]
        hole = child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        heap[hole] = heap[child - 1]
        hole = child - 1
    while hole > 0:
        parent = (hole - 1) // 2
        if not heap[parent][0] < value[0]:
            break
        heap[hole] = heap[parent]
        hole = parent
    heap[hole] = value
    return top


def production_order(nodes: Sequence[Sequence[Any]]) -> list[str]:
    """The parameters in the order one backward from node 0 accumulates their gradients.

    The engine's rule (torch/csrc/autograd/engine.cpp): a node's dependencies are the edges into it; the root is
    queued first; the ready queue pops the node with the highest sequence_nr; after a node runs, its edges are
    taken in order, and a node whose last dependency that was is pushed. All nodes of a one-device graph share one
    ready queue, so this is exact for a model on one device."""
    deps = [0] * len(nodes)
    for _, _, nxt, _ in nodes:
        for j in nxt:
            deps[j] += 1
    heap: list[tuple[int, int]] = []
    _push(heap, (nodes[0][1], 0))
    order = []
    while heap:
        _, i = _pop(heap)
        if nodes[i][3] is not None:
            order.append(nodes[i][3])
        for j in nodes[i][2]:
            deps[j] -= 1
            if deps[j] == 0:
                _push(heap, (nodes[j][1], j))
    return order


# --------------------------------------------------------------------------- 3. the plans


def plan_lifetimes(order: Sequence[str], nbytes: Mapping[str, int], buckets: Sequence[Bucket], *,
                   n_overlap: int | None = None, grad_accum: int = 1) -> dict[str, Any]:
    """Live gradient bytes over one backward under today's plan and under the lifetime-aware one.

    Ticks: tick t < N (N = ``len(order)``) produces gradient ``order[t]``; ticks N, N+1, ... follow the backward.

    * Today: a gradient lives from its tick until the optimizer step after the backward, so the peak is at tick
      N - 1 and equals the total.
    * Lifetime-aware (grad_accum 1): each bucket has one gradient buffer, alive from the tick of the bucket's
      first gradient (``alloc_tick``) to its release (``release_tick``), both included. A bucket is ready at the
      tick of its last gradient (N if a parameter of it gets none). Buckets launch in plan order (all-reduce,
      then the optimizer update of the bucket's parameters): one of the first ``n_overlap`` (all by default)
      that is ready during the backward at max(ready, previous launch), the others one a tick after the
      backward, at max(N, previous launch + 1). At most one bucket is in flight: a bucket's buffer is released
      at the next bucket's launch (the next launch waits for it otherwise), the last bucket's at its own launch.
      Buffers share memory through slots: a bucket takes the lowest-numbered slot whose occupant was released
      before its alloc tick, else a new slot; a slot is as large as its largest occupant, and ``buffer_bytes``
      is the sum of the slots.
    * With grad_accum > 1 every gradient is accumulated into across the micro-batches, so every buffer lives
      from the first micro-batch to the optimizer step (here: from tick 0, carried over from the micro-batch
      before, to the last release): the lifetime-aware plan is today's, one slot a bucket.

    Returns ``params`` (production order: name, production_index, bytes, bucket), ``buckets`` (plan order:
    index, layers, params, bytes, first_tick, ready_tick, launch_tick, alloc_tick, release_tick, slot),
    ``total_bytes``, ``today`` and ``lifetime`` ({peak_live_bytes, buffer_bytes, slots, slot_bytes,
    saved_bytes}) and ``timeline`` ([{tick, param, today_bytes, lifetime_bytes}])."""
    n = len(order)
    tick = {name: t for t, name in enumerate(order)}
    where = {name: b for b, bk in enumerate(buckets) for name in bk.params}
    n_overlap = len(buckets) if n_overlap is None else n_overlap
    rows = []
    launch_prev = -1
    for b, bk in enumerate(buckets):
        ticks = [tick.get(p) for p in bk.params]
        produced = [x for x in ticks if x is not None]
        first = min(produced) if produced else n
        ready = max(produced) if len(produced) == len(ticks) else n
        launch = max(ready, launch_prev) if b < n_overlap and ready < n else max(n, launch_prev + 1)
        rows.append({"index": b, "layers": list(bk.layers), "params": len(bk.params),
                     "bytes": sum(nbytes[p] for p in bk.params), "first_tick": first, "ready_tick": ready,
                     "launch_tick": launch, "alloc_tick": first})
        launch_prev = launch
    for b, row in enumerate(rows):
        row["release_tick"] = rows[b + 1]["launch_tick"] if b + 1 < len(rows) else row["launch_tick"]
    if grad_accum > 1:  # live through every micro-batch: no bucket is released before the optimizer step
        end = max((r["release_tick"] for r in rows), default=n - 1)
        for r in rows:
            r["alloc_tick"], r["release_tick"] = 0, end
    slots: list[tuple[int, int]] = []  # (release tick of the last occupant, largest occupant's bytes)
    for r in sorted(rows, key=lambda r: (r["alloc_tick"], r["index"])):
        free = next((s for s, (rel, _) in enumerate(slots) if rel < r["alloc_tick"]), None)
        if free is None:
            slots.append((r["release_tick"], r["bytes"]))
            r["slot"] = len(slots) - 1
        else:
            slots[free] = (r["release_tick"], max(slots[free][1], r["bytes"]))
            r["slot"] = free
    total = sum(nbytes[p] for p in order) + sum(nbytes[p] for bk in buckets for p in bk.params if p not in tick)
    last = max([n - 1, *(r["release_tick"] for r in rows)])
    timeline, today = [], 0
    for t in range(last + 1):
        if t < n:
            today += nbytes[order[t]]
        live = sum(r["bytes"] for r in rows if r["alloc_tick"] <= t <= r["release_tick"])
        timeline.append({"tick": t, "param": order[t] if t < n else None, "today_bytes": today,
                         "lifetime_bytes": live})
    slot_bytes = [s for _, s in slots]
    params = [{"name": p, "production_index": tick[p], "bytes": nbytes[p], "bucket": where.get(p)} for p in order]
    return {"params": params, "buckets": rows, "total_bytes": total,
            "today": {"peak_live_bytes": max((x["today_bytes"] for x in timeline), default=0),
                      "buffer_bytes": total},
            "lifetime": {"peak_live_bytes": max((x["lifetime_bytes"] for x in timeline), default=0),
                         "buffer_bytes": sum(slot_bytes), "slots": len(slots), "slot_bytes": slot_bytes,
                         "saved_bytes": total - sum(slot_bytes)},
            "timeline": timeline}


def _thin(timeline: list[dict[str, Any]], points: int) -> list[dict[str, Any]]:
    """At most ``points`` entries of the timeline, evenly spread, its first, last and both peaks kept."""
    if len(timeline) <= points:
        return timeline
    keep = {0, len(timeline) - 1,
            max(range(len(timeline)), key=lambda i: timeline[i]["today_bytes"]),
            max(range(len(timeline)), key=lambda i: timeline[i]["lifetime_bytes"])}
    step = len(timeline) / (points - len(keep))
    keep |= {int(i * step) for i in range(points - len(keep))}
    return [timeline[i] for i in sorted(keep)]


def analyze_lifetimes(cfg: Config, *, rebuild_dag: bool = False, cache_dir: str | Path | None = None
                      ) -> dict[str, Any]:
    """``lifetimes.json``'s content for ``cfg`` (schema in docs/memory.md)."""
    dag, cached, path = load_dag(cfg, rebuild=rebuild_dag, cache_dir=cache_dir)
    order = production_order(dag["nodes"])
    # the training loop's bucket plan, from stand-ins of the parameters (same shapes and dtypes, no storage)
    tensors = {p["name"]: torch.empty(p["shape"], dtype=getattr(torch, p["dtype"]), device="meta")
               for p in dag["params"]}
    ov, t, cd = cfg.loongforge.overlap, cfg.training, cfg.loongforge.compute_domain
    plans = plan_buckets([(layer, [tensors[n] for n in names]) for layer, names in dag["units"]],
                         ov.bucket_bytes)  # as OverlapScheduler.__init__
    by_id = {id(x): n for n, x in tensors.items()}
    buckets = [Bucket(tuple(b.layers), tuple(by_id[id(p)] for p in b.params)) for b in plans]
    nbytes = {n: x.numel() * x.element_size() for n, x in tensors.items()}
    ratio = cfg.effective_overlap_ratio
    n_overlap, accum = overlap_count(len(buckets), ratio), cfg.effective_grad_accum_steps()
    plan = plan_lifetimes(order, nbytes, buckets, n_overlap=n_overlap, grad_accum=accum)
    blocked = []
    if accum > 1:
        blocked.append(f"gradient accumulation over {accum} micro-batches: every gradient is summed into across "
                       "them, so all stay live until the optimizer step")
    if cd.compile != "none" and cd.compile_scope == "model":
        blocked.append("loongforge.compute_domain.compile_scope=model: the compiled loss's backward is one node, "
                       "which hands every gradient over at its end, so all are live at once")
    if t.grad_clip > 0:
        blocked.append(f"training.grad_clip={t.grad_clip:g}: clipping scales every gradient by the global norm, "
                       "known only once the last gradient is produced, so no bucket can be updated and freed "
                       "before the backward ends")
    lifetime = {**plan["lifetime"], "applies": not blocked, "blocked_by": blocked}
    return {
        "schema_version": SCHEMA_VERSION, "model": cfg.model.name, "config_hash": config_hash(cfg),
        "graph": "one eager forward with the torch ops (no Triton, FP8 or compile), fake tensors on the CPU",
        "dag": {"hash": path.stem.removeprefix("dag-"), "cached": cached, "path": str(path),
                "nodes": len(dag["nodes"]), "build_s": dag.get("build_s"), "key": dag["key"]},
        "bucket_size_mb": ov.bucket_size_mb, "overlap_ratio": ratio, "overlapped_buckets": n_overlap,
        "grad_accum_steps": accum, "grad_clip": t.grad_clip, "world_size": cfg.hardware.gpus,
        "total_bytes": plan["total_bytes"], "params": plan["params"], "buckets": plan["buckets"],
        "today": plan["today"], "lifetime": lifetime,
        "saved_bytes": lifetime["saved_bytes"] if not blocked else 0,
        "timeline": _thin(plan["timeline"], TIMELINE_POINTS),
    }


def write_lifetimes(doc: Mapping[str, Any], out_dir: str | Path) -> Path:
    """``out_dir/lifetimes.json``, replaced atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_json(out / "lifetimes.json", doc, indent=1, default=str)


def study_lifetimes(cfg: Config, study_dir: str | Path) -> str:
    """The tuner's lifetimes writer (``Tuner(lifetimes=...)``, passed by ``python -m workbench.tune``):
    ``study_dir/lifetimes.json`` of the study's base config ``cfg``; returns one line for the tuner's log."""
    doc = analyze_lifetimes(cfg)
    return f"{write_lifetimes(doc, study_dir)}; {_plan_line(doc)}"


# --------------------------------------------------------------------------- the table


def _mib(v: float) -> str:
    return f"{v / MIB:,.1f} MiB" if v < 1024 * MIB else f"{v / MIB / 1024:,.2f} GiB"


def _layers(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"


def format_table(doc: Mapping[str, Any], max_rows: int = 16) -> str:
    """A short text summary of ``lifetimes.json``: one line per bucket (the first and last ones past
    ``max_rows``), then today's and the lifetime-aware plan's peaks, slots and saving."""
    dag = doc["dag"]
    lines = [f"gradient lifetimes of {doc['model']}: {len(doc['params'])} gradients, {len(doc['buckets'])} bucket(s) "
             f"at {doc['bucket_size_mb']:g} MiB; DAG {dag['hash']} "
             + (f"cached ({dag['path']})" if dag["cached"] else f"built in {dag['build_s']:.1f} s, cached at "
                f"{dag['path']}"),
             f"{'bucket':>6}  {'layers':<34} {'params':>6} {'size':>12}  {'produced':>9}  {'freed':>5}  slot"]
    rows = doc["buckets"]
    shown = rows if len(rows) <= max_rows else [*rows[:max_rows - 4], None, *rows[-3:]]
    for r in shown:
        if r is None:
            lines.append(f"{'...':>6}")
            continue
        lines.append(f"{r['index']:>6}  {_layers(r['layers']):<34} {r['params']:>6} {_mib(r['bytes']):>12}  "
                     f"{r['first_tick']:>4}-{r['ready_tick']:<4}  {r['release_tick']:>5}  {r['slot']:>4}")
    life, total = doc["lifetime"], doc["total_bytes"]
    lines.append(f"gradients {_mib(total)}; today's plan: peak {_mib(doc['today']['peak_live_bytes'])} "
                 "(every gradient lives until the optimizer step)")
    lines.append(_plan_line(doc))
    lines.extend(f"  {why}" for why in life["blocked_by"])
    return "\n".join(lines)


def _plan_line(doc: Mapping[str, Any]) -> str:
    life = doc["lifetime"]
    slots = " + ".join(_mib(s) for s in life["slot_bytes"]) if len(life["slot_bytes"]) <= 4 else \
        f"up to {_mib(max(life['slot_bytes']))} each"
    return (f"lifetime-aware plan: peak {_mib(life['peak_live_bytes'])}, {life['slots']} buffer slot(s) ({slots}), "
            f"{_mib(life['buffer_bytes'])} in all: "
            + (f"saves {_mib(doc['saved_bytes'])}" if life["applies"] else "no saving at this config"
               + (f" (it would save {_mib(life['saved_bytes'])} without the reasons below)"
                  if life["saved_bytes"] else "")))
