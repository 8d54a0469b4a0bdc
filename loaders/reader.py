"""Ordered asynchronous reads: io_uring (through liburing) with a thread-pool fallback.

``make_reader(backend, depth, threads)`` returns a reader (``UringReader`` or ``ThreadPoolReader``) whose
``read_ordered(requests, hold=0, copy=False)`` keeps up to ``depth`` reads in flight and yields ``(key, view)`` in
request order; a view is valid until ``hold`` further items have been requested. The backends, the buffer
lifetime rule and what the latency figures mean are described in docs/loaders.md ("Ordered reads").
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Hashable, Iterable, Iterator

import numpy as np

__all__ = [
    "ReadRequest",
    "ReadError",
    "IoUringUnavailable",
    "OrderedReader",
    "UringReader",
    "ThreadPoolReader",
    "probe_io_uring",
    "make_reader",
    "BACKENDS",
]

log = logging.getLogger("loaders")

ReadRequest = tuple[Hashable, int, int, int]
"""``(key, fd, offset, length)``: read ``length`` bytes at ``offset`` of ``fd``; ``key`` comes back with them."""

BACKENDS = ("auto", "io_uring", "threadpool")
# Latency samples kept for quantiles: enough for stable p99s over the recent
# past (~a few seconds of reads at high rates), 512 KiB of memory.
_LATENCY_WINDOW = 65536
# Ring entries are capped by the kernel (IORING_MAX_ENTRIES).
_MAX_DEPTH = 32768


class ReadError(OSError):
    """A read failed or hit end of file early; the message names the fd, its path, the offset and the length."""


class IoUringUnavailable(RuntimeError):
    """io_uring was asked for explicitly but cannot be used here; the message carries the probe's reason."""


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def _where(fd: int, offset: int, length: int) -> str:
    return f"read of {length} bytes at offset {offset} of fd {fd} ({_fd_path(fd)})"


# --------------------------------------------------------------------------- shared machinery


class _Stats:
    """Counters and a latency window, shared by reader threads (appends to a deque are atomic)."""

    def __init__(self) -> None:
        self.lat_ms: collections.deque[float] = collections.deque(maxlen=_LATENCY_WINDOW)
        self.reads = 0
        self.bytes = 0
        self.lat_sum_ms = 0.0  # over every read (the window above keeps the recent ones for quantiles)
        self.t_first: float | None = None  # perf_counter of the first submit
        self.t_last: float | None = None   # perf_counter of the latest completion
        self._lock = threading.Lock()

    def submitted(self, t: float) -> None:
        if self.t_first is None:
            self.t_first = t

    def completed(self, t_submit: float, t_done: float, nbytes: int) -> None:
        ms = (t_done - t_submit) * 1e3
        self.lat_ms.append(ms)
        with self._lock:
            self.reads += 1
            self.lat_sum_ms += ms
            self.bytes += nbytes
            if self.t_last is None or t_done > self.t_last:
                self.t_last = t_done

    def snapshot(self) -> dict[str, float]:
        lat = np.fromiter(tuple(self.lat_ms), np.float64)
        q = np.percentile(lat, [50, 90, 99]) if lat.size else [float("nan")] * 3
        span = (self.t_last - self.t_first) if (self.t_first is not None and self.t_last is not None) else 0.0
        return {
            "reads": self.reads,
            "bytes": self.bytes,
            "read_latency_ms_p50": float(q[0]),
            "read_latency_ms_p90": float(q[1]),
            "read_latency_ms_p99": float(q[2]),
            "read_latency_ms_sum": self.lat_sum_ms,
            "wall_s": span,
            "mb_per_s": self.bytes / 1e6 / span if span > 0 else float("nan"),
        }


class _Slot:
    """One request in flight or waiting to be handed out."""

    __slots__ = ("key", "fd", "offset", "length", "buf", "got", "done", "error", "t0", "tail", "future")

    def __init__(self, key: Hashable, fd: int, offset: int, length: int, buf: bytearray) -> None:
        self.key, self.fd, self.offset, self.length, self.buf = key, fd, offset, length, buf
        self.got = 0
        self.done = False
        self.error: BaseException | None = None
        self.t0 = 0.0
        self.tail: bytearray | None = None  # io_uring: target of a resubmitted short read
        self.future: Future | None = None   # thread pool


