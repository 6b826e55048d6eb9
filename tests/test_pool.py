"""``pool.ordered_map``: results in order from spawned workers, and a worker that dies or cannot start is
one error, never a wait for ever."""

from __future__ import annotations

import os

import pytest

from attnmt.errors import ResourceError
from attnmt.pool import ordered_map

_OFFSET: list[int] = []


def _start(offset: int) -> None:
    _OFFSET[:] = [offset]


def _shifted_square(x: int) -> int:
    return x * x + _OFFSET[0]


def _dies_at_three(x: int) -> int:
    if x == 3:
        os._exit(1)  # as a worker killed for memory would
    return x


def _cannot_start() -> None:
    raise RuntimeError("no model here")


def test_results_come_in_order_and_the_initializer_runs_in_each_worker():
    found = list(ordered_map(_shifted_square, range(12), workers=2, inline=0, initializer=_start,
                             initargs=(100,)))
    assert found == [x * x + 100 for x in range(12)]


def test_a_worker_that_dies_is_an_error_not_a_hang():
    with pytest.raises(ResourceError, match="a worker process died"):
        list(ordered_map(_dies_at_three, range(8), workers=2, inline=0))


def test_a_worker_that_cannot_start_is_an_error_not_a_hang():
    with pytest.raises(ResourceError, match="could not start"):
        list(ordered_map(_shifted_square, range(4), workers=2, inline=0, initializer=_cannot_start))
