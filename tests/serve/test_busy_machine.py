"""What a busy machine must not do to ``attnmt serve`` (issue: legitimate requests answered 503 while other
processes loaded the CPU), without a server: the decoder's budget is its own CPU time, not the wall clock
(``decoder_process.Budgeted``); the bulk decoder waits before each step while the interactive one works;
overload is refused by the queue at the door (``batcher.Overloaded``), before any work is spent, with the
seconds to wait; and the queue's estimate follows the rate its batches are answered at."""

from __future__ import annotations

import threading
import time

import pytest
from test_batcher import GREEDY, Recorder, pieces, texts

from attnmt.serve.batcher import Batcher, Overloaded
from attnmt.serve.decoder_process import Budgeted, DecoderProcess, ThreadShare
from attnmt.serve.limits import OverBudget


class Model:
    """A model whose ``step`` sleeps (the machine's other processes have the CPU: wall time passes, this
    thread's CPU time does not) or spins (this thread works)."""

    def __init__(self, spin: bool, seconds: float = 0.02) -> None:
        self.spin, self.seconds, self.steps = spin, seconds, 0

    def step(self, *args):
        self.steps += 1
        if not self.spin:
            time.sleep(self.seconds)
        end = time.thread_time() + self.seconds  # its own work, however loaded the machine is
        while self.spin and time.thread_time() < end:
            pass
        return self.steps


def steps(budgeted: Budgeted, n: int) -> None:
    budgeted.start()
    for _ in range(n):
        budgeted.step()


def test_time_the_decoder_waits_for_the_cpu_is_not_charged_to_the_batch():
    """30 steps of 20 ms: 0.6 s of wall clock against a 0.2 s budget. Asleep (the CPU taken by others) they
    all run; spinning (the batch's own work) they are cut at the first step past the budget."""
    waiting = Budgeted(Model(spin=False), budget=0.2)
    steps(waiting, 30)
    assert waiting.model.steps == 30
    working = Budgeted(Model(spin=True), budget=0.2)
    with pytest.raises(OverBudget, match="time budget of 0.2 s"):
        steps(working, 30)
    assert 10 <= working.model.steps <= 12  # 0.2 s of 20 ms steps, and the one that crossed it


def test_the_bulk_decoder_waits_for_the_interactive_one_before_each_step():
    """While the flag is raised, a step waits (unspent CPU time, so its budget is whole afterwards); it goes
    on as soon as the flag falls."""
    flag = DecoderProcess.flag()
    flag.value = 1
    budgeted = Budgeted(Model(spin=True, seconds=0.001), budget=0.5, yield_to=flag)
    budgeted.start()
    threading.Timer(0.3, lambda: setattr(flag, "value", 0)).start()
    started, cpu = time.perf_counter(), time.thread_time()
    budgeted.step()
    assert time.perf_counter() - started >= 0.29
    assert time.thread_time() - cpu < 0.05 and budgeted.model.steps == 1
    assert budgeted.deadline - time.thread_time() > 0.45  # the budget is as good as whole (polling: ~10 ms)


def held(recorder: Recorder, rate: float, max_queue_s: float, max_job_s: float = 5.0) -> Batcher:
    """A batcher whose worker is held on its first batch (``recorder.gate``), its rate ``rate``."""
    recorder.gate.clear()
    batcher = Batcher(recorder, pieces, 1000, 0.0, max_queue_s=max_queue_s, max_job_s=max_job_s, rate=rate)
    return batcher


def test_the_queue_refuses_at_the_door_past_its_bound_with_the_seconds_to_wait():
    """A rate of 100 pieces a second and a bound of 1 s: the worker holds the first request; the queue then
    takes requests until it holds over 1 s of work (a 50-piece request is 0.5 s), and refuses the next at
    once, with Retry-After the seconds it holds. Nothing refused reaches the model; every accepted one is
    answered."""
    recorder = Recorder()
    batcher = held(recorder, rate=100.0, max_queue_s=1.0)
    line = "x" * 49  # 50 pieces with EOS
    first = batcher.submit([line], GREEDY)
    time.sleep(0.05)  # the worker has taken it
    accepted = [batcher.submit([line], GREEDY) for _ in range(3)]  # 1.5 s queued
    with pytest.raises(Overloaded) as refused:
        batcher.submit(["refused"], GREEDY)
    assert refused.value.retry_after == 2 and "--max-queue-seconds" in str(refused.value)
    assert batcher.stats.refused == 1
    recorder.gate.set()
    assert texts(first) == [line.upper()] and all(texts(f) == [line.upper()] for f in accepted)
    assert all("refused" not in lines for _, lines in recorder.batches)
    assert batcher.close(10)


def test_a_job_counts_at_most_the_budget_and_the_rate_follows_the_batches():
    """A request far over the budget is expected to take the budget (it is cut there), not its cost over
    the rate; a batch answered slower than the rate moves the rate down, a third of the way."""
    recorder = Recorder()
    batcher = held(recorder, rate=100.0, max_queue_s=100.0, max_job_s=2.0)
    batcher.submit(["a"], GREEDY)
    time.sleep(0.05)
    batcher.submit(["y" * 9999], GREEDY)  # 100 s at the rate
    assert batcher.queued_seconds() == pytest.approx(2.0)
    recorder.gate.set()
    assert batcher.close(10)
    assert batcher.stats.rate is not None and batcher.stats.rate != 100.0


def test_without_a_measured_rate_nothing_is_refused():
    recorder = Recorder()
    batcher = held(recorder, rate=None, max_queue_s=0.001)
    futures = [batcher.submit(["z" * 100], GREEDY) for _ in range(5)]
    recorder.gate.set()
    assert all(texts(f) == ["Z" * 100] for f in futures)
    assert batcher.close(10)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_decoder_falls_back_to_one_thread_while_others_take_the_cores():
    """All threads while the decoding thread gets its wall clock's CPU; one when it gets under 60%; all again
    once one thread gets over 90% and the hold has passed; a fall back soon after rising doubles the hold;
    work too short to tell, or a decoder of one thread, changes nothing."""
    used, clock = [], Clock()
    share = ThreadShare(2, used.append, clock)
    share.after(0.19, 0.2)
    share.after(0.001, 0.01)  # too short to tell
    assert used == [] and share.now == 2
    share.after(0.1, 0.3)  # a third of the wall clock: others have the cores
    assert used == [1]
    share.after(0.2, 0.2)  # one thread gets its CPU, but within the hold (1 s)
    assert used == [1]
    clock.now += 1.5
    share.after(0.2, 0.2)
    assert used == [1, 2]
    clock.now += 0.5
    share.after(0.05, 0.2)  # falls back again at once: the hold doubles
    assert used == [1, 2, 1] and share.hold == 2.0
    clock.now += 1.5
    share.after(0.2, 0.2)
    assert used == [1, 2, 1]  # still held
    clock.now += 1.0
    share.after(0.2, 0.2)
    assert used == [1, 2, 1, 2]
    alone = ThreadShare(1, used.append, clock)
    alone.after(0.0, 1.0)
    assert used == [1, 2, 1, 2]
