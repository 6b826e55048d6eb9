"""What a training run tells: its events as dataclasses, written to ``metrics.jsonl`` (and TensorBoard) by
one ``MetricsLog`` and shown by the command line's reporter.

``metrics.jsonl`` holds one JSON object per record: ``{"event": "train" | "valid" | "nonfinite", ...the
record's fields..., "elapsed_s": training seconds so far}``. ``plot-curves`` and the tests read it back.
The other events (``Started``, ``Message``, ``Finished``) are shown, not written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, ClassVar

from ..config.jsonfile import parse_json, regular_bytes
from ..errors import DataError
from ..runfiles import RunDir, atomic_write_text

log = logging.getLogger(__name__)


class StopReason(str, Enum):
    """Why the training loop ended."""

    max_steps = "max_steps"
    max_epochs = "max_epochs"
    max_minutes = "max_minutes"
    early_stopping = "early stopping"
    signal = "signal"


@dataclass
class TrainRecord:
    """The steps since the last record: token-weighted means of their losses."""

    event: ClassVar[str] = "train"
    step: int
    epoch: float  # epochs done, fractional
    loss: float | None  # label-smoothed, per target token; None with the translation frozen
    nll: float | None
    lr: float
    tokens_per_s: float  # source + target tokens
    grad_norm: float | None  # of the last step, before clipping
    align_loss: float | None = None  # guided alignment training: its loss per target token


@dataclass
class ValidRecord:
    event: ClassVar[str] = "valid"
    step: int
    loss: float
    ppl: float
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    example: str  # the first dev sentence's translation
    aer: float | None = None  # with gold alignments of the dev set (the toy task): the dev AER
    averaged: list[int] | None = None  # train.average_last: the steps whose weights were averaged

    def score(self, metric: str) -> float:
        return getattr(self, metric)


@dataclass
class NonfiniteRecord:
    event: ClassVar[str] = "nonfinite"
    step: int
    skips: int  # skipped steps so far
    sentences: list[int]  # corpus positions of (up to 32 of) the step's sentences


@dataclass
class Started:
    event: ClassVar[str] = "start"
    step: int
    total: int
    steps_per_epoch: int
    world_size: int
    device: str
    parameters: int
    precision: str = "fp32"


@dataclass
class Message:
    event: ClassVar[str] = "message"
    text: str


@dataclass
class Finished:
    event: ClassVar[str] = "end"
    step: int
    reason: StopReason | None  # None: there was nothing to do (and nothing is shown)
    best_score: float | None
    best_step: int | None


Record = TrainRecord | ValidRecord | NonfiniteRecord
Event = Record | Started | Message | Finished
Reporter = Callable[[Event], None]


def quiet(event: Event) -> None:
    """A reporter that shows nothing."""


class MetricsLog:
    """Appends records to ``metrics.jsonl`` (and TensorBoard scalars) on the main rank, logs them, and
    hands every event to the reporter. ``elapsed`` gives the training seconds each record carries."""

    def __init__(self, run: RunDir, main: bool, report: Reporter, elapsed: Callable[[], float],
                 tensorboard: Any = None) -> None:
        self.run, self.main, self.report, self.elapsed, self.tensorboard = (
            run, main, report, elapsed, tensorboard)

    def show(self, event: Event) -> None:
        if self.main:
            self.report(event)

    def record(self, record: Record) -> None:
        if not self.main:
            return
        values = asdict(record)
        line = {"event": record.event, **values, "elapsed_s": round(self.elapsed(), 2)}
        with open(self.run.metrics, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        if self.tensorboard is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.tensorboard.add_scalar(f"{record.event}/{key}", value, record.step)
            self.tensorboard.flush()
        log.info("%s", json.dumps(line, ensure_ascii=False))
        self.report(record)

    def truncate(self, step: int) -> None:
        """Keep only records up to ``step`` (a resumed checkpoint's), so the log has no duplicate or orphan
        steps; a line that is not a JSON object (half written by a killed run, perhaps inside a character)
        goes too."""
        if not self.main or not self.run.metrics.exists():
            return
        kept = []
        for raw in regular_bytes(self.run.metrics, DataError).split(b"\n"):
            try:
                record = parse_json(raw, str(self.run.metrics), DataError)
            except DataError:  # not UTF-8, not JSON, not an object
                continue
            if isinstance(record.get("step", 0), (int, float)) and record.get("step", 0) <= step:
                kept.append(raw.decode("utf-8") + "\n")
        atomic_write_text(self.run.metrics, "".join(kept))

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def open_tensorboard(run: RunDir) -> Any:
    """A ``SummaryWriter`` on ``RUN/tensorboard`` (``train.tensorboard: true``)."""
    from ..errors import ConfigError

    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("train.tensorboard: needs the tensorboard package "
                          "(pip install tensorboard)") from None
    return SummaryWriter(str(run.root / "tensorboard"))
