"""Check a loongbin shard directory end to end (``python -m loaders.verify DIR``).

Checks, in order, stopping at the first bad item:

1. the directory opens as complete (``ShardSet``: manifest says complete,
   index header, magic, version, columns, the index's checksum against the
   manifest, dictionaries and data files present, and the index structure:
   buckets sorted with contiguous frame ranges, frames of a bucket back to back
   from offset 0, each data file exactly as long as its frames, records
   numbered contiguously, record offsets back to back inside each frame, every
   record in the bucket its length rounds to, each frame's decompressed size
   equal to its records' tokens);
2. the manifest's checksum of every dictionary (xxh3-64);
3. the manifest against the index (records, real tokens, buckets, padding,
   compressed and raw bytes);
4. every frame: read, xxh3 of the compressed bytes, zstd decompression with
   the bucket's dictionary (zstd's content checksum included), decompressed
   size, token ids < vocabulary size, position ids restarting at 0 at every
   record and counting up by one, loss mask values 0/1.

A shard set of vla records (``record_kind: vla``) gets the same checks, with
its own structure (record kind and shapes in the index header, each frame's
size = its tokens plus its records' images and actions), the manifest's
kind, shapes and text length against the index in 3, and in 4 every action
finite instead of the position and mask checks.

Prints the summary (buckets, records, real tokens, padding ratio, compression
ratios) and ``OK``; ``--json`` prints the summary as JSON instead. On the
first bad item, prints one line naming the file and the frame (or the index
column / record / dictionary / manifest key) and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from loaders._layout import file_xxh3
from loaders.format import MANIFEST_NAME, ShardFormatError, ShardSet, VLAFrame

__all__ = ["verify", "summary", "format_summary", "main"]

def _check_checksums(s: ShardSet) -> None:
    sums = s.manifest.get("checksums")
    if sums is None:
        return  # written before checksums were recorded: the per-frame checks still run
    for d in sorted({int(x) for x in s.bucket_dict.tolist() if x >= 0}):
        path = s.root / "dicts" / f"{d}.zdict"
        want = sums.get("dicts", {}).get(str(d))
        if want is None:
            raise ShardFormatError(f"{s.root / MANIFEST_NAME}: checksums.dicts has no entry for dictionary {d}")
        if file_xxh3(path) != want:
            raise ShardFormatError(f"{path}: dictionary {d}: checksum mismatch (xxh3-64 differs from "
                                   f"{MANIFEST_NAME}): the dictionary is corrupt")


def _check_data_sizes(s: ShardSet) -> None:
    """Each data file exactly as long as its frames (a shorter one is refused when the directory opens)."""
    for b, L in enumerate(s.bucket_length.tolist()):
        frames = s.frames_of_bucket(b)
        end = int(sum(int(s.frame_clen[f]) for f in frames))
        path = s.data_path_for_length(L)
        size = path.stat().st_size
        if size != end:
            raise ShardFormatError(f"{path}: {size} bytes, its {len(frames)} frames add up to {end} (trailing bytes)")


def _check_manifest(s: ShardSet) -> None:
    m, mp = s.manifest, s.root / MANIFEST_NAME
    rlen = np.asarray(s.rec_length, np.int64)
    lengths = np.asarray(s.bucket_length, np.int64).tolist()
    recs_per_bucket = np.add.reduceat(np.asarray(s.frame_n_rec, np.int64), np.asarray(s.bucket_first_frame, np.int64))
    expect = {
        "vocab_size": s.vocab_size, "bucket_width": s.bucket_width, "records": s.n_records,
        "real_tokens": int(rlen.sum()), "padded_tokens": int((recs_per_bucket * np.asarray(lengths)).sum()),
    }
    for key, want in expect.items():
        if m.get(key) != want:
            raise ShardFormatError(f"{mp}: {key} is {m.get(key)!r}, the index says {want}")
    got = [(b.get("length"), b.get("records")) for b in m.get("buckets", [])]
    want = list(zip(lengths, recs_per_bucket.tolist()))
    if got != want:
        raise ShardFormatError(f"{mp}: buckets (length, records) {got} differ from the index's {want}")
    ratio = 1 - expect["real_tokens"] / expect["padded_tokens"]
    if abs(m.get("padding_ratio", -1) - ratio) > 1e-6:
        raise ShardFormatError(f"{mp}: padding_ratio {m.get('padding_ratio')!r}, the index gives {ratio:.6f}")
    if s.record_kind == "vla":
        for key, want in (("image_shape", list(s.image_shape)), ("action_shape", list(s.action_shape)),
                          ("text_len", int(s.bucket_length[0]))):
            if m.get(key) != want:
                raise ShardFormatError(f"{mp}: {key} is {m.get(key)!r}, the index says {want}")
    comp = m.get("compression", {})
    for key, col in (("raw_bytes", s.frame_dlen), ("per_bucket_dict_bytes", s.frame_clen)):
        total = int(np.asarray(col, np.int64).sum())
        if comp.get(key) != total:
            raise ShardFormatError(f"{mp}: compression.{key} is {comp.get(key)!r}, the frames add up to {total}")


def _check_frame(s: ShardSet, f: int) -> int:
    """Decode one frame with every check; returns its token count."""
    fr = s.load_frame(f)  # size, xxh3, zstd (with content checksum), dlen, coverage, ids < vocab
    where = f"{s.data_path(f)}: frame {f}"
    if isinstance(fr, VLAFrame):
        finite = np.isfinite(fr.actions).reshape(len(fr.actions), -1).all(1)
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            raise ShardFormatError(f"{where}: record {int(s.frame_first_rec[f]) + i}: actions hold a NaN or an "
                                   f"infinity")
        return len(fr.tokens)
    pos = fr.position_ids.astype(np.int64)
    starts = np.zeros(len(pos), bool)
    starts[fr.rec_offset] = True
    # inside a record, a position is 0 (a new document) or the previous one + 1; a record starts at 0
    ok = np.empty(len(pos), bool)
    ok[0] = pos[0] == 0
    ok[1:] = np.where(starts[1:], pos[1:] == 0, (pos[1:] == 0) | (pos[1:] == pos[:-1] + 1))
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        rec = int(s.frame_first_rec[f]) + int(np.searchsorted(fr.rec_offset, i, side="right")) - 1
        raise ShardFormatError(f"{where}: record {rec}: position id {pos[i]} at token {i} of the frame breaks "
                               f"the 0, 1, 2, ... sequence")
    if len(fr.loss_mask) and int(fr.loss_mask.max()) > 1:
        i = int(np.argmax(fr.loss_mask > 1))
        raise ShardFormatError(f"{where}: loss mask value {int(fr.loss_mask[i])} at token {i}, expected 0 or 1")
    return len(fr.tokens)


def verify(root: str | os.PathLike, *, progress: bool = False) -> dict:
    """Run every check on a shard directory; returns ``summary()`` of it.

    Raises ShardFormatError on the first bad item, naming the file and the
    frame, record, column, dictionary or manifest key.
    """
    with ShardSet(root) as s:
        _check_checksums(s)
        _check_data_sizes(s)
        _check_manifest(s)
        frames = range(s.n_frames)
        if progress:
            from tqdm import tqdm

            frames = tqdm(frames, desc="verify", unit="frame", file=sys.stderr, leave=False,
                          disable=not sys.stderr.isatty())
        tokens = sum(_check_frame(s, f) for f in frames)
        if tokens != s.manifest["real_tokens"]:
            raise ShardFormatError(f"{s.root / MANIFEST_NAME}: real_tokens {s.manifest['real_tokens']}, the frames "
                                   f"hold {tokens}")
        return summary(s.manifest, s.root, frames=s.n_frames)


def summary(manifest: dict, root: str | os.PathLike | None = None, *, frames: int | None = None) -> dict:
    """The headline figures of a manifest, flat (what the CLIs print)."""
    c = manifest.get("compression", {})
    b = manifest.get("buckets", [])
    out = {
        "dir": str(root) if root is not None else None,
        "buckets": len(b), "bucket_lengths": [x["length"] for x in b],
        "records": manifest["records"], "frames": frames if frames is not None else sum(x["frames"] for x in b),
        "real_tokens": manifest["real_tokens"], "padded_tokens": manifest["padded_tokens"],
        "padding_ratio": manifest["padding_ratio"], "vocab_size": manifest["vocab_size"],
        "token_dtype": manifest.get("token_dtype"),
        "input_token_bytes": c.get("input_token_bytes"), "stored_bytes": c.get("stored_bytes"),
        "compression_ratio": c.get("ratio"),  # None in a manifest written before the input-based ratio
        "ratio_plain_zstd": c.get("ratio_plain_zstd"),
        "raw_bytes": c.get("raw_bytes"), "compressed_bytes": c.get("per_bucket_dict_bytes"),
        "record_ratio_per_bucket_dict": c.get("ratio_per_bucket_dict"),
    }
    for k in ("ratio_global_dict", "ratio_no_dict", "ratio_whole_file"):
        if k in c:
            out[k] = c[k]
    out["record_kind"] = manifest.get("record_kind", "tokens")
    if out["record_kind"] == "vla":
        out.update({k: manifest.get(k) for k in ("text_len", "image_shape", "action_shape")})
        out.update({k: c.get(k) for k in ("input_bytes", "ratio_images", "ratio_actions", "ratio_tokens")})
    p = manifest.get("preprocess")
    if p:
        out.update({k: p[k] for k in ("documents_read", "pieces_dropped", "tokens_dropped", "elapsed_s",
                                      "tokens_per_s") if k in p})
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def format_summary(manifest: dict, root: str | os.PathLike | None = None) -> str:
    """A few human-readable lines about a shard directory's manifest."""
    s = summary(manifest, root)
    if s["record_kind"] == "vla":
        return _format_vla(manifest, s)
    L = s["bucket_lengths"]
    lines = [f"{s['dir'] or 'shards'}: {s['buckets']} buckets ({L[0]}..{L[-1]} tokens), {s['records']:,} records "
             f"in {s['frames']:,} frames, vocab {s['vocab_size']:,} ({s['token_dtype']})",
             f"tokens: {s['real_tokens']:,} real, {s['padded_tokens']:,} padded: padding ratio "
             f"{s['padding_ratio']:.2%}"]
    if s["compression_ratio"] is not None:
        lines.append(f"compression: {s['compression_ratio']:.2f}x of the input's token bytes, dictionaries "
                     f"included ({_mb(s['input_token_bytes'])} -> {_mb(s['stored_bytes'])}); plain zstd of the "
                     f"input {s['ratio_plain_zstd']:.2f}x")
    if s["record_ratio_per_bucket_dict"] is not None:
        line = (f"record payloads: {s['record_ratio_per_bucket_dict']:.2f}x with per-bucket dictionaries "
                f"({_mb(s['raw_bytes'])} -> {_mb(s['compressed_bytes'])}, dictionaries not counted)")
        base = [f"{name} {s[k]:.2f}x" for name, k in (("global dict", "ratio_global_dict"),
                                                      ("no dict", "ratio_no_dict"),
                                                      ("whole file", "ratio_whole_file")) if k in s]
        lines.append(line + ("; " + ", ".join(base) if base else ""))
    p = manifest.get("preprocess")
    if p and "elapsed_s" in p:
        lines.append(f"preprocess: {p['documents_read']:,} documents, {p['input_tokens']:,} tokens in "
                     f"{p['elapsed_s']:.1f} s ({p['tokens_per_s'] / 1e6:.2f} M tokens/s); chunked "
                     f"{p['documents_chunked']:,}, packed {p['pieces_packed']:,} pieces into "
                     f"{p['records_packed']:,} records, dropped {p['pieces_dropped']:,} pieces "
                     f"({p['tokens_dropped']:,} tokens)")
    return "\n".join(lines)


