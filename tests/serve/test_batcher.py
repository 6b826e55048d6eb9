"""The dynamic batcher on a translator that records its batches (no model, no HTTP): what joins a batch,
the budget, the wait, settings kept apart, sampling alone, errors, and close."""

from __future__ import annotations

import threading
import time

import pytest

from attnmt.decoding.search import Sampling
from attnmt.decoding.translator import Translation
from attnmt.serve.batcher import Batcher, Closed, Settings

GREEDY = Settings(1, 1, 0.6)
BEAM = Settings(4, 1, 0.6)


class Recorder:
    """``variant`` for the batcher: translates a line to its upper case, and records every batch; a
    batch waits on ``gate`` first, so a test can hold the worker while requests pile up."""

    def __init__(self) -> None:
        self.batches: list[tuple[Settings, list[str]]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, settings: Settings):
        recorder = self

        class Translator:
            def translate(self, lines, prefixes=None, words=False, constraints=None):
                recorder.gate.wait(10)
                if "boom" in lines:
                    raise RuntimeError("boom")
                recorder.batches.append((settings, list(lines)))
                return [Translation([(line.upper(), -1.0)]) for line in lines]

        return Translator()


def pieces(lines) -> int:  # a "piece" per character, EOS included
    return sum(len(line) + 1 for line in lines)


@pytest.fixture
def recorder():
    return Recorder()


def make(recorder, budget=1000, wait_s=0.05) -> Batcher:
    return Batcher(recorder, pieces, budget, wait_s)


def texts(future) -> list[str]:
    return [t.outputs[0][0] for t in future.result(10)]


def test_requests_that_wait_together_are_decoded_together(recorder):
    batcher = make(recorder)
    recorder.gate.clear()  # the first request holds the worker; the next three queue up behind it
    first = batcher.submit(["a"], GREEDY)
    time.sleep(0.1)
    later = [batcher.submit([w], GREEDY) for w in ("b", "cc", "d")]
    recorder.gate.set()
    assert texts(first) == ["A"] and [texts(f) for f in later] == [["B"], ["CC"], ["D"]]
    assert [lines for _, lines in recorder.batches] == [["a"], ["b", "cc", "d"]]
    assert batcher.stats.batches == 2 and batcher.stats.sentences == 4 and batcher.stats.largest == 3
    assert batcher.close(5)


def test_the_budget_cuts_a_batch_and_the_rest_keeps_its_place(recorder):
    batcher = make(recorder, budget=10)  # "xxxx" costs 5: two fit
    recorder.gate.clear()
    hold = batcher.submit(["h"], GREEDY)
    time.sleep(0.1)
    futures = [batcher.submit(["xxxx"], GREEDY) for _ in range(5)]
    recorder.gate.set()
    hold.result(10)
    for f in futures:
        f.result(10)
    assert [len(lines) for _, lines in recorder.batches] == [1, 2, 2, 1]
    # A request over the budget alone still goes, alone.
    assert texts(batcher.submit(["y" * 50], GREEDY)) == ["Y" * 50]
    assert recorder.batches[-1][1] == ["y" * 50]
    batcher.close(5)


def test_settings_are_never_mixed_and_the_order_is_first_come(recorder):
    batcher = make(recorder)
    recorder.gate.clear()
    hold = batcher.submit(["h"], GREEDY)
    time.sleep(0.1)
    a = batcher.submit(["a"], BEAM)
    b = batcher.submit(["b"], GREEDY)
    c = batcher.submit(["c"], BEAM)
    recorder.gate.set()
    for f in (hold, a, b, c):
        f.result(10)
    batches = [(s.beam_size, lines) for s, lines in recorder.batches]
    assert batches == [(1, ["h"]), (4, ["a", "c"]), (1, ["b"])]
    batcher.close(5)


def test_a_lone_client_is_not_kept_waiting(recorder):
    batcher = make(recorder, wait_s=0.5)
    for word in ("a", "b", "c"):  # one client: each answer, then the next request
        started = time.monotonic()
        assert texts(batcher.submit([word], GREEDY)) == [word.upper()]
        assert time.monotonic() - started < 0.3
    batcher.close(5)


def test_after_a_batch_as_many_requests_are_awaited_up_to_max_wait(recorder):
    batcher = make(recorder, wait_s=0.3)
    recorder.gate.clear()
    hold = batcher.submit(["h"], GREEDY)
    time.sleep(0.1)
    three = [batcher.submit([w], GREEDY) for w in ("a", "b", "c")]
    recorder.gate.set()
    for f in (hold, *three):
        f.result(10)
    # Three were answered together: their clients come back one after another, and are batched again.
    started = time.monotonic()
    again = [batcher.submit(["x"], GREEDY)]
    time.sleep(0.05)
    again += [batcher.submit([w], GREEDY) for w in ("y", "z")]
    assert [texts(f) for f in again] == [["X"], ["Y"], ["Z"]]
    assert recorder.batches[-1][1] == ["x", "y", "z"]
    # Fewer come back: the batch goes when max_wait has passed since the last one was answered.
    started = time.monotonic()
    assert texts(batcher.submit(["w"], GREEDY)) == ["W"]
    assert 0.2 < time.monotonic() - started < 2
    batcher.close(5)


def test_sampling_requests_go_alone(recorder):
    batcher = make(recorder)
    recorder.gate.clear()
    hold = batcher.submit(["h"], GREEDY)
    time.sleep(0.1)
    draw = Settings(1, 2, 0.6, Sampling(seed=3))
    futures = [batcher.submit([w], draw) for w in ("a", "b")]
    recorder.gate.set()
    hold.result(10)
    for f in futures:
        f.result(10)
    assert [lines for _, lines in recorder.batches] == [["h"], ["a"], ["b"]]
    batcher.close(5)


def test_an_error_reaches_its_batch_only_and_the_worker_goes_on(recorder):
    batcher = make(recorder, wait_s=0.0)
    with pytest.raises(RuntimeError, match="boom"):
        batcher.submit(["boom"], GREEDY).result(10)
    assert texts(batcher.submit(["ok"], GREEDY)) == ["OK"]
    assert batcher.call(lambda: 41 + 1).result(10) == 42
    with pytest.raises(ZeroDivisionError):
        batcher.call(lambda: 1 / 0).result(10)
    batcher.close(5)


def test_close_finishes_what_was_accepted_and_refuses_the_rest(recorder):
    batcher = make(recorder)
    recorder.gate.clear()
    accepted = [batcher.submit([w], GREEDY) for w in ("a", "b", "c")]
    closing = threading.Thread(target=batcher.close, args=(10,))
    closing.start()
    time.sleep(0.1)
    with pytest.raises(Closed):
        batcher.submit(["late"], GREEDY)
    recorder.gate.set()
    closing.join(10)
    assert [texts(f) for f in accepted] == [["A"], ["B"], ["C"]]
    assert not batcher._thread.is_alive()


def test_close_reports_a_worker_that_did_not_finish_in_time(recorder):
    batcher = make(recorder)
    recorder.gate.clear()
    batcher.submit(["a"], GREEDY)
    assert batcher.close(0.2) is False
    recorder.gate.set()
    batcher._thread.join(10)
