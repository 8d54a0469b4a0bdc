"""VLA loader benchmark: compression of the synthetic VLA corpus, frame decode alone, and VLAPipeline epochs.

    python benchmarks/vla_loader_bench.py [--samples 960] [--image-size 224] [--micro-batch 32]
                                          [--workers 1,2] [--repeats 3] [--device cpu|cuda] [--out DIR] [--json]

1. Corpus: ``--samples`` samples of ``loaders.synth``'s VLA corpus (3 x H x W images, instructions padded to 256
   tokens, 16 x 32 action chunks) written with ``VLAShardWriter`` (zstd level 3, 1 MiB frames, the per-column
   baselines on), cached under ``--cache-dir`` and reused while its parameters match. Its compression figures
   come from the manifest.
2. ``decode``: every frame read and decoded on the calling thread (``ShardSet.load_frame``), then the same with
   every image augmented (``AugmentSettings()``, the defaults): samples per second of that thread's CPU time.
3. Pipeline variants, one epoch each, consumed with no compute: ``VLAPipeline`` with augmentation off and on, at
   each ``--workers`` decode-thread count (io_uring where available). Figures: samples/s of wall time, samples/s
   per core (samples / process CPU seconds, every thread), and ``decode/samples_per_s`` (per busy decode-second).

Repeats run interleaved; the table shows medians, the JSON rows (long format: variant, metric, median, p20, p80)
p20/p80 too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from loaders.format import MANIFEST_NAME, ShardSet  # noqa: E402
from loaders.reader import probe_io_uring  # noqa: E402
from loaders.synth import VLASynthSpec, write_vla_shards  # noqa: E402
from loaders.vla import AugmentSettings, VLAPipeline, augment_image, sample_rng  # noqa: E402

_CORPUS_VERSION = 1  # bump when the corpus recipe changes, so caches are rebuilt


def _log(msg: str) -> None:
    print(f"[vla.bench] {msg}", file=sys.stderr, flush=True)


def build_corpus(samples: int, size: int, cache: Path) -> Path:
    out = cache / f"v{_CORPUS_VERSION}-n{samples}-px{size}" / "shards"
    if (out / MANIFEST_NAME).is_file():
        return out
    t = time.perf_counter()
    write_vla_shards(VLASynthSpec(num_samples=samples, image_size=(size, size)), out, zstd_level=3, num_workers=2,
                     overwrite=True)
    _log(f"built {samples} samples in {time.perf_counter() - t:.1f} s: {out}")
    return out


def _decode_alone(ss: ShardSet, augment: bool) -> dict[str, float]:
    settings, n = AugmentSettings(), 0
    c0 = time.thread_time()
    for f in range(ss.n_frames):
        fr = ss.load_frame(f)
        if augment:
            out = np.empty_like(fr.images)
            for i in range(len(out)):
                augment_image(fr.images[i], out[i], sample_rng(0, 0, int(ss.frame_first_rec[f]) + i), settings)
        n += len(fr.rec_length)
    return {"samples_per_s_per_core": n / (time.thread_time() - c0)}


def _epoch(ss: ShardSet, mb: int, workers: int, augment: bool, device: str) -> dict[str, float]:
    backend = "io_uring" if probe_io_uring()[0] else "threadpool"
    pl = VLAPipeline(ss, micro_batch_size=mb, num_workers=workers, io_backend=backend, epochs=1, device=device,
                     augment=AugmentSettings() if augment else None)
    n = 0
    c0, t0 = time.process_time(), time.perf_counter()
    try:
        for b in pl:
            n += b.samples
        if device == "cuda":
            torch.cuda.synchronize()  # note: the last copies must have landed before the clock stops
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        m = pl.metrics()
    finally:
        pl.close()
    return {"samples_per_s": n / wall, "samples_per_s_per_core": n / cpu,
            "decode_samples_per_s": m["decode/samples_per_s"]}


def run(a: argparse.Namespace) -> dict[str, Any]:
    shards = build_corpus(a.samples, a.image_size, Path(a.cache_dir))
    variants: list[tuple[str, Any]] = [("decode", lambda ss: _decode_alone(ss, False)),
                                       ("decode+augment", lambda ss: _decode_alone(ss, True))]
    for w in a.workers:
        for aug in (False, True):
            variants.append((f"pipeline w{w}{' augment' if aug else ''}",
                             lambda ss, w=w, aug=aug: _epoch(ss, a.micro_batch, w, aug, a.device)))
    runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
    with ShardSet(shards) as ss:
        manifest = ss.manifest
        for rep in range(a.repeats):
            for name, fn in variants:
                r = fn(ss)
                runs[name].append(r)
                _log(f"repeat {rep + 1}/{a.repeats} {name:>22}: " + ", ".join(f"{k} {v:,.0f}" for k, v in r.items()))
    rows = []
    for name, rs in runs.items():
        for metric in rs[0]:
            xs = [r[metric] for r in rs]
            rows.append({"variant": name, "metric": metric, "median": statistics.median(xs),
                         "p20": float(np.percentile(xs, 20)), "p80": float(np.percentile(xs, 80))})
    c = manifest["compression"]
    return {"env": {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
                    "torch": torch.__version__, "numpy": np.__version__, "cpus": os.cpu_count(), "device": a.device,
                    "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None},
            "corpus": {"dir": str(shards), "records": manifest["records"], "image_shape": manifest["image_shape"],
                       "text_len": manifest["text_len"], "action_shape": manifest["action_shape"],
                       "frames": manifest["buckets"][0]["frames"]},
            "compression": {k: c.get(k) for k in ("level", "frame_bytes", "ratio", "ratio_images", "ratio_actions",
                                                  "ratio_tokens", "ratio_whole_file")},
            "rows": rows}


def format_table(res: dict[str, Any]) -> str:
    c, cp = res["corpus"], res["compression"]
    lines = [f"corpus: {c['records']} samples, images {c['image_shape']}, text {c['text_len']}, actions "
             f"{c['action_shape']}, {c['frames']} frames; {res['env']['cpus']} CPUs, device {res['env']['device']}",
             f"compression (zstd {cp['level']}, {cp['frame_bytes'] // 1024} KiB frames): {cp['ratio']:.3f}x; each "
             f"column alone: images {cp['ratio_images']:.3f}x, actions {cp['ratio_actions']:.3f}x, tokens "
             f"{cp['ratio_tokens']:.3f}x", "", f"{'variant':<24}{'metric':<26}{'median':>12}{'p20':>12}{'p80':>12}"]
    for r in res["rows"]:
        lines.append(f"{r['variant']:<24}{r['metric']:<26}{r['median']:>12,.0f}{r['p20']:>12,.0f}{r['p80']:>12,.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/vla_loader_bench.py", description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=960)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                    help="decode-thread counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--cache-dir", default=".cache/vla-bench")
    ap.add_argument("--out", type=Path, help="also write the JSON object and CSV rows into this directory")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args(argv)
    res = run(a)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        (a.out / f"vla-bench-{stamp}.json").write_text(json.dumps(res, indent=2) + "\n")
        with open(a.out / f"vla-bench-{stamp}.csv", "w") as fh:
            fh.write("variant,metric,median,p20,p80,timestamp,torch,device,gpu\n")
            for r in res["rows"]:
                fh.write(f"{r['variant']},{r['metric']},{r['median']},{r['p20']},{r['p80']},{res['env']['timestamp']},"
                         f"{res['env']['torch']},{res['env']['device']},{res['env']['gpu'] or ''}\n")
    print(json.dumps(res) if a.json else format_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
