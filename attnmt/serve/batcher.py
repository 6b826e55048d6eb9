"""Dynamic batching for ``attnmt serve``: requests that arrive close together are decoded together.

One worker thread decodes (in ``attnmt serve`` it hands each batch to the decoder process,
``decoder_process.py``). Requests (``submit``) wait in one queue, first come first served. The
worker takes the oldest request, then waits for requests with the same decode settings (``Settings``)
until as many are waiting as the last batch answered plus those that waited beside it (clients that wait
for their answers send again as soon as they have them: without this, 32 such clients settle into two
alternating batches of 16), or their sentences would pass ``max_batch_tokens`` source pieces (EOS
included) x beam rows, or ``max_wait_s`` has passed since the oldest arrived or the last batch was
answered, whichever is later; then it takes them, oldest first, within the budget,
and translates their sentences in one ``Translator.translate`` call (which sorts them by length and cuts
them to the model's own token budget) and hands each request its own results. A request with other
settings stays queued, in its place, for the next batch. A request with sampling is decoded alone, its
draws following its own seed, so that the same request always gets the same samples.

A sentence's translation never depends on what it was batched with: batched search equals search one
sentence at a time (``tests/decoding/test_decode.py``, ``tests/serve/test_serve.py`` through a server).

Overload is shed at the door (``Overloaded``, HTTP 503 with ``Retry-After``): a request is refused before
any work is spent on it when the work already queued would take the decoder more than ``max_queue_s`` to
serve. A job is expected to take its cost over the lane's measured rate (cost units answered per second,
an average over the last batches that finished, seeded by the decoder's probe at start-up) and at most
the budget (``max_job_s``: a batch past it is cut). The rate is the decoder's as it is now, so on a
machine that other processes load the queue holds less.

``close`` stops accepting (``Closed``) and returns once every request already accepted has its answer.
Work that is not a translation (the attention of a sentence) goes through the same thread as a ``call``,
so the model is only ever used by one thread and the cores are not split between two decodes.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..decoding.search import Sampling
from ..decoding.translator import Translation, Translator


class Closed(Exception):
    """The batcher no longer accepts requests (the server is stopping)."""


class Overloaded(Exception):
    """The queue holds more than the decoder can serve in the stated time (HTTP 503); ``retry_after``:
    whole seconds until it expects to have served what is queued now."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Settings:
    """What a request decodes with; requests batch together only when these are equal."""

    beam_size: int
    nbest: int
    length_penalty: float
    sampling: Sampling | None = None
    words: bool = False  # each output's word probabilities too
    source_prefix: str = ""  # a multilingual model's target-language token (``Translator.source_prefix``)
    markup: bool = False  # the lines hold inline tags, which the decoder carries to every output

    def rows(self) -> int:
        """What a source piece costs: its beam rows (a sampling request's samples), and with ``markup``
        one teacher-forced reading of each output more (the alignment that places the tags; the lines are
        measured as sent, tags and all, a little more than is decoded)."""
        return (self.nbest if self.sampling else self.beam_size) + (self.nbest if self.markup else 0)


@dataclass
class _Job:
    future: Future
    settings: Settings | None  # None: a call
    lines: Sequence[str] = ()
    prefixes: Sequence[str] | None = None  # what each line's translations start with
    constraints: Sequence[Sequence[str]] | None = None  # the phrases each line's translations hold
    call: Callable[[], Any] | None = None
    cost: int = 0  # source pieces x beam rows
    arrived: float = field(default_factory=time.monotonic)


@dataclass
class Stats:
    """What the worker did, for ``/info`` and the benchmark."""

    batches: int = 0
    sentences: int = 0
    largest: int = 0  # sentences in the largest batch
    refused: int = 0  # requests refused at the door (``Overloaded``)
    rate: float | None = None  # cost units (source pieces x beam rows) answered per second, recently


