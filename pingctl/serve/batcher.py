"""One worker thread for every model call, and micro-batching of RTT questions.

JAX calls of one model are not interleaved: each forward pass, whatever endpoint asked for
it, runs on the worker thread here, one job at a time. The event loop only submits jobs and
awaits their futures (`asyncio.wrap_future`), so it keeps accepting requests while the model
works.

Batchable jobs (`submit`) carry a key and a list of items (an RTT question's prompts). The
worker takes the first waiting job and gathers further jobs of the same key until
`max_batch` items are gathered or the wait has passed since it took the first; the items
of all of them go through the job's function together (in slices of `max_batch`), which is
where concurrent single-pair requests share forward passes instead of each paying for its
own. A batch-shaped model call costs about as much at 1 prompt as at 32 (the forward shapes
are fixed buckets), so the gathering is what throughput comes from. A job of another key
waits for the next round, in its order. A job that is not batchable (`call`: a completion, a
search, a scoring) runs alone.

The wait is `max_wait_s` when given. By default (None) it follows the traffic: when the last
batch of the key carried one job and none waited behind it (one client asking in turn), 2 ms;
when several clients share batches, 30% of the key's recent batch time (2-150 ms). Clients that
each wait for their answer before asking again settle into two groups otherwise: while one
group's batch runs the other's requests queue, and the worker takes them the moment it is free,
a few milliseconds before the first group's next requests arrive, so every batch holds half the
clients. Holding a batch open for a fraction of its own run time lets the groups merge.

A gathered batch that fails is run again one job at a time, so a request whose questions
break the model fails alone and the others get their answers; the worker itself never dies
of a job's exception.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from pingctl.errors import PingctlError

_STOP = object()
AUTO_SHARE = 0.3  # of the key's recent batch time: what an automatic wait may hold a batch open
AUTO_MIN_S, AUTO_MAX_S = 0.002, 0.15


class Overloaded(PingctlError):
    """More questions wait for the model than the service queues (HTTP 503)."""

    kind = "overloaded"


@dataclass
class _Job:
    key: Hashable | None  # None: not batchable, runs alone
    fn: Callable
    items: list
    future: cf.Future = field(default_factory=cf.Future)

    @property
    def size(self) -> int:
        return len(self.items) if self.key is not None else 1


class Batcher:
    """The model's worker thread: `submit` batchable items, `call` anything else; both return a
    `concurrent.futures.Future`. `max_queued` bounds the items waiting (Overloaded past it)."""

    def __init__(self, max_batch: int = 32, max_wait_s: float | None = None, max_queued: int = 16_384,
                 name: str = "pingctl-model"):
        if max_batch < 1 or (max_wait_s is not None and max_wait_s < 0) or max_queued < 1:
            raise ValueError("max_batch >= 1, max_wait_s >= 0 (or None: automatic), max_queued >= 1")
        self.max_batch, self.max_wait_s, self.max_queued = max_batch, max_wait_s, max_queued
        # per key: (jobs in its last batch, jobs of it waiting when that batch ended, EWMA of its batch seconds)
        self._recent: dict = {}
        self._cv = threading.Condition()
        self._waiting: collections.deque = collections.deque()
        self._queued = 0
        self._stopping = False
        # figures for /healthz and the tests: model calls made, the jobs and items they carried
        self.stats = {"batches": 0, "jobs": 0, "items": 0, "largest_batch": 0, "failures": 0}
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ event-loop side

    def submit(self, key: Hashable, fn: Callable[[list], list], items: list) -> cf.Future:
        """`fn(items) -> results` (one per item) for `items`, batched with other jobs of `key`
        (which must mean the same `fn`); the future holds this job's results, in order."""
        return self._put(_Job(key, fn, list(items)))

    def call(self, fn: Callable[[], object]) -> cf.Future:
        """`fn()` on the worker thread, alone."""
        return self._put(_Job(None, fn, []))

    def _put(self, job: _Job) -> cf.Future:
        with self._cv:
            if self._stopping:
                raise PingctlError("the service is shutting down")
            if self._queued + job.size > self.max_queued:
                raise Overloaded(f"{self._queued:,} questions are waiting for the model (bound {self.max_queued:,}); "
                                 "retry in a moment")
            self._queued += job.size
            self._waiting.append(job)
            self._cv.notify()
        return job.future

    @property
    def queued(self) -> int:
        return self._queued

    def close(self, timeout: float = 30.0) -> None:
        """Finish the jobs already queued, then stop the thread."""
        with self._cv:
            self._stopping = True
            self._waiting.append(_STOP)
            self._cv.notify()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ worker side

    def _take(self, key: Hashable | None, deadline: float | None) -> _Job | object | None:
        """The first waiting job (of `key`, when given), waiting until `deadline` (None: for
        ever); None when none came in time."""
        with self._cv:
            while True:
                for i, job in enumerate(self._waiting):
                    if key is None or (job is not _STOP and job.key == key):
                        del self._waiting[i]
                        if job is not _STOP:
                            self._queued -= job.size
                        return job
                    if job is _STOP:
                        break  # nothing queued after a stop is gathered into this batch
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cv.wait(left)

    def _loop(self) -> None:
        while True:
            job = self._take(None, None)
            if job is _STOP:
                return
            if not job.future.set_running_or_notify_cancel():
                continue  # the client went away before its turn
            if job.key is None:
                self._run_alone(job)
                continue
            batch, n = [job], len(job.items)
            deadline = time.monotonic() + self.wait_s(job.key)
            while n < self.max_batch:
                more = self._take(job.key, deadline)
                if more is None:
                    break
                if more.future.set_running_or_notify_cancel():
                    batch.append(more)
                    n += len(more.items)
            t0 = time.monotonic()
            self._run_batch(batch)
            self._note(job.key, len(batch), time.monotonic() - t0)

    def wait_s(self, key: Hashable) -> float:
        """How long a batch of `key` is held open for more jobs (see the module's docstring)."""
        if self.max_wait_s is not None:
            return self.max_wait_s
        jobs, behind, seconds = self._recent.get(key, (1, 0, 0.0))
        if jobs <= 1 and behind == 0:
            return AUTO_MIN_S
        return min(AUTO_MAX_S, max(AUTO_MIN_S, AUTO_SHARE * seconds))

    def _note(self, key: Hashable, jobs: int, seconds: float) -> None:
        with self._cv:
            behind = sum(1 for j in self._waiting if j is not _STOP and j.key == key)
        prev = self._recent.get(key)
        self._recent[key] = (jobs, behind, seconds if prev is None else 0.7 * prev[2] + 0.3 * seconds)

    def _run_alone(self, job: _Job) -> None:
        self.stats["batches"] += 1
        self.stats["jobs"] += 1
        try:
            job.future.set_result(job.fn())
        except BaseException as e:  # noqa: BLE001 - a job's failure is its request's, never the worker's
            self.stats["failures"] += 1
            job.future.set_exception(e)

    def _apply(self, fn: Callable, items: list) -> list:
        out: list = []
        for a in range(0, len(items), self.max_batch):
            part = items[a : a + self.max_batch]
            self.stats["batches"] += 1
            self.stats["largest_batch"] = max(self.stats["largest_batch"], len(part))
            res = fn(part)
            if len(res) != len(part):
                raise RuntimeError(f"a batch function returned {len(res)} results for {len(part)} items")
            out.extend(res)
        return out

    def _run_batch(self, batch: list[_Job]) -> None:
        self.stats["jobs"] += len(batch)
        self.stats["items"] += sum(len(j.items) for j in batch)
        try:
            results = self._apply(batch[0].fn, [x for j in batch for x in j.items])
        except BaseException as e:  # noqa: BLE001
            if len(batch) == 1:
                self.stats["failures"] += 1
                batch[0].future.set_exception(e)
                return
            for j in batch:  # which request broke it: each on its own
                try:
                    j.future.set_result(self._apply(j.fn, j.items))
                except BaseException as e1:  # noqa: BLE001
                    self.stats["failures"] += 1
                    j.future.set_exception(e1)
            return
        k = 0
        for j in batch:
            j.future.set_result(results[k : k + len(j.items)])
            k += len(j.items)