class OrderedReader:
    """Base of both backends: the buffer pool, the lease rule, stats and the ordered generator."""

    name = "?"

    def __init__(self, depth: int) -> None:
        if not isinstance(depth, int) or not 1 <= depth <= _MAX_DEPTH:
            raise ValueError(f"depth={depth!r}: expected an int in 1..{_MAX_DEPTH}")
        self.depth = depth
        self._free: list[bytearray] = []
        self._stats = _Stats()
        self._busy = threading.Lock()
        self._closed = False

    # -- pool
    def _take(self, n: int) -> bytearray:
        if not self._free:
            return bytearray(n)
        buf = self._free.pop()
        d = n - len(buf)
        if d > 0:
            buf.extend(bytes(d))  # CPython over-allocates: steady sizes stop reallocating
        elif d < 0:
            del buf[n:]
        return buf

    def _give_back(self, buf: bytearray, view: memoryview | None) -> None:
        """Return a handed-out buffer to the pool unless the caller still holds an export of it."""
        if view is not None:
            try:
                view.release()
            except BufferError:
                return  # something derived from the view is alive: leave the bytearray to it
        try:
            buf.append(0)  # raises BufferError while any export (a slice of the view...) is alive
            buf.pop()
        except BufferError:
            return
        if len(self._free) < self.depth * 2 + 8:
            self._free.append(buf)

    def stats(self) -> dict[str, float]:
        """Reads, bytes, read latency quantiles in ms (submit to completion) and MB/s over the reading span."""
        return self._stats.snapshot()

    # -- the ordered generator
    def read_ordered(self, requests: Iterable[ReadRequest], *, hold: int = 0,
                     copy: bool = False) -> Iterator[tuple[Hashable, memoryview | bytes]]:
        """Yield ``(key, data)`` for each request, in request order, with up to ``depth`` reads in flight.

        ``data`` is a memoryview valid until ``hold`` further items have been
        requested (see docs/loaders.md, "Ordered reads"), or ``bytes`` with ``copy=True``.
        A failed read raises when its turn comes (earlier results are yielded
        first). Closing the generator early waits for the reads in flight.
        """
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if hold < 0:
            raise ValueError(f"hold={hold}: expected >= 0")
        return self._ordered(iter(requests), hold, copy)

    def _ordered(self, it: Iterator[ReadRequest], hold: int, copy: bool):
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(f"{type(self).__name__}: another read_ordered() iteration is open on this reader")
        window: collections.deque[_Slot] = collections.deque()
        leased: collections.deque[tuple[bytearray, memoryview | None]] = collections.deque()
        exhausted = False
        try:
            while True:
                while len(leased) > hold:
                    self._give_back(*leased.popleft())
                new = []
                while not exhausted and len(window) < self.depth:
                    try:
                        key, fd, offset, length = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    if length < 0 or offset < 0:
                        raise ValueError(f"request {key!r}: offset={offset}, length={length}: expected >= 0")
                    s = _Slot(key, fd, offset, length, self._take(length))
                    window.append(s)
                    new.append(s)
                if new:
                    self._submit(new)
                if not window:
                    return
                head = window[0]
                self._wait(head)
                window.popleft()
                if head.error is not None:
                    leased.append((head.buf, None))
                    raise head.error
                if copy:
                    data: memoryview | bytes = bytes(head.buf)
                    leased.append((head.buf, None))
                else:
                    data = memoryview(head.buf)
                    leased.append((head.buf, data))
                yield head.key, data
        finally:
            try:
                self._drain(window)  # the kernel / workers may still write into these buffers
            finally:
                self._busy.release()

    # backend hooks
    def _submit(self, slots: list[_Slot]) -> None:
        raise NotImplementedError

    def _wait(self, slot: _Slot) -> None:
        raise NotImplementedError

    def _drain(self, window: collections.deque[_Slot]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "OrderedReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------- io_uring


def _import_liburing():
    try:
        import liburing
    except ImportError as e:
        raise IoUringUnavailable(f"the liburing Python binding is not installed ({e}); "
                                 f"`pip install liburing` (Linux only)") from None
    return liburing


class UringReader(OrderedReader):
    """Ordered reads through one io_uring ring of ``depth`` entries (see docs/loaders.md, "Ordered reads")."""

    name = "io_uring"

    def __init__(self, depth: int = 64) -> None:
        super().__init__(depth)
        self._lu = lu = _import_liburing()
        self._ring = lu.Ring()
        lu.io_uring_queue_init(depth, self._ring, 0)  # raises OSError(errno) where io_uring is unusable
        self._cqe = lu.Cqe()
        self._efd = -1
        try:
            self._efd = os.eventfd(0, os.EFD_CLOEXEC)
            lu.io_uring_register_eventfd(self._ring, self._efd)
        except BaseException:
            self.close()
            raise
        self._inflight: dict[int, _Slot] = {}
        self._tag = 0

    def _prep(self, s: _Slot, buf: bytearray, offset: int) -> None:
        lu = self._lu
        sqe = lu.io_uring_get_sqe(self._ring)
        if sqe is None:  # cannot happen while in flight <= depth <= entries; submit and retry anyway
            lu.io_uring_submit(self._ring)
            sqe = lu.io_uring_get_sqe(self._ring)
            if sqe is None:
                raise RuntimeError("io_uring: no free submission entry")
        # note: prep_read must not fail after get_sqe, or a stale entry is submitted; buf is always a bytearray
        lu.io_uring_prep_read(sqe, s.fd, buf, offset)
        self._tag += 1
        lu.io_uring_sqe_set_data64(sqe, self._tag)
        self._inflight[self._tag] = s

    def _submit(self, slots: list[_Slot]) -> None:
        t = time.perf_counter()
        self._stats.submitted(t)
        n = 0
        for s in slots:
            s.t0 = t
            if s.length == 0:
                s.done = True
                self._stats.completed(t, t, 0)
                continue
            self._prep(s, s.buf, s.offset)
            n += 1
        if n:
            self._lu.io_uring_submit(self._ring)

    def _complete(self, tag: int, res: int) -> bool:
        """Handle one completion; returns True if a read was resubmitted."""
        s = self._inflight.pop(tag)
        if res == -errno.EINTR or res == -errno.EAGAIN:
            self._prep(s, s.tail if s.tail is not None else s.buf, s.offset + s.got)
            return True
        if res < 0:
            s.error = ReadError(-res, f"io_uring {_where(s.fd, s.offset, s.length)} failed: "
                                      f"{os.strerror(-res)}")
            s.done = True
            return False
        if s.tail is not None:  # the rest of a short read landed in the tail buffer
            s.buf[s.got:s.got + res] = memoryview(s.tail)[:res]
        s.got += res
        if s.got == s.length:
            s.done = True
            s.tail = None
            self._stats.completed(s.t0, time.perf_counter(), s.length)
            return False
        if res == 0:
            s.error = ReadError(errno.EIO, f"io_uring {_where(s.fd, s.offset, s.length)}: unexpected end of "
                                           f"file after {s.got} bytes")
            s.done = True
            return False
        # short read: read the rest into a tail buffer (the binding reads into whole bytearrays only)
        s.tail = bytearray(s.length - s.got)
        self._prep(s, s.tail, s.offset + s.got)
        return True

    def _reap(self, block: bool) -> None:
        """Handle every completion that is ready; if ``block``, wait for at least one first."""
        lu, ring, cqe = self._lu, self._ring, self._cqe
        got = resubmit = False
        while True:
            try:
                lu.io_uring_peek_cqe(ring, cqe)
            except BlockingIOError:
                if got or not block:
                    break
                os.eventfd_read(self._efd)  # note: blocks without the GIL, unlike io_uring_wait_cqe
                continue
            c = cqe[0]
            tag = c.user_data
            try:
                res = c.res
            except OSError as e:  # the binding raises for a negative res instead of returning it
                res = -(e.errno or errno.EIO)
            lu.io_uring_cqe_seen(ring, c)
            resubmit |= self._complete(tag, res)
            got = True
        if resubmit:
            lu.io_uring_submit(ring)

    def _wait(self, slot: _Slot) -> None:
        self._reap(block=False)  # timestamp what already completed
        while not slot.done:
            self._reap(block=True)

    def _drain(self, window: collections.deque[_Slot]) -> None:
        while self._inflight:
            self._reap(block=True)

    def close(self) -> None:
        if getattr(self, "_ring", None) is not None and not self._closed:
            if self._inflight:
                self._drain(collections.deque())
            if self._efd >= 0:
                try:
                    self._lu.io_uring_unregister_eventfd(self._ring)
                except OSError:
                    pass
                os.close(self._efd)
                self._efd = -1
            self._lu.io_uring_queue_exit(self._ring)
        super().close()


# --------------------------------------------------------------------------- thread pool


class ThreadPoolReader(OrderedReader):
    """Ordered reads with ``os.preadv`` from ``threads`` worker threads, up to ``depth`` in flight."""

    name = "threadpool"

    def __init__(self, threads: int = 4, depth: int = 64) -> None:
        super().__init__(depth)
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads={threads!r}: expected an int >= 1")
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="loaders-read")

    def _read(self, s: _Slot) -> None:
        view = memoryview(s.buf)
        try:
            while s.got < s.length:
                n = os.preadv(s.fd, [view[s.got:]], s.offset + s.got)
                if n == 0:
                    raise ReadError(errno.EIO, f"{_where(s.fd, s.offset, s.length)}: unexpected end of file "
                                               f"after {s.got} bytes")
                s.got += n
        except ReadError:
            raise
        except OSError as e:
            raise ReadError(e.errno, f"{_where(s.fd, s.offset, s.length)} failed: {e.strerror}") from None
        finally:
            view.release()
        self._stats.completed(s.t0, time.perf_counter(), s.length)

    def _submit(self, slots: list[_Slot]) -> None:
        t = time.perf_counter()
        self._stats.submitted(t)
        for s in slots:
            s.t0 = t
            s.future = self._pool.submit(self._read, s)

    def _wait(self, slot: _Slot) -> None:
        try:
            slot.future.result()
        except BaseException as e:  # handed to the caller in order by _ordered
            slot.error = e
        slot.done = True

    def _drain(self, window: collections.deque[_Slot]) -> None:
        for s in window:
            if s.future is not None and not s.future.cancel():
                try:
                    s.future.result()
                except BaseException:
                    pass

    def close(self) -> None:
        if not self._closed:
            self._pool.shutdown(wait=True, cancel_futures=True)
        super().close()