class Batcher:
    """The one thread that decodes; see the module docstring.

    ``variant(settings)`` returns the model's translator (``Translator`` or ``Ct2Translator``) with those
    settings; ``measure(lines)`` counts their source pieces, EOS included (the translator encodes them again
    when it runs: sentencepiece takes microseconds a line, a decode milliseconds)."""

    def __init__(self, variant: Callable[[Settings], Translator], measure: Callable[[Sequence[str]], int],
                 max_batch_tokens: int = 4096, max_wait_s: float = 0.04, max_queue_s: float | None = None,
                 max_job_s: float | None = None, rate: float | None = None) -> None:
        if max_batch_tokens < 1 or not max_wait_s >= 0:
            raise ValueError(f"max_batch_tokens {max_batch_tokens} and max_wait_s {max_wait_s}")
        self.variant, self.measure = variant, measure
        self.max_batch_tokens, self.max_wait_s = max_batch_tokens, max_wait_s
        self.max_queue_s, self.max_job_s = max_queue_s, max_job_s
        self.stats = Stats(rate=rate)
        # Clients that wait for their answers send again as soon as they have them: after a batch, as many
        # requests as it answered are expected back, besides those waiting; ``_next`` waits for them.
        self._expected = 1
        self._finished = 0.0  # when the last batch was answered (time.monotonic)
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="attnmt-batcher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers' side (any thread)

    def submit(self, lines: Sequence[str], settings: Settings, prefixes: Sequence[str] | None = None,
               constraints: Sequence[Sequence[str]] | None = None) -> Future:
        """A future for the translations of ``lines`` (one ``Translation`` each, in order), each starting
        with its prefix and holding its phrases, if given (``Translator.translate``; the caller has
        checked the phrases, ``Translator.encode_constraints``)."""
        return self._put(_Job(Future(), settings, list(lines), prefixes, constraints,
                              cost=self.measure(lines) * settings.rows()))

    def call(self, work: Callable[[], Any], cost: int = 0) -> Future:
        """A future for ``work()`` run on the worker thread, between batches; ``cost``: what it is expected
        to cost, in the units of a translation's."""
        return self._put(_Job(Future(), None, call=work, cost=cost))

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def queued_seconds(self) -> float:
        """What the queue holds, in the seconds the decoder is expected to take to serve it."""
        with self._cond:
            return self._expected_seconds(self._queue)

    def _expected_seconds(self, jobs) -> float:
        """Each job's cost over the rate, at most the budget (caller holds the lock; no rate yet: 0)."""
        rate = self.stats.rate
        if not rate:
            return 0.0
        cap = self.max_job_s if self.max_job_s is not None else float("inf")
        return sum(min(job.cost / rate, cap) for job in jobs)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new requests, finish the accepted ones; True if they all finished within ``timeout``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _put(self, job: _Job) -> Future:
        with self._cond:
            if self._closed:
                raise Closed("the server is stopping")
            if self.max_queue_s is not None and self._queue:
                queued = self._expected_seconds(self._queue)
                if queued > self.max_queue_s:
                    self.stats.refused += 1
                    raise Overloaded(f"the server is busy: its queue holds about {queued:.0f} s of work, "
                                     f"more than its bound of {self.max_queue_s:g} s "
                                     "(--max-queue-seconds); retry later", max(1, math.ceil(queued)))
            self._queue.append(job)
            self._cond.notify_all()
        return job.future

    # ------------------------------------------------------------------ the worker

    def _work(self) -> None:
        while True:
            jobs = self._next()
            if jobs is None:
                return
            self._run(jobs)

    def _next(self) -> list[_Job] | None:
        """The next batch: the oldest job and the waiting jobs that may join it (None once closed and
        empty). Waits up to ``max_wait_s`` from the oldest job's arrival for more to come."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            first = self._queue[0]
            if first.settings is None or first.settings.sampling is not None:
                return [self._queue.popleft()]
            while (not self._closed and self._room(first.settings) > 0
                   and self._waiting(first.settings) < self._expected):
                left = max(first.arrived, self._finished) + self.max_wait_s - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    break
            return self._take(first.settings)

    def _waiting(self, settings: Settings) -> int:
        return sum(1 for job in self._queue if job.settings == settings)

    def _room(self, settings: Settings) -> int:
        """The budget left if every waiting job with these settings joined the batch (caller holds the
        lock)."""
        return self.max_batch_tokens - sum(j.cost for j in self._queue if j.settings == settings)

    def _take(self, settings: Settings) -> list[_Job]:
        """Take jobs with ``settings`` from the queue, oldest first, while the budget lasts (the first
        always); the others keep their places (caller holds the lock)."""
        taken, kept, used = [], deque(), 0
        for job in self._queue:
            if job.settings == settings and (not taken or used + job.cost <= self.max_batch_tokens):
                taken.append(job)
                used += job.cost
            else:
                kept.append(job)
        self._queue = kept
        return taken

    def _run(self, jobs: list[_Job]) -> None:
        live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        if live[0].settings is None:
            self._settle(live, lambda: [live[0].call()])
            return
        lines = [line for job in live for line in job.lines]
        prefixes = ([p for job in live for p in (job.prefixes or [""] * len(job.lines))]
                    if any(job.prefixes for job in live) else None)
        phrases = ([p for job in live for p in (job.constraints or [[]] * len(job.lines))]
                   if any(job.constraints for job in live) else None)
        settings = live[0].settings

        def translate() -> list[list[Translation]]:
            started = time.perf_counter()
            found = self.variant(settings).translate(lines, prefixes, words=settings.words,
                                                     constraints=phrases)
            self._measured(sum(job.cost for job in live), time.perf_counter() - started)
            out, start = [], 0
            for job in live:
                out.append(found[start:start + len(job.lines)])
                start += len(job.lines)
            self.stats.batches += 1
            self.stats.sentences += len(lines)
            self.stats.largest = max(self.stats.largest, len(lines))
            return out

        self._settle(live, translate)
        with self._cond:
            self._expected = max(1, len(live) + len(self._queue))
            self._finished = time.monotonic()

    def _measured(self, cost: int, seconds: float) -> None:
        """A batch of ``cost`` answered in ``seconds``: the rate moves a third of the way to its own."""
        rate = cost / max(seconds, 1e-6)
        with self._cond:
            self.stats.rate = rate if self.stats.rate is None else (2 * self.stats.rate + rate) / 3

    @staticmethod
    def _settle(jobs: list[_Job], work: Callable[[], list]) -> None:
        try:
            results = work()
        except BaseException as e:  # the callers see it; the worker goes on with the next batch
            for job in jobs:
                job.future.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for job, result in zip(jobs, results, strict=True):
            job.future.set_result(result)


@dataclass
class Lane:
    """One batcher over a decoder of its own, and that decoder's ``draw`` (the explorer's data of a
    sentence and its translation, its source read after a prefix)."""

    name: str
    batcher: Batcher
    draw: Callable[[str, str, str], Any]


class Lanes:
    """``attnmt serve``'s decoders: the interactive lane, and a bulk lane for requests that cost more than
    ``bulk_above`` pieces x beam rows, decoded by a process that waits before each model step while the
    interactive one works (``decoder_process``), so that the interactive lane has the cores whenever it
    has work: a client sending the largest requests the limits allow slows only the other large requests,
    never the one-line ones (``scripts/bench/bench_serve.py --hostile``). Without a bulk lane every request
    takes the interactive one."""

    def __init__(self, interactive: Lane, bulk: Lane | None = None, bulk_above: int = 0) -> None:
        self.interactive, self.bulk, self.bulk_above = interactive, bulk, bulk_above
        self.all = [interactive] + ([bulk] if bulk is not None else [])

    def lane(self, cost: int) -> Lane:
        """The lane of a request of ``cost`` pieces x beam rows."""
        return self.bulk if self.bulk is not None and cost > self.bulk_above else self.interactive

    def pending(self) -> int:
        return sum(lane.batcher.pending() for lane in self.all)

    def close(self, timeout: float | None = None) -> bool:
        """``Batcher.close`` of every lane within one ``timeout``; True if all finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for lane in self.all:  # every lane refuses new requests first
            lane.batcher.close(0)
        done = True
        for lane in self.all:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done = lane.batcher.close(left) and done
        return done

    def describe(self) -> dict:
        """What each lane's batcher has done, for ``/info``."""
        described = {}
        for lane in self.all:
            stats = lane.batcher.stats
            described[lane.name] = {"batches": stats.batches, "sentences": stats.sentences,
                                    "largest": stats.largest, "pending": lane.batcher.pending(),
                                    "queued_seconds": round(lane.batcher.queued_seconds(), 3),
                                    "refused": stats.refused,
                                    "rate": None if stats.rate is None else round(stats.rate, 1)}
        return described
