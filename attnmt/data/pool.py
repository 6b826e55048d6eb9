"""``ordered_map``: a function over a stream of chunks, spread over worker processes, results in order.

The standard library's ``Pool.imap`` reads its whole input ahead (its feeder thread does not wait for the
workers), so a 10M-pair corpus would sit in the task queue; here at most two tasks per worker are in
flight, so memory holds a few chunks whatever the stream's length. Workers are spawned, not forked: the
caller may hold threads (PyTorch's), which a fork would copy in whatever state they were in; and guarded
(``children.spawn_context``): they die with this process however it ends, where otherwise they would wait
on their task queue for ever (each holds its write end too, so it never reads end-of-file). A short
stream (at most ``inline`` chunks) is done in this process, with no start-up cost, and so is everything
with ``workers=1``; the results are the same either way.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from ..children import spawn_context
from ..errors import ResourceError

In = TypeVar("In")
Out = TypeVar("Out")


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def ordered_map(fn: Callable[[In], Out], items: Iterable[In], workers: int, inline: int = 2,
                initializer: Callable | None = None, initargs: tuple = ()) -> Iterator[Out]:
    """``fn(item)`` for each of ``items``, in order; ``fn`` must be a module-level function (it is sent to
    the workers by name). ``initializer(*initargs)`` runs once in each worker (never in this process, so
    with it the caller must not let the stream be done inline: ``inline=0``, ``workers`` > 1). A worker
    that dies (killed for memory, or its initializer failed) is a ResourceError, never a wait for ever."""
    items = iter(items)
    head = list(itertools.islice(items, inline + 1))
    if workers <= 1 or len(head) <= inline:
        yield from map(fn, itertools.chain(head, items))
        return
    pool = ProcessPoolExecutor(workers, mp_context=spawn_context(), initializer=initializer,
                               initargs=initargs)
    try:
        pending: deque = deque()
        for item in itertools.chain(head, items):
            pending.append(_submit(pool, fn, item))
            if len(pending) >= 2 * workers:
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


DIED = ("a worker process died (killed for memory, or it could not start); run again with fewer workers "
        "(--workers)")


def _submit(pool: ProcessPoolExecutor, fn: Callable, item) -> Future:
    """``pool.submit``; a pool that a worker's death broke before this task is the same ResourceError as a
    task it broke."""
    try:
        return pool.submit(fn, item)
    except BrokenProcessPool:
        raise ResourceError(DIED) from None


def _result(future: Future):
    try:
        return future.result()
    except BrokenProcessPool:
        raise ResourceError(DIED) from None


def chunked(items: Iterable[In], size: int) -> Iterator[list[In]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    items = iter(items)
    while chunk := list(itertools.islice(items, size)):
        yield chunk