# --------------------------------------------------------------------------- probe and factory


def _sysctl_io_uring_disabled() -> int | None:
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _explain(err: int, during: str) -> str:
    name = errno.errorcode.get(err, str(err))
    if err == errno.EPERM:
        disabled = _sysctl_io_uring_disabled()
        if disabled == 2:
            return f"io_uring is disabled by sysctl kernel.io_uring_disabled=2 ({during}: EPERM)"
        if disabled == 1:
            return (f"io_uring is restricted by sysctl kernel.io_uring_disabled=1 and this process is not in "
                    f"kernel.io_uring_group ({during}: EPERM)")
        return (f"{during}: EPERM: io_uring is blocked by a seccomp filter or container policy (container "
                f"runtimes' default seccomp profiles often deny io_uring_setup)")
    if err == errno.EINVAL:
        return (f"{during}: EINVAL: the kernel or sandbox rejects the ring setup; sandboxes such as gVisor "
                f"implement io_uring only partly or not at all")
    if err == errno.ENOSYS:
        return (f"{during}: ENOSYS: the kernel has no io_uring (it needs Linux >= 5.6 for IORING_OP_READ, "
                f"built with CONFIG_IO_URING)")
    if err == errno.ENOMEM:
        return (f"{during}: ENOMEM: the ring could not be allocated (kernels before 5.12 charge rings to "
                f"RLIMIT_MEMLOCK: raise `ulimit -l`)")
    return f"{during}: {name}: {os.strerror(err)}"


