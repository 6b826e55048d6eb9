"""``pool.ordered_map``: results in order from spawned workers, a worker that dies or cannot start is one
error, never a wait for ever, and the workers die with their parent (``children.py``; the parent killed:
``test_orphans.py``)."""

from __future__ import annotations

import ctypes
import os
import signal
import time

import pytest

from attnmt.data.pool import ordered_map
from attnmt.errors import ResourceError

_OFFSET: list[int] = []


def _start(offset: int) -> None:
    _OFFSET[:] = [offset]


def _shifted_square(x: int) -> int:
    return x * x + _OFFSET[0]


def _dies_at_three(x: int) -> int:
    if x == 3:
        os._exit(1)  # as a worker killed for memory would
    return x


def _parent_death_signal(_: int) -> tuple[int, int]:
    """(this worker's parent, the signal the kernel sends it when that parent's thread exits)."""
    found = ctypes.c_int()
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(found), 0, 0, 0)  # PR_GET_PDEATHSIG
    return os.getppid(), found.value


def _cannot_start() -> None:
    raise RuntimeError("no model here")


def test_results_come_in_order_and_the_initializer_runs_in_each_worker():
    found = list(ordered_map(_shifted_square, range(12), workers=2, inline=0, initializer=_start,
                             initargs=(100,)))
    assert found == [x * x + 100 for x in range(12)]


def test_a_worker_that_dies_is_an_error_not_a_hang():
    with pytest.raises(ResourceError, match="a worker process died"):
        list(ordered_map(_dies_at_three, range(8), workers=2, inline=0))


def _dies_saying_so(item: tuple[int, str]) -> int:
    x, marker = item
    if x == 0:
        with open(marker, "w") as f:
            f.write("dying\n")
        os._exit(1)
    return x


def test_a_worker_that_died_before_the_next_task_is_the_same_error(tmp_path):
    """The pool broken while the stream waits for its next item: that item's submission is refused
    (BrokenProcessPool from ``submit``, not from a result) and is the same one error."""
    marker = tmp_path / "died"

    def stream():
        yield 0, str(marker)
        for _ in range(600):  # the worker says it dies; the pool sees it a moment later
            if marker.exists():
                break
            time.sleep(0.05)
        time.sleep(1.0)
        yield from ((x, str(marker)) for x in range(1, 8))

    with pytest.raises(ResourceError, match="a worker process died"):
        list(ordered_map(_dies_saying_so, stream(), workers=2, inline=0))


def test_a_worker_that_cannot_start_is_an_error_not_a_hang():
    with pytest.raises(ResourceError, match="could not start"):
        list(ordered_map(_shifted_square, range(4), workers=2, inline=0, initializer=_cannot_start))


def test_workers_spawned_from_the_main_thread_die_with_their_parent_by_sigkill():
    found = set(ordered_map(_parent_death_signal, range(6), workers=2, inline=0))
    assert found == {(os.getpid(), signal.SIGKILL)}