def _format_vla(manifest: dict, s: dict) -> str:
    C, H, W = s["image_shape"]
    K, A = s["action_shape"]
    lines = [f"{s['dir'] or 'shards'}: {s['records']:,} vla records in {s['frames']:,} frames: images {C} x {H} x {W} "
             f"uint8, instructions up to {s['text_len']} tokens (vocab {s['vocab_size']:,}, {s['token_dtype']}), "
             f"actions {K} x {A} float32",
             f"tokens: {s['real_tokens']:,} real, {s['padded_tokens']:,} padded to text_len: padding ratio "
             f"{s['padding_ratio']:.2%}"]
    if s["compression_ratio"] is not None:
        apart = [f"{name} {s[k]:.2f}x" for name, k in (("images", "ratio_images"), ("actions", "ratio_actions"),
                                                        ("tokens", "ratio_tokens")) if s.get(k)]
        lines.append(f"compression: {s['compression_ratio']:.2f}x ({_mb(s['input_bytes'])} -> {_mb(s['stored_bytes'])})"
                     + (f"; each column alone: {', '.join(apart)}" if apart else ""))
    p = manifest.get("preprocess")
    if p and "elapsed_s" in p:
        lines.append(f"preprocess: {p['samples']:,} samples in {p['elapsed_s']:.1f} s ({p['samples_per_s']:,.0f} "
                     f"samples/s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loaders.verify", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", metavar="DIR", help="shard directory written by python -m loaders.preprocess")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    try:
        result = verify(args.dir, progress=not args.json)
    except Exception as e:  # noqa: BLE001 - whatever is wrong, the answer is one line and exit 1
        msg = " ".join(str(e).split("\n"))
        if not isinstance(e, (ShardFormatError, OSError)):  # a damage no check anticipated
            msg = f"{args.dir}: {type(e).__name__}: {msg}"
        if args.json:
            print(json.dumps({"ok": False, "dir": args.dir, "error": msg}))
        print(f"error: {msg}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"ok": True, **result}, indent=2))
    else:
        manifest = json.loads((Path(args.dir) / MANIFEST_NAME).read_text())
        print(format_summary(manifest, args.dir))
        print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