def probe_io_uring() -> tuple[bool, str]:
    """Create a ring and read a temporary file through it; ``(ok, reason)`` with the reason in words."""
    try:
        lu = _import_liburing()
    except IoUringUnavailable as e:
        return False, str(e)
    try:
        rd = UringReader(depth=2)
    except OSError as e:
        return False, _explain(e.errno or 0, "io_uring_setup")
    payload = os.urandom(4096 + 123)
    try:
        with rd, tempfile.TemporaryFile() as fh:
            fh.write(payload)
            fh.flush()
            fd = fh.fileno()
            got = [bytes(v) for _, v in rd.read_ordered([(0, fd, 0, 4096), (1, fd, 4096, 123)])]
    except OSError as e:
        return False, _explain(e.errno or 0, "a test read through the ring")
    if b"".join(got) != payload:
        return False, "a test read through the ring returned wrong bytes"
    ver = f"{lu.liburing_version_major()}.{lu.liburing_version_minor()}" if hasattr(lu, "liburing_version_major") \
        else "?"
    return True, f"io_uring works (kernel {os.uname().release}, liburing {ver})"


_probe_result: tuple[bool, str] | None = None
_probe_lock = threading.Lock()


def _probe_once() -> tuple[bool, str]:
    global _probe_result
    with _probe_lock:
        if _probe_result is None:
            _probe_result = probe_io_uring()
        return _probe_result


def make_reader(backend: str = "auto", depth: int = 64, threads: int = 4) -> OrderedReader:
    """A reader for ``backend``: ``"io_uring"``, ``"threadpool"``, or ``"auto"`` (io_uring where it works).

    ``auto`` probes io_uring once per process and logs one line on logger
    ``"loaders"`` naming the backend and, on fallback, why. An explicit
    ``"io_uring"`` that cannot work raises ``IoUringUnavailable`` with the
    probe's reason.
    """
    if backend not in BACKENDS:
        raise ValueError(f"io_backend={backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "threadpool":
        log.info("io backend: threadpool (%d threads, depth %d), as configured", threads, depth)
        return ThreadPoolReader(threads, depth)
    ok, reason = _probe_once()
    if not ok:
        if backend == "io_uring":
            raise IoUringUnavailable(f"io_backend='io_uring' was requested but io_uring is unavailable: {reason}; "
                                     f"use io_backend='auto' or 'threadpool'")
        log.info("io backend: threadpool (%d threads, depth %d): io_uring unavailable: %s",
                 threads, depth, reason)
        return ThreadPoolReader(threads, depth)
    log.info("io backend: io_uring (depth %d)%s", depth, ", as configured" if backend == "io_uring" else "")
    return UringReader(depth)
