"""Fault injection for tests: a ``Faults`` object the tests hand to the trainer, never read from the
environment.

The reliability tests need faults at exact places (``docs/RELIABILITY.md``, "How it is tested"):
a SIGKILL right after a given step, a SIGKILL between writing a checkpoint's temporary file and
renaming it, a non-finite loss at or from a given step. Production code holds ``NO_FAULTS``, whose
hooks do nothing. Tests pass a ``Faults`` to ``train.fit`` in-process, or, for a training run in a
subprocess (a SIGKILL must not take pytest with it), through ``tests/fault_run.py``, which gives it to
the command line as the Click context object (``app(args, obj=faults)``).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Faults:
    sigkill_at_step: int | None = None  # SIGKILL this process after this optimizer step
    sigkill_after_tmp_write: bool = False  # SIGKILL after a checkpoint's temporary file is written
    nan_at_step: int | None = None  # a non-finite loss at this step only
    nan_from_step: int | None = None  # a non-finite loss at this step and every later one
    rank: int | None = None  # under torchrun: only the process of this RANK has the fault (None: every one)

    @classmethod
    def parse(cls, spec: str) -> Faults:
        """``sigkill_at_step:17``, ``sigkill_after_tmp_write``, ``nan_at_step:4`` or ``nan_from_step:5``,
        each optionally ``@rank:N`` (only the torchrun process of RANK N)."""
        spec, at, rank = spec.partition("@rank:")
        if at and not rank.isdigit():
            raise ValueError(f"unknown fault rank {rank!r}")
        which = {"rank": int(rank)} if at else {}
        name, colon, value = spec.partition(":")
        if name == "sigkill_after_tmp_write" and not colon:
            return cls(sigkill_after_tmp_write=True, **which)
        if name in ("sigkill_at_step", "nan_at_step", "nan_from_step") and value.isdigit():
            return cls(**{name: int(value)}, **which)
        raise ValueError(f"unknown fault {spec!r}")

    def _here(self) -> bool:
        return self.rank is None or self.rank == int(os.environ.get("RANK", "0"))

    def after_step(self, step: int) -> None:
        if self.sigkill_at_step == step and self._here():
            os.kill(os.getpid(), signal.SIGKILL)

    def after_tmp_write(self) -> None:
        if self.sigkill_after_tmp_write and self._here():
            os.kill(os.getpid(), signal.SIGKILL)

    def poisons(self, step: int) -> bool:
        """Whether the loss of ``step`` is to be made non-finite (on this process)."""
        hit = self.nan_at_step == step or (self.nan_from_step is not None and step >= self.nan_from_step)
        return hit and self._here()


NO_FAULTS = Faults()
