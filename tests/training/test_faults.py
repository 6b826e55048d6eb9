"""Fault injection: every spec ``Faults.parse`` reads, which steps a NaN fault poisons, and the SIGKILL
hooks, with ``os.kill`` replaced by a recorder (the test process is never really killed)."""

import os
import signal

import pytest

import attnmt.training.faults
from attnmt.training.faults import NO_FAULTS, Faults


@pytest.fixture
def kills(monkeypatch):
    """The (pid, signal) of every ``os.kill`` call made through ``attnmt.training.faults``."""
    calls = []
    monkeypatch.setattr(attnmt.training.faults.os, "kill", lambda pid, sig: calls.append((pid, sig)))
    return calls


@pytest.mark.parametrize("spec, expected", [
    ("sigkill_at_step:17", Faults(sigkill_at_step=17)),
    ("sigkill_after_tmp_write", Faults(sigkill_after_tmp_write=True)),
    ("nan_at_step:4", Faults(nan_at_step=4)),
    ("nan_from_step:5", Faults(nan_from_step=5)),
    ("nan_at_step:0", Faults(nan_at_step=0)),
])  # fmt: skip
def test_parse_reads_each_spec(spec, expected):
    assert Faults.parse(spec) == expected


@pytest.mark.parametrize("spec", [
    "", "sigkill", "nan_at_step", "nan_at_step:", "nan_at_step:x", "nan_at_step:-1", "nan_at_step:1.5",
    "sigkill_at_step:", "sigkill_after_tmp_write:1", "sigkill_after_tmp_write:", "nan_from:3",
    "NAN_AT_STEP:3", "unknown:1",
])  # fmt: skip
def test_parse_rejects_unknown_or_malformed_specs(spec):
    with pytest.raises(ValueError, match="unknown fault"):
        Faults.parse(spec)


def test_parse_error_names_the_spec():
    with pytest.raises(ValueError) as info:
        Faults.parse("nan_at_step:x")
    assert "'nan_at_step:x'" in str(info.value)


def test_nan_at_step_poisons_that_step_only():
    faults = Faults.parse("nan_at_step:4")
    assert [step for step in range(10) if faults.poisons(step)] == [4]


def test_nan_from_step_poisons_that_step_and_every_later_one():
    faults = Faults.parse("nan_from_step:5")
    assert [step for step in range(10) if faults.poisons(step)] == [5, 6, 7, 8, 9]
    assert faults.poisons(10_000)


def test_both_nan_faults_together():
    faults = Faults(nan_at_step=2, nan_from_step=6)
    assert [step for step in range(9) if faults.poisons(step)] == [2, 6, 7, 8]


def test_no_faults_poisons_nothing_and_its_hooks_do_nothing(kills):
    assert NO_FAULTS == Faults()
    assert not any(NO_FAULTS.poisons(step) for step in range(1000))
    for step in range(100):
        NO_FAULTS.after_step(step)
    NO_FAULTS.after_tmp_write()
    assert kills == []


def test_sigkill_at_step_kills_after_that_step_only(kills):
    faults = Faults.parse("sigkill_at_step:3")
    for step in (1, 2):
        faults.after_step(step)
    assert kills == []
    faults.after_step(3)
    assert kills == [(os.getpid(), signal.SIGKILL)]
    faults.after_step(4)
    faults.after_tmp_write()  # not asked for: no kill inside a save
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_sigkill_after_tmp_write_kills_inside_a_save_only(kills):
    faults = Faults.parse("sigkill_after_tmp_write")
    for step in range(5):
        faults.after_step(step)
    assert kills == []
    faults.after_tmp_write()
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_nan_faults_never_kill(kills):
    for spec in ("nan_at_step:2", "nan_from_step:2"):
        faults = Faults.parse(spec)
        for step in range(5):
            faults.after_step(step)
        faults.after_tmp_write()
    assert kills == []


def test_faults_are_frozen():
    with pytest.raises(AttributeError):
        NO_FAULTS.nan_at_step = 3  # type: ignore[misc]
