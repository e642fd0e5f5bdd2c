"""One worker thread for every model call, micro-batching of RTT questions, and fair turns.

JAX calls of one model are not interleaved: each forward pass, whatever endpoint asked for
it, runs on the worker thread here, one job at a time. The event loop only submits jobs and
awaits their futures (`asyncio.wrap_future`), so it keeps accepting requests while the model
works.

Batchable jobs (`submit`) carry a key and a list of items (an RTT question's prompts). The
worker answers them in rounds of at most `max_batch` items: it takes the first waiting job
and gathers items of further jobs of the same key until `max_batch` items are gathered or the
wait has passed since it took the first; the gathered items go through the job's function
together, which is where concurrent single-pair requests share forward passes instead of each
paying for its own. A batch-shaped model call costs about as much at 1 prompt as at 32 (the
forward shapes are fixed buckets), so the gathering is what throughput comes from. A job of
another key waits for the next round, in its order. A job that is not batchable (`call`: a
completion, a search, a scoring) runs alone.

Turns are fair: a job with more items than one round takes (a 1,024-pair request) is answered
a round at a time, and between its rounds it goes back to the end of the queue, behind the jobs
that came meanwhile. A one-pair request that arrives while a large one is being answered so
waits for one round of it (a batch of forward passes, about a second on a CPU), not for all of
it (a minute, when it held the worker from its first pass to its last). A job whose future is
cancelled (its client went away, or the service's drain cut it) is dropped at its next turn.

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


class ShuttingDown(PingctlError):
    """The service is stopping: no new work is taken (HTTP 503)."""

    kind = "shutting_down"


@dataclass(eq=False)  # a job is itself, not its fields: jobs are kept in dicts by identity
class _Job:
    key: Hashable | None  # None: not batchable, runs alone
    fn: Callable
    items: list
    future: cf.Future = field(default_factory=cf.Future)
    # a batchable job is answered a round at a time: how many items are answered, their results
    done: int = 0
    results: list = field(default_factory=list)

    @property
    def left(self) -> int:
        """Items not answered yet (a job that runs alone counts as one)."""
        return len(self.items) - self.done if self.key is not None else 1


@dataclass
class _Part:
    """The items [a, b) of a job, in one round."""

    job: _Job
    a: int
    b: int

    @property
    def items(self) -> list:
        return self.job.items[self.a : self.b]


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
        # called on the worker with each gathered batch's size (the service's /metrics histogram)
        self.on_batch: Callable[[int], None] | None = None
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
                raise ShuttingDown("the service is shutting down; retry on another instance or after its restart")
            if self._queued + job.left > self.max_queued:
                raise Overloaded(f"{self._queued:,} questions are waiting for the model (bound {self.max_queued:,}); "
                                 "retry in a moment")
            self._queued += job.left
            self._waiting.append(job)
            self._cv.notify()
        return job.future

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def busy(self) -> bool:
        """Whether the worker thread is still running (after `close`: a job outlived its timeout)."""
        return self._thread.is_alive()

    def close(self, timeout: float = 30.0) -> None:
        """Finish the jobs already queued (a cancelled one is dropped), then stop the thread;
        wait for it at most `timeout` seconds."""
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
                        return job
                    if job is _STOP:
                        break  # nothing queued after a stop is gathered into this batch
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cv.wait(left)

    def _part(self, job: _Job, room: int) -> _Part:
        """The next at most `room` items of `job`, taken off the count of waiting items."""
        part = _Part(job, job.done, min(len(job.items), job.done + room))
        with self._cv:
            self._queued -= part.b - part.a
        if part.a == 0:
            self.stats["jobs"] += 1
        self.stats["items"] += part.b - part.a
        return part

    def _drop(self, job: _Job) -> None:
        """A job that will not be answered (cancelled): its items leave the count."""
        with self._cv:
            self._queued -= job.left

    def _requeue(self, job: _Job) -> None:
        """A job with items left goes to the back of the queue (before a stop: close() finishes it)."""
        with self._cv:
            at = next((i for i, j in enumerate(self._waiting) if j is _STOP), len(self._waiting))
            self._waiting.insert(at, job)
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            job = self._take(None, None)
            if job is _STOP:
                return
            if job.future.cancelled():
                self._drop(job)  # the client went away (or the drain cut it) before its turn
                continue
            if job.key is None:
                self._drop(job)
                if job.future.set_running_or_notify_cancel():
                    self._run_alone(job)
                continue
            self._round(job)

    def _round(self, first: _Job) -> None:
        """One batch: the next items of `first`, then of further jobs of its key (within the
        wait), through the key's function; each job finished, failed, or sent back in line."""
        parts = [self._part(first, self.max_batch)]
        room = self.max_batch - (parts[0].b - parts[0].a)
        deadline = time.monotonic() + self.wait_s(first.key)
        while room > 0:
            more = self._take(first.key, deadline)
            if more is None:
                break
            if more.future.cancelled():
                self._drop(more)
                continue
            parts.append(self._part(more, room))
            room -= parts[-1].b - parts[-1].a
        t0 = time.monotonic()
        failed = self._run_batch(parts)
        self._note(first.key, len(parts), time.monotonic() - t0)
        for p in parts:
            job = p.job
            if job in failed:
                job.done = p.b  # its later items will not be asked either
                self._drop(job)
                self._settle(job, error=failed[job])
            elif job.done == len(job.items):
                self._settle(job)
            elif job.future.cancelled():
                self._drop(job)
            else:
                self._requeue(job)

    def _settle(self, job: _Job, error: BaseException | None = None) -> None:
        # the future stays pending until now, so a client that leaves mid-way can cancel it
        if not job.future.set_running_or_notify_cancel():
            return
        if error is None:
            job.future.set_result(job.results)
        else:
            self.stats["failures"] += 1
            job.future.set_exception(error)

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
        self.stats["batches"] += 1
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(items))
        if self.on_batch is not None:
            self.on_batch(len(items))
        res = fn(items)
        if len(res) != len(items):
            raise RuntimeError(f"a batch function returned {len(res)} results for {len(items)} items")
        return res

    def _run_batch(self, parts: list[_Part]) -> dict:
        """The parts' items through their function; each part's results kept with its job.
        {job: exception} of the jobs that failed."""
        items = [x for p in parts for x in p.items]
        try:
            results = self._apply(parts[0].job.fn, items) if items else []
        except BaseException as e:  # noqa: BLE001
            if len(parts) == 1:
                return {parts[0].job: e}
            failed = {}
            for p in parts:  # which request broke it: each on its own
                try:
                    self._keep(p, self._apply(p.job.fn, p.items))
                except BaseException as e1:  # noqa: BLE001
                    failed[p.job] = e1
            return failed
        k = 0
        for p in parts:
            self._keep(p, results[k : k + p.b - p.a])
            k += p.b - p.a
        return {}

    @staticmethod
    def _keep(part: _Part, results: list) -> None:
        part.job.results.extend(results)
        part.job.done = part.b
