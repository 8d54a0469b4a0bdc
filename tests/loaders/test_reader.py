"""loaders.reader: both backends return the right bytes in request order; probe and fallback behave."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

import numpy as np
import pytest

from loaders import reader as R

URING_OK, URING_WHY = R.probe_io_uring()
BACKENDS = ["threadpool", pytest.param("io_uring", marks=pytest.mark.skipif(not URING_OK, reason=URING_WHY))]


@pytest.fixture(scope="module")
def random_file(tmp_path_factory):
    data = np.random.default_rng(1).integers(0, 256, 3 * 1024 * 1024 + 17, dtype=np.uint8).tobytes()
    path = tmp_path_factory.mktemp("reader") / "blob.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def _requests(fd: int, size: int, n: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        off = int(rng.integers(0, size))
        length = int(rng.integers(0, min(300_000, size - off) + 1))
        reqs.append((i, fd, off, length))
    reqs += [(n, fd, size - 100, 100), (n + 1, fd, 0, 0), (n + 2, fd, 5, 1)]  # up to EOF, empty, one byte
    return reqs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("depth", [1, 4, 64])
def test_backends_return_requested_bytes_in_order(random_file, backend, depth):
    fd, data = random_file
    reqs = _requests(fd, len(data), 150, seed=depth)
    with R.make_reader(backend, depth=depth, threads=3) as rd:
        got = [(k, bytes(v)) for k, v in rd.read_ordered(reqs)]
        assert [k for k, _ in got] == [r[0] for r in reqs]
        for (_, b), (_, _, off, n) in zip(got, reqs):
            assert b == data[off:off + n]
        # copy=True hands out bytes with the same contents
        got2 = list(rd.read_ordered(reqs[:20], copy=True))
        assert all(type(b) is bytes and b == data[o:o + n] for (_, b), (_, _, o, n) in zip(got2, reqs))
        st = rd.stats()
    assert st["reads"] == len(reqs) + 20
    assert st["bytes"] == sum(r[3] for r in reqs) + sum(r[3] for r in reqs[:20])
    assert 0 <= st["read_latency_ms_p50"] <= st["read_latency_ms_p90"] <= st["read_latency_ms_p99"] < 10_000


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_lifetime_and_export_safety(random_file, backend):
    fd, data = random_file
    reqs = [(i, fd, 4096 * i, 4096) for i in range(40)]  # equal lengths: a reused buffer would be overwritten
    with R.make_reader(backend, depth=4) as rd:
        gen = rd.read_ordered(reqs, hold=2)
        _, v0 = next(gen)
        next(gen), next(gen)
        assert bytes(v0) == data[:4096]          # still valid: 2 items requested after it, hold=2
        next(gen)
        with pytest.raises(ValueError):          # released once `hold` was exceeded
            bytes(v0)
        # a caller that keeps an export past the rule keeps correct bytes (the buffer is given up, not reused)
        k, v = next(gen)
        kept = np.frombuffer(v, np.uint8)
        for _ in gen:
            pass
        assert kept.tobytes() == data[4096 * k:4096 * (k + 1)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_name_fd_and_offset(random_file, backend):
    fd, data = random_file
    with R.make_reader(backend, depth=4) as rd:
        gen = rd.read_ordered([(0, fd, 0, 10), (1, fd, len(data) - 10, 20)])
        assert bytes(next(gen)[1]) == data[:10]  # results before the failure come first
        with pytest.raises(R.ReadError, match=rf"offset {len(data) - 10} of fd {fd}.*end of file"):
            next(gen)
        with pytest.raises(OSError, match="fd 9999") as ei:
            list(rd.read_ordered([(0, 9999, 128, 8)]))
        assert ei.value.errno == errno.EBADF


@pytest.mark.skipif(not URING_OK, reason=URING_WHY)
def test_uring_resubmits_short_reads(monkeypatch):
    # a pipe hands out what has been written so far: every read comes back short and is resubmitted
    results = []
    complete = R.UringReader._complete

    def spy(self, tag, res):
        results.append(res)
        return complete(self, tag, res)

    monkeypatch.setattr(R.UringReader, "_complete", spy)
    r, w = os.pipe()
    chunks = [os.urandom(n) for n in (1000, 1, 5000, 20000)]

    def writer():
        for c in chunks:
            time.sleep(0.02)
            os.write(w, c)

    t = threading.Thread(target=writer)
    t.start()
    try:
        with R.UringReader(depth=2) as rd:
            got = [bytes(v) for _, v in rd.read_ordered([("pipe", r, 0, sum(map(len, chunks)))])]
            assert got == [b"".join(chunks)]
        assert len(results) > 1 and sum(results) == sum(map(len, chunks))  # one request, several completions
    finally:
        t.join()
        os.close(r)
        os.close(w)


def test_probe_returns_bool_and_reason():
    ok, reason = R.probe_io_uring()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason


@pytest.mark.parametrize("err, disabled, words", [
    (errno.EPERM, 2, "kernel.io_uring_disabled=2"),
    (errno.EPERM, 0, "seccomp"),
    (errno.EINVAL, 0, "gVisor"),
    (errno.ENOSYS, 0, "kernel has no io_uring"),
    (errno.EMFILE, 0, "EMFILE"),
])
def test_probe_explains_failures(monkeypatch, err, disabled, words):
    class Failing:
        def __init__(self, depth):
            raise OSError(err, os.strerror(err))

    monkeypatch.setattr(R, "UringReader", Failing)
    monkeypatch.setattr(R, "_sysctl_io_uring_disabled", lambda: disabled)
    ok, reason = R.probe_io_uring()
    assert not ok and words in reason


def test_probe_without_liburing(monkeypatch):
    def missing():
        raise R.IoUringUnavailable("the liburing Python binding is not installed (test)")

    monkeypatch.setattr(R, "_import_liburing", missing)
    assert R.probe_io_uring() == (False, "the liburing Python binding is not installed (test)")


def test_explicit_io_uring_raises_with_reason_and_auto_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(R, "probe_io_uring", lambda: (False, "io_uring_setup: EPERM: blocked here (test)"))
    monkeypatch.setattr(R, "_probe_result", None)
    with pytest.raises(R.IoUringUnavailable, match=r"blocked here \(test\)"):
        R.make_reader("io_uring")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="loaders"):
        rd = R.make_reader("auto", depth=8)
    rd.close()
    assert isinstance(rd, R.ThreadPoolReader)
    lines = [r for r in caplog.records if r.name == "loaders"]
    assert len(lines) == 1 and "threadpool" in lines[0].getMessage() and "blocked here" in lines[0].getMessage()


def test_auto_logs_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="loaders"):
        rd = R.make_reader("auto", depth=8)
    rd.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "loaders"]
    assert len(lines) == 1 and rd.name in lines[0]
    assert rd.name == ("io_uring" if URING_OK else "threadpool")


def test_bad_arguments():
    with pytest.raises(ValueError, match="io_backend='nvme'"):
        R.make_reader("nvme")
    with pytest.raises(ValueError, match="depth=0"):
        R.ThreadPoolReader(2, 0)
