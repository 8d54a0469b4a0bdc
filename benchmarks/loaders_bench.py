"""End-to-end loader benchmark: io_uring at several ring depths vs a thread pool vs a plain memmap.

    python benchmarks/loaders_bench.py [--json] [--tokens N] [--micro-batch 8] [--seq-len 2048]
                            [--depths 8,32,128] [--out DIR] [--repeats 3] [--cold]

1. Corpus: ~``--tokens`` real tokens of ``loaders.synth`` documents, through
   ``loaders.preprocess`` (bucket width seq_len/8, min_len seq_len/4, short
   pieces packed) into a shard directory, cached under ``--cache-dir`` (default
   ``.cache/loaders-bench/``, git-ignored) and reused while its parameters match.
   Beside it, the *reference*: the same records stored uncompressed (tokens and
   positions uint16, mask uint8) as flat files read through ``np.memmap``.
2. Variants, each one epoch of the same ``EpochPlan`` (seed 0), consumed with
   no compute (read, decompress, assemble into staging blocks; with ``--device
   cuda`` also the non-blocking host-to-device copy, on CPU there is no copy):

   * ``io_uring dN``  ``BatchPipeline`` with the io_uring reader at ring depth N
   * ``threadpool``   ``BatchPipeline`` with the thread-pool reader
   * ``memmap``       the reference: the same batches assembled from the memmap
                      into the same staging blocks, on the calling thread

   Figures: real tokens/s of wall time; real tokens/s per core = real tokens /
   process CPU seconds (``time.process_time``: every thread of the process,
   io_uring's kernel workers included); read latency p50/p90/p99. Each figure
   also as a ratio to the memmap reference. Repeats run interleaved (A, B, C, A,
   B, C, ...); the table shows medians, the JSON rows p20/p80 too.
3. ``reader copy``: the reader alone over the epoch's frames, handing out
   memoryviews of pooled buffers vs ``bytes`` copies (``copy=True``).
4. Compression ratios from the manifest: per-bucket dictionaries vs one global
   dictionary vs no dictionary vs the whole payload as one zstd stream, all at
   the same level.

The page cache is warm unless ``--cold`` (``posix_fadvise(DONTNEED)`` on the
corpus files before each variant: this process's files only, no root needed).
The table is printed last; ``--json`` prints one JSON object instead;
``--out DIR`` also writes that object and long-format CSV rows there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from loaders._staging import fill_row  # noqa: E402
from loaders.format import MANIFEST_NAME, ShardSet, ShardWriter  # noqa: E402
from loaders.pipeline import BatchPipeline, EpochPlan, StagingRing, default_block_bytes  # noqa: E402
from loaders.reader import make_reader, probe_io_uring  # noqa: E402
from workbench.vocab import PADDING_RATIO

__all__ = ["BenchConfig", "build_corpus", "build_reference", "run_bench", "main"]

_CORPUS_VERSION = 1  # bump when the corpus recipe changes, so caches are rebuilt
_VOCAB = 32000


@dataclass(kw_only=True)
class BenchConfig:
    """What the benchmark builds and runs."""

    tokens: int = 20_000_000
    """Real tokens in the corpus (~; whole documents)."""
    micro_batch: int = 8
    """Records per batch."""
    seq_len: int = 2048
    """Maximum record length (the largest bucket)."""
    depths: tuple[int, ...] = (8, 32, 128)
    """io_uring ring depths to measure."""
    threads: int = 4
    """Thread-pool reader threads (its depth is the largest io_uring depth)."""
    num_workers: int = 2
    """Decode threads of the pipeline variants."""
    repeats: int = 3
    """Interleaved repeats of every variant."""
    zstd_level: int = 12
    """Compression level of the corpus (and of the ratio baselines)."""
    cold: bool = False
    """Drop the corpus files from the page cache before each variant."""
    cache_dir: str = ".cache/loaders-bench"
    """Where corpora are built and reused."""
    seed: int = 0
    """Corpus and plan seed."""
    device: str = "cpu"
    """Where batches go: "cpu" (no copy) or "cuda" (pinned blocks, non-blocking h2d copies)."""

    def __post_init__(self) -> None:
        for name in ("tokens", "micro_batch", "seq_len", "threads", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected >= 1")
        if self.num_workers < 0:
            raise ValueError(f"num_workers={self.num_workers}: expected >= 0")
        if self.seq_len < 8:
            raise ValueError(f"seq_len={self.seq_len}: expected >= 8")
        if not self.depths or min(self.depths) < 1:
            raise ValueError(f"depths={self.depths!r}: expected positive ring depths")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: expected cpu or cuda")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda': CUDA is not available here")


def _log(msg: str) -> None:
    print(f"[loaders.bench] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- corpus


def _corpus_key(cfg: BenchConfig) -> str:
    return f"v{_CORPUS_VERSION}-t{cfg.tokens}-L{cfg.seq_len}-z{cfg.zstd_level}-s{cfg.seed}"


def _documents(cfg: BenchConfig) -> list[np.ndarray]:
    """~cfg.tokens tokens of synthetic documents (loaders.synth; a small Zipf generator if it is missing)."""
    mean_len = cfg.seq_len / 2
    try:
        from .synth import SynthSpec, generate_documents
    except ImportError:
        return _zipf_documents(cfg.tokens, mean_len, cfg.seed)
    # synth's mean document is ~0.85 x mean_len + 0.15 x ~130 (its short tail): over-generate a little
    n = math.ceil(cfg.tokens / (0.85 * mean_len + 20) * 1.1) + 1
    docs = generate_documents(SynthSpec(vocab_size=_VOCAB, num_docs=n, mean_len=float(mean_len), seed=cfg.seed))
    total = np.cumsum([len(d) for d in docs])
    return docs[:int(np.searchsorted(total, cfg.tokens)) + 1]


def _zipf_documents(tokens: int, mean_len: float, seed: int) -> list[np.ndarray]:
    """Fallback generator: Zipf token ids with repeated phrases, log-normal lengths."""
    rng = np.random.default_rng(seed)
    phrases = [rng.zipf(1.2, int(rng.integers(2, 8))) % (_VOCAB - 1) for _ in range(4096)]
    docs, total = [], 0
    while total < tokens:
        n = int(np.clip(rng.lognormal(math.log(mean_len), 0.6), 8, 4 * mean_len))
        pieces = [phrases[i] for i in rng.zipf(1.1, n // 3 + 1) % len(phrases)]
        doc = np.concatenate(pieces)[:n].astype(np.uint16)
        docs.append(doc)
        total += len(doc)
    return docs


def build_corpus(cfg: BenchConfig) -> Path:
    """The shard directory for ``cfg`` (built once, then reused from the cache)."""
    root = Path(cfg.cache_dir) / _corpus_key(cfg)
    shards = root / "shards"
    if (shards / MANIFEST_NAME).is_file():
        return shards
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    docs = _documents(cfg)
    _log(f"generated {len(docs):,} documents ({sum(map(len, docs)):,} tokens) in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    width, min_len = max(1, cfg.seq_len // 8), max(1, cfg.seq_len // 4)
    try:
        from .preprocess import preprocess
        from .synth import write_bin
    except ImportError:
        preprocess = None
    if preprocess is not None:
        eos = _VOCAB - 1
        src = root / "docs.bin"
        write_bin(docs, src, eos)
        preprocess([str(src)], str(shards), bucket_width=width, min_len=min_len, max_len=cfg.seq_len,
                   num_workers=2, zstd_level=cfg.zstd_level, vocab_size=_VOCAB, eos_id=eos, overwrite=True)
        src.unlink()
    else:  # no preprocess: one record per document piece of at most seq_len
        with ShardWriter(shards, vocab_size=_VOCAB, bucket_width=width, max_len=cfg.seq_len,
                         zstd_level=cfg.zstd_level, num_workers=2, overwrite=True) as w:
            for d in docs:
                for a in range(0, len(d), cfg.seq_len):
                    w.add(d[a:a + cfg.seq_len])
    _log(f"built shards in {time.perf_counter() - t:.1f} s: {shards}")
    return shards


def build_reference(shards_dir: Path) -> Path:
    """The same records uncompressed: tokens.u16, positions.u16, mask.u8, offsets.i64 (record id order)."""
    ref = shards_dir.parent / "memmap"
    if (ref / "offsets.i64").is_file():
        return ref
    tmp = shards_dir.parent / "memmap.partial"
    tmp.mkdir(parents=True, exist_ok=True)
    with ShardSet(shards_dir) as ss:
        if ss.tok_dtype.itemsize != 2:
            raise ValueError(f"{shards_dir}: the memmap reference stores uint16 tokens; vocab {ss.vocab_size} is "
                             f"too large")
        lens = np.asarray(ss.rec_length, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        with open(tmp / "tokens.u16", "wb") as ft, open(tmp / "positions.u16", "wb") as fp, \
                open(tmp / "mask.u8", "wb") as fm:
            for f in range(ss.n_frames):  # frames hold records in id order, columns contiguous per frame
                fr = ss.load_frame(f)
                ft.write(fr.tokens.astype(np.uint16).tobytes())
                fp.write(fr.position_ids.astype(np.uint16).tobytes())
                fm.write(fr.loss_mask.tobytes())
        offsets.astype(np.int64).tofile(tmp / "offsets.i64")
    os.replace(tmp, ref)
    return ref


def _drop_cache(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- variants


def _run_pipeline(shards: ShardSet, cfg: BenchConfig, backend: str, depth: int) -> dict[str, Any]:
    pl = BatchPipeline(shards, micro_batch_size=cfg.micro_batch, seed=cfg.seed, num_workers=cfg.num_workers,
                       io_backend=backend, io_uring_entries=depth, read_threads=cfg.threads, epochs=1,
                       device=cfg.device)
    real = batches = 0
    c0, t0 = time.process_time(), time.perf_counter()
    try:
        for b in pl:
            real += b.real_tokens
            batches += 1
        if cfg.device == "cuda":
            torch.cuda.synchronize()  # note: the last copies must have landed before the clock stops
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        m = pl.metrics()
    finally:
        pl.close()
    return {"real_tokens": real, "batches": batches, "wall_s": wall, "cpu_s": cpu,
            "read_latency_ms_p50": m["io/read_latency_ms_p50"], "read_latency_ms_p90": m["io/read_latency_ms_p90"],
            "read_latency_ms_p99": m["io/read_latency_ms_p99"], "backend": m["io/backend"],
            "padding_ratio": m[PADDING_RATIO]}


def _run_memmap(shards: ShardSet, ref: Path, cfg: BenchConfig) -> dict[str, Any]:
    """The reference: the same plan's batches assembled from np.memmap into the same staging blocks."""
    c0, t0 = time.process_time(), time.perf_counter()
    tok = np.memmap(ref / "tokens.u16", np.uint16, "r")
    pos = np.memmap(ref / "positions.u16", np.uint16, "r")
    mask = np.memmap(ref / "mask.u8", np.uint8, "r")
    off = np.fromfile(ref / "offsets.i64", np.int64)
    blen = np.asarray(shards.bucket_length, np.int64)
    plan = EpochPlan(shards, micro_batch_size=cfg.micro_batch, seed=cfg.seed, epoch=0)
    cuda = cfg.device == "cuda"
    ring = StagingRing(4, default_block_bytes(int(blen.max()), cfg.micro_batch), pin=cuda)
    stream = torch.cuda.Stream() if cuda else None
    real = 0
    for bucket, ids in plan:
        i = ring.acquire()
        B, T = len(ids), int(blen[bucket])
        tok_BT, pos_BT, mask_BT = ring.views(i, B, T)
        for row, r in enumerate(ids.tolist()):
            a, b = int(off[r]), int(off[r + 1])
            real += fill_row(tok_BT, pos_BT, mask_BT, row, tok[a:b], pos[a:b], mask[a:b])
        if cuda:  # the same h2d path as the pipeline: non-blocking on a side stream, block reused after its event
            with torch.cuda.stream(stream):
                dev = torch.empty(9 * B * T, dtype=torch.uint8, device="cuda")
                dev.copy_(ring.blocks[i][:9 * B * T], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(stream)
            ring.set_event(i, ev)
        else:
            ring.hand_out(i).complete()  # the consumer is done with it at once
    if cuda:
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    nan = float("nan")
    return {"real_tokens": real, "batches": len(plan), "wall_s": wall, "cpu_s": cpu, "read_latency_ms_p50": nan,
            "read_latency_ms_p90": nan, "read_latency_ms_p99": nan, "backend": "memmap", "padding_ratio": nan}


def _reader_copy(shards: ShardSet, cfg: BenchConfig, backend: str, depth: int) -> list[dict[str, Any]]:
    """The reader alone over one epoch's frames: memoryviews of pooled buffers vs bytes copies.

    One reader, one unmeasured pass to fill its buffer pool, then the two modes alternately.
    """
    plan = EpochPlan(shards, micro_batch_size=cfg.micro_batch, seed=cfg.seed, epoch=0)
    reqs = [(f, *shards.read_request(f)) for f in plan.frame_order.tolist()]
    out = []
    with make_reader(backend, depth=depth, threads=cfg.threads) as rd:
        for _ in rd.read_ordered(reqs):
            pass
        for rep in range(cfg.repeats):
            for copy in ((False, True) if rep % 2 == 0 else (True, False)):
                n = 0
                c0, t0 = time.process_time(), time.perf_counter()
                for _, data in rd.read_ordered(reqs, copy=copy):
                    n += len(data)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                out.append({"mode": "bytes" if copy else "memoryview", "backend": rd.name, "depth": depth,
                            "mb": n / 1e6, "wall_s": wall, "cpu_s": cpu})
    return out


def _q(xs: list[float], q: float) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.percentile(xs, q)) if xs else float("nan")


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Build (or reuse) the corpus, run every variant ``repeats`` times interleaved; the figures as one dict."""
    shards_dir = build_corpus(cfg)
    ref = build_reference(shards_dir)
    uring_ok, uring_why = probe_io_uring()
    variants: list[tuple[str, Callable[[ShardSet], dict]]] = []
    if uring_ok:
        for d in cfg.depths:
            variants.append((f"io_uring d{d}", lambda ss, d=d: _run_pipeline(ss, cfg, "io_uring", d)))
    top = max(cfg.depths)
    variants.append((f"threadpool t{cfg.threads}", lambda ss: _run_pipeline(ss, cfg, "threadpool", top)))
    variants.append(("memmap", lambda ss: _run_memmap(ss, ref, cfg)))
    files = [p for p in (shards_dir / "data").iterdir()] + [p for p in ref.iterdir()]
    runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
    with ShardSet(shards_dir) as ss:
        manifest = ss.manifest
        for rep in range(cfg.repeats):
            for name, fn in variants:
                if cfg.cold:
                    _drop_cache(files)
                r = fn(ss)
                runs[name].append(r)
                _log(f"repeat {rep + 1}/{cfg.repeats} {name:>14}: {r['real_tokens'] / r['wall_s'] / 1e6:7.2f} M tok/s "
                     f"wall, {r['real_tokens'] / max(r['cpu_s'], 1e-9) / 1e6:7.2f} M tok/s per core")
        copy_rows = _reader_copy(ss, cfg, "io_uring" if uring_ok else "threadpool", 32)

    rows, summary = [], {}
    for name, rs in runs.items():
        wall = [r["real_tokens"] / r["wall_s"] for r in rs]
        core = [r["real_tokens"] / max(r["cpu_s"], 1e-9) for r in rs]
        s = {"tokens_per_s": _q(wall, 50), "tokens_per_s_p20": _q(wall, 20), "tokens_per_s_p80": _q(wall, 80),
             "tokens_per_s_per_core": _q(core, 50), "tokens_per_s_per_core_p20": _q(core, 20),
             "tokens_per_s_per_core_p80": _q(core, 80),
             "read_latency_ms_p50": _q([r["read_latency_ms_p50"] for r in rs], 50),
             "read_latency_ms_p90": _q([r["read_latency_ms_p90"] for r in rs], 50),
             "read_latency_ms_p99": _q([r["read_latency_ms_p99"] for r in rs], 50),
             "real_tokens": rs[0]["real_tokens"], "batches": rs[0]["batches"],
             "cpu_s": statistics.median(r["cpu_s"] for r in rs), "wall_s": statistics.median(r["wall_s"] for r in rs)}
        summary[name] = s
    base = summary["memmap"]
    for name, s in summary.items():
        s["tokens_per_s_vs_memmap"] = s["tokens_per_s"] / base["tokens_per_s"]
        s["tokens_per_s_per_core_vs_memmap"] = s["tokens_per_s_per_core"] / base["tokens_per_s_per_core"]
        for metric in ("tokens_per_s", "tokens_per_s_per_core", "read_latency_ms_p50", "read_latency_ms_p90",
                       "read_latency_ms_p99"):
            rows.append({"variant": name, "metric": metric, "median": s[metric],
                         "p20": s.get(f"{metric}_p20", float("nan")), "p80": s.get(f"{metric}_p80", float("nan")),
                         "vs_memmap": s[metric] / base[metric] if metric.startswith("tokens") else float("nan")})
    copy_summary = {}
    for mode in ("memoryview", "bytes"):
        rs = [r for r in copy_rows if r["mode"] == mode]
        copy_summary[mode] = {"backend": rs[0]["backend"], "depth": rs[0]["depth"],
                              "mb_per_s": _q([r["mb"] / r["wall_s"] for r in rs], 50),
                              "mb_per_s_per_core": _q([r["mb"] / max(r["cpu_s"], 1e-9) for r in rs], 50)}
    comp = manifest.get("compression", {})
    return {
        "env": {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
                "torch": torch.__version__, "numpy": np.__version__, "kernel": platform.release(),
                "cpus": os.cpu_count(), "device": cfg.device,
                "gpu": torch.cuda.get_device_name() if cfg.device == "cuda" else None,
                "io_uring": uring_ok, "io_uring_reason": uring_why,
                "page_cache": "cold (fadvise DONTNEED before each variant)" if cfg.cold else "warm"},
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()},
        "corpus": {"dir": str(shards_dir), "records": manifest["records"], "real_tokens": manifest["real_tokens"],
                   "buckets": len(manifest["buckets"]), "padding_ratio": manifest["padding_ratio"],
                   "frames": sum(b["frames"] for b in manifest["buckets"])},
        "variants": summary,
        "reader_copy": copy_summary,
        "compression": {k: comp.get(k) for k in ("level", "ratio_per_bucket_dict", "ratio_global_dict",
                                                 "ratio_no_dict", "ratio_whole_file",
                                                 "per_bucket_dict_vs_whole_file")},
        "rows": rows,
    }


# --------------------------------------------------------------------------- output


def format_table(res: dict[str, Any]) -> str:
    c, e = res["corpus"], res["env"]
    lines = [f"corpus: {c['real_tokens']:,} real tokens, {c['records']:,} records, {c['buckets']} buckets, "
             f"{c['frames']:,} frames, padding {c['padding_ratio']:.1%}; page cache {e['page_cache']}; "
             f"{e['cpus']} CPUs; device {e['device']}{' (' + e['gpu'] + ')' if e['gpu'] else ''}; "
             f"io_uring: {e['io_uring_reason']}",
             f"medians of {res['config']['repeats']} interleaved repeats; per core = real tokens / process CPU s",
             "",
             f"{'variant':<16}{'Mtok/s wall':>12}{'x memmap':>10}{'Mtok/s/core':>13}{'x memmap':>10}"
             f"{'read p50 ms':>13}{'p90 ms':>9}{'p99 ms':>9}"]
    for name, s in res["variants"].items():
        lat = "".join(f"{s[k]:>{w}.3f}" if not math.isnan(s[k]) else f"{'-':>{w}}"
                      for k, w in (("read_latency_ms_p50", 13), ("read_latency_ms_p90", 9), ("read_latency_ms_p99", 9)))
        lines.append(f"{name:<16}{s['tokens_per_s'] / 1e6:>12.2f}{s['tokens_per_s_vs_memmap']:>10.2f}"
                     f"{s['tokens_per_s_per_core'] / 1e6:>13.2f}{s['tokens_per_s_per_core_vs_memmap']:>10.2f}{lat}")
    rc = res["reader_copy"]
    lines += ["", f"reader alone ({rc['memoryview']['backend']}, depth {rc['memoryview']['depth']}): "
                  f"memoryview {rc['memoryview']['mb_per_s']:.0f} MB/s ({rc['memoryview']['mb_per_s_per_core']:.0f}"
                  f" per core) vs bytes {rc['bytes']['mb_per_s']:.0f} MB/s ({rc['bytes']['mb_per_s_per_core']:.0f} "
                  f"per core)"]
    cp = res["compression"]

    def r(k: str) -> str:
        return f"{cp[k]:.3f}" if isinstance(cp.get(k), (int, float)) else "n/a"

    lines += [f"compression (zstd level {cp.get('level')}): per-bucket dict {r('ratio_per_bucket_dict')}x, "
              f"global dict {r('ratio_global_dict')}x, no dict {r('ratio_no_dict')}x, "
              f"whole file {r('ratio_whole_file')}x"]
    return "\n".join(lines)


def _write_out(res: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    j, c = out / f"loaders-bench-{stamp}.json", out / f"loaders-bench-{stamp}.csv"
    j.write_text(json.dumps(res, indent=2) + "\n")
    cols = ["variant", "metric", "median", "p20", "p80", "vs_memmap"]
    with open(c, "w") as fh:
        fh.write(",".join(cols + ["timestamp", "torch", "kernel"]) + "\n")
        for row in res["rows"]:
            fh.write(",".join(str(row[k]) for k in cols) + f",{res['env']['timestamp']},{res['env']['torch']},"
                     f"{res['env']['kernel']}\n")
    return [j, c]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/loaders_bench.py", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--tokens", type=int, default=BenchConfig.tokens, help="real tokens in the corpus")
    ap.add_argument("--micro-batch", type=int, default=BenchConfig.micro_batch)
    ap.add_argument("--seq-len", type=int, default=BenchConfig.seq_len)
    ap.add_argument("--depths", default="8,32,128", help="io_uring ring depths, comma-separated")
    ap.add_argument("--threads", type=int, default=BenchConfig.threads, help="thread-pool reader threads")
    ap.add_argument("--workers", type=int, default=BenchConfig.num_workers, help="decode threads")
    ap.add_argument("--repeats", type=int, default=BenchConfig.repeats)
    ap.add_argument("--zstd-level", type=int, default=BenchConfig.zstd_level)
    ap.add_argument("--cold", action="store_true", help="fadvise(DONTNEED) the corpus before each variant")
    ap.add_argument("--cache-dir", default=BenchConfig.cache_dir, help="where the corpus is built and reused")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: pinned blocks + h2d copies")
    ap.add_argument("--out", type=Path, help="also write the JSON object and CSV rows into this directory")
    a = ap.parse_args(argv)
    try:
        depths = tuple(int(x) for x in a.depths.split(",") if x.strip())
        cfg = BenchConfig(tokens=a.tokens, micro_batch=a.micro_batch, seq_len=a.seq_len, depths=depths,
                          threads=a.threads, num_workers=a.workers, repeats=a.repeats, zstd_level=a.zstd_level,
                          cold=a.cold, cache_dir=a.cache_dir, device=a.device)
    except ValueError as e:
        ap.error(str(e))
    res = run_bench(cfg)
    if a.out is not None:
        for p in _write_out(res, a.out):
            _log(f"wrote {p}")
    print(json.dumps(res) if a.json else format_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
