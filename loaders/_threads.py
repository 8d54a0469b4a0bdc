"""The background side of a batch pipeline: a reader thread (ordered async reads of the plans' frames, handed to
the decode workers), an assembler thread (records of decoded frames into staging blocks, one batch at a time) and
the queue between them and the consumer's ``next()``. docs/loaders.md ("The batch pipeline") describes them.

``PipelineThreads`` is the base class of ``loaders.pipeline.BatchPipeline`` (and so of ``VLAPipeline``), which
provides what the threads read: the plans (``_plan``, ``_positions``), the shards, the reader, the staging ring,
``_assemble`` (one batch into a block) and the counters they add to.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

import torch

from ._staging import POLL_S, Batch, StagingRing
from .format import Frame

__all__ = ["PipelineThreads", "Stopped"]


class Stopped(Exception):
    """Internal: a background thread noticed close()."""


_END = object()


class PipelineThreads:
    """The threads of a batch pipeline, their start and stop, and the consumer's side of their queue."""

    # -- lifecycle
    def _start_threads(self) -> None:
        self._start = self._pos
        self._stop = threading.Event()
        self._cv = threading.Condition()
        self._store: dict[tuple[int, int], list] = {}   # (epoch, frame) -> [future, records left]
        self._assembled = 0                              # batches assembled since _start
        self._reader_error: BaseException | None = None
        self._reader_done = False
        self._queue: queue.Queue = queue.Queue(maxsize=self.prefetch_batches)
        self._decode_pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="loaders-decode") \
            if self.num_workers > 0 else None
        self._threads = [threading.Thread(target=self._reader_main, name="loaders-reader", daemon=True),
                         threading.Thread(target=self._assembler_main, name="loaders-assembler", daemon=True)]
        for t in self._threads:
            t.start()

    def start(self, timeout: float = 60.0) -> None:
        """Start the background threads now rather than at the first ``next()``, and wait (at most ``timeout``
        seconds) until they run as far ahead as they do in steady state (``prefetch_batches`` batches, no more
        than the staging blocks): the first batches then cost what the others do. A pipeline that replaces one
        mid-run (a new micro-batch) pays its start here, outside any step."""
        if self._closed:
            raise RuntimeError("BatchPipeline is closed")
        if not self._threads:
            self._start_threads()
        ahead, deadline = min(self.prefetch_batches, len(self.ring)), time.monotonic() + timeout
        with self._cv:  # the assembler counts and notifies under it; an error or the end stops it early
            while self._assembled < ahead and self._threads[1].is_alive() and time.monotonic() < deadline:
                self._cv.wait(POLL_S)

    def _stop_threads(self, restart: bool = True) -> None:
        if not self._threads:
            return
        self._stop.set()
        self.ring.close()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []
        if self._decode_pool is not None:
            self._decode_pool.shutdown(wait=True, cancel_futures=True)
        if self._last is not None:
            self._last.release()
            self._last = None
        if restart:  # a fresh ring: the closed one refuses acquire()
            old = self.ring
            self._ring_acquires += old.acquires  # the new ring's blocks are new allocations: first uses again
            self._ring_fresh += old.fresh
            self.ring = StagingRing(len(old), old.block_bytes, pin=old.pinned, guard=old.guard)

    def close(self) -> None:
        """Stop and join the background threads, close the reader (and the shards if opened here)."""
        if self._closed:
            return
        self._stop_threads(restart=False)
        self._closed = True
        self.reader.close()
        if self._own_shards:
            self.shards.close()

    def __enter__(self) -> "PipelineThreads":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reader thread
    def _requests(self) -> Iterator[tuple]:
        for epoch, k in self._positions():
            plan = self._plan(epoch)
            frames, first_use, refs = plan.schedule(k)
            base = self._seq(epoch, 0)
            for f, u, r in zip(frames.tolist(), first_use.tolist(), refs.tolist()):
                fd, off, n = self.shards.read_request(f)
                yield (epoch, f, base + u, r), fd, off, n

    def _seq(self, epoch: int, k: int) -> int:
        """Batch sequence number counted from the start position."""
        e0, k0 = self._start
        return (epoch - e0) * self.batches_per_epoch + k - k0

    def _decode(self, epoch: int, frame: int, raw: memoryview | bytes) -> Frame:
        """Decode one frame (in a decode worker) for ``epoch`` (a record kind may use it: vla seeds augmentation)."""
        t = time.perf_counter()
        fr = self.shards.decode_frame(frame, raw)
        dt = time.perf_counter() - t
        with self._dec_lock:
            self._dec_s += dt
            self._dec_bytes += int(self.shards.frame_dlen[frame])
            self._dec_tokens += len(fr.tokens)
        return fr

    def _reader_main(self) -> None:
        hold = 2 * self.num_workers + 2  # decodes allowed in flight on pooled read buffers
        pending: collections.deque[Future] = collections.deque()
        gen = self.reader.read_ordered(self._requests(), hold=hold)
        try:
            while not self._stop.is_set():
                while len(pending) > hold:  # the buffer of that read is recycled on the next request
                    f = pending.popleft()
                    while not f.done():
                        if self._stop.is_set():
                            return
                        _wait_future(f)
                try:
                    (epoch, frame, first_use, refs), data = next(gen)
                except StopIteration:
                    return
                with self._cv:  # run at most prefetch_batches batches ahead of the assembler
                    while first_use >= self._assembled + self.prefetch_batches and not self._stop.is_set():
                        self._cv.wait(POLL_S)
                if self._stop.is_set():
                    return
                if self._decode_pool is not None:
                    fut = self._decode_pool.submit(self._decode, epoch, frame, data)
                else:
                    fut = Future()
                    try:
                        fut.set_result(self._decode(epoch, frame, data))
                    except Exception as e:
                        fut.set_exception(e)
                pending.append(fut)
                with self._cv:
                    self._store[(epoch, frame)] = [fut, refs]
                    self._cv.notify_all()
        except BaseException as e:
            with self._cv:
                self._reader_error = e
                self._cv.notify_all()
        finally:
            for f in pending:  # read buffers must outlive their decodes
                _wait_future(f, None)
            gen.close()
            with self._cv:
                self._reader_done = True
                self._cv.notify_all()

    # -- assembler thread
    def _frame(self, epoch: int, frame: int) -> Frame:
        key = (epoch, frame)
        with self._cv:
            while key not in self._store:
                if self._stop.is_set():
                    raise Stopped
                if self._reader_error is not None:
                    raise self._reader_error
                if self._reader_done:  # a bug, not a data error: say so rather than wait forever
                    raise RuntimeError(f"loaders: frame {frame} of epoch {epoch} is needed but the reader "
                                       f"thread finished without reading it")
                self._cv.wait(POLL_S)
            fut = self._store[key][0]
        while True:
            if self._stop.is_set():
                raise Stopped
            if _wait_future(fut):
                return fut.result()  # raises the decode error (ShardFormatError...) here, in batch order

    def _unref(self, epoch: int, frame: int, n: int) -> None:
        with self._cv:
            ent = self._store[(epoch, frame)]
            ent[1] -= n
            if ent[1] <= 0:
                del self._store[(epoch, frame)]

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue
        raise Stopped

    def _assembler_main(self) -> None:
        try:
            if self._cuda:
                torch.cuda.set_device(self.device)
            for epoch, k0 in self._positions():
                plan = self._plan(epoch)
                for k in range(k0, len(plan)):
                    batch = self._assemble(epoch, k, plan)
                    self._put(batch)
                    with self._cv:
                        self._assembled += 1
                        self._cv.notify_all()
            self._put(_END)
        except Stopped:
            pass
        except BaseException as e:
            try:
                self._put(e)
            except Stopped:
                pass
            self._stop.set()  # the reader stops too; the consumer gets the error at next()

    # -- consumer
    def __iter__(self) -> "PipelineThreads":
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise RuntimeError("BatchPipeline is closed")
        if self._failed is not None:
            raise self._failed
        if self._finished:
            raise StopIteration
        if self._last is not None:  # the previous CPU batch's block goes back to the producer
            self._last.release()
            self._last = None
        if not self._threads:
            self._start_threads()
        t0 = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self._threads[1].is_alive() and self._queue.empty():
                    self._failed = RuntimeError("loaders: the assembler thread exited without a result")
                    raise self._failed
        self._wait_s += time.perf_counter() - t0
        if item is _END:
            self._finished = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._failed = item
            raise item
        batch: Batch = item
        if batch.event is not None:
            batch.ready()  # the current stream waits for the h2d copy; no host sync
        self._last = batch if batch._token is not None else None
        k = batch.index + 1
        self._pos = (batch.epoch, k) if k < self.batches_per_epoch else (batch.epoch + 1, 0)
        self._n_batches += 1
        self._real += batch.real_tokens
        self._padded += batch.padded_tokens
        return batch


def _wait_future(f: Future, timeout: float | None = POLL_S) -> bool:
    """Wait for ``f`` (without raising its exception); True once it is done."""
    try:
        f.exception(timeout=timeout)
    except TimeoutError:
        return False
    except BaseException:  # cancelled
        return True
    return True
