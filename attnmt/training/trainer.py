"""``fit``: build, loop, validate, checkpoint; resumes exactly, and scales out under torchrun (DDP).

Exactness (``docs/RELIABILITY.md``): an epoch's batches are a pure function of (seed, epoch) (``batching.
TokenBatchSampler``), sampled pieces (``subword_sampling``) of (seed, epoch, example), a step's randomness
is reseeded from (seed, step, the micro-batch's place among the step's on every rank). So a resumed run, N
ranks, or one rank accumulating N micro-batches, draw the same batches and dropout, and log the same losses.

The parts: ``runstart``, ``step``, ``distributed``, ``optim``, ``checkpoint`` (payload, resume checks),
``keeper``, ``averaging``, ``validation``, ``runlog`` (records, events), ``faults`` (test faults),
``allocator`` (freed memory kept); the package's ``__init__`` says more. ``Trainer`` holds them all."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..config.choices import improves
from ..config.schema import Config
from ..data.batching import load_split
from ..data.prepare import prepare
from ..data.tokenizer import PAD_ID
from ..errors import AttnmtError, CheckpointError, DivergedError, is_out_of_memory
from ..models import build_model
from ..models.checkpoint import (
    fingerprint,
    latest_checkpoint,
    read_pointer,
    restore_training,
    save_checkpoint,
    sha256_file,
    training_payload,
)
from ..runfiles import RunDir, remove_stale
from . import runstart
from .allocator import keep_freed_memory
from .averaging import average_newest, point_best
from .distributed import choose_device, setup_distributed
from .faults import NO_FAULTS, Faults
from .keeper import CheckpointKeeper
from .optim import Schedule, make_optimizer
from .runlog import (
    Finished,
    Message,
    MetricsLog,
    NonfiniteRecord,
    Reporter,
    Started,
    StopReason,
    TrainRecord,
    open_tensorboard,
)
from .step import OptimizerStep, StepResult
from .validation import Validator

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after saving; ``exit_code`` is 130 or 143."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}; checkpoint saved")
        self.exit_code = 128 + signum


@dataclass
class Progress:
    """The trainer's counters; saved in every checkpoint (as a dict), so a resume continues them exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # index into this rank's batch list of the next batch to train on
    tokens_seen: int = 0
    nonfinite_skips: int = 0
    nonfinite_in_row: int = 0
    best_score: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    finished: bool = False  # the loop ended (informational: a larger max_steps/epochs/minutes continues it)
    early_stopped: bool = False  # patience ran out: the run is over for good
    # loss, nll, tgt and all tokens, guided alignment loss since the last log
    log_sums: list[float] = field(default_factory=lambda: [0.0] * 5)
    train_seconds: float = 0.0  # wall time spent in the loop, over all resumes
    # [{"step", "file", "sha256", "score"}], best first (``keeper``)
    best: list[dict] = field(default_factory=list)


class Trainer:
    """Holds what ``fit`` needs across steps; each method is one named piece of the loop."""

    def __init__(self, cfg: Config, run: RunDir, report: Reporter, faults: Faults = NO_FAULTS) -> None:
        runstart.preflight(cfg)
        self.cfg, self.tc, self.run, self.faults = cfg, cfg.train, run, faults
        self.device = choose_device(self.tc.device)
        # Refused here (fp16 on the CPU), before the run folder is touched.
        self.autocast_dtype = runstart.autocast_dtype(self.tc.precision, self.device)
        self.dist = setup_distributed(self.device)
        self.log = MetricsLog(run, self.dist.main, report, self.elapsed)
        self.keeper = CheckpointKeeper(run, self.tc.keep_last, self.tc.keep_best, self.tc.metric)
        self.stop_signal: int | None = None
        self._session_start, self._seconds_before = time.perf_counter(), 0.0
        self._last_eval = self._last_saved = -1
        if self.tc.deterministic:
            torch.use_deterministic_algorithms(True)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    # ---------------------------------------------------------------- set-up

    def setup(self, resume: bool) -> None:
        """Prepare the data if needed, build everything, and restore the latest checkpoint if there is one."""
        run = self.run
        if resume and not any(run.checkpoints.glob("step_*.pt")):
            raise CheckpointError(f"{run.root}: --resume given, but the run folder has no checkpoint")
        fresh = not any(run.checkpoints.glob("step_*.pt"))
        self.initial = (runstart.initial_weights(self.cfg, run, self.dist.main)
                        if fresh and self.tc.init_from is not None else None)
        if self.dist.main:
            remove_stale(run)  # what a killed process left half-written (RunLock did it for the CLI)
            if runstart.data_to_prepare(self.cfg, run):
                self.log.show(Message("preparing data (attnmt prepare) ..."))
                prepare(self.cfg, run)
        self.dist.barrier()
        keep_freed_memory()  # every step reuses the last one's pages (allocator.py; bench_train --profile)
        # The checkpoint names its tokenizer: a swapped model file is refused before sentencepiece reads it.
        found = latest_checkpoint(run)
        self.tokenizer = runstart.run_tokenizer(run, found)
        self.train_data = load_split(run, "train")
        dev_data = load_split(run, "dev")
        if self.tc.alignment is not None and self.tc.alignment.objective == "links":
            self.train_data.align, said = runstart.guided_links(self.cfg, run, self.train_data,
                                                                self.tokenizer)
            self.log.show(Message(said))
        self.resampled = runstart.resampler(self.cfg, self.train_data, self.tokenizer)
        self.sampler = runstart.train_sampler(self.cfg, self.train_data, self.dist.world_size, self.dist.rank,
                                              self.resampled)
        self.steps_per_epoch = len(self.sampler) // self.tc.accum_steps
        self.total_steps = self.tc.max_steps or self.tc.max_epochs * self.steps_per_epoch
        self._build()
        self.validator = (Validator(self.cfg, self.tokenizer, dev_data, self.device, self.autocast_dtype)
                          if dev_data else None)
        self.progress = Progress()
        self.fingerprint = fingerprint(self.cfg, self.dist.world_size, self.tokenizer,
                                       self.train_data.lengths)
        if found is not None:
            self._restore(*found)
        elif self.initial is not None:
            runstart.load_initial(self.model, *self.initial)
            self.log.show(Message(f"fine-tuning from {self.initial[1]} (its weights; a fresh optimizer and "
                                  "schedule)"))
            self.log.truncate(0)
        else:
            self.log.truncate(0)  # records of a run killed before its first checkpoint
        self.ddp_model = self.model
        if self.dist.active:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp_model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids)
        forward = torch.compile(self.ddp_model) if self.tc.compile else self.ddp_model
        self.optimizer_step = OptimizerStep(self.model, self.ddp_model, forward, self.optimizer,
                                            self.schedule, self.scaler, self.autocast_dtype, self.dist,
                                            self.device, self.tc, self.train_data, self.faults,
                                            self.resampled)
        if self.tc.tensorboard and self.dist.main:
            self.log.tensorboard = open_tensorboard(run)

    def _build(self) -> None:
        """The model (its initial weights follow from train.seed), optimizer, schedule and precision."""
        torch.manual_seed(self.tc.seed)
        tokenizer = self.tokenizer
        self.model = build_model(self.cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size,
                                 PAD_ID, self.tc).to(self.device)
        self.model.gradient_checkpointing = self.tc.gradient_checkpointing
        self.optimizer = make_optimizer(self.model, self.tc)
        self.schedule = Schedule.from_config(self.tc, self.total_steps)
        self.scaler = torch.amp.GradScaler("cuda") if self.autocast_dtype == torch.float16 else None

    def _restore(self, path, payload: dict) -> None:
        state = restore_training(path, payload, self.fingerprint, self.model, self.optimizer, self.schedule,
                                 self.scaler)
        self.progress = Progress(**state)
        self.progress.log_sums += [0.0] * (5 - len(self.progress.log_sums))  # from before align_loss: 4
        for entry in self.progress.best:
            if entry["step"] == self.progress.step and entry.get("file") == path.name:
                # A file cannot hold its own hash: the ranking saved inside it names the save before it.
                entry["sha256"] = sha256_file(path)
        self.log.truncate(self.progress.step)
        self.log.show(Message(f"resumed from {path.name} (step {self.progress.step}, "
                              f"epoch {self.progress.epoch + 1})"))

    # ---------------------------------------------------------------- the loop

    def fit(self) -> Finished:
        p = self.progress
        if self._finished_before():
            self.log.show(Message(f"nothing to do: the run already finished at step {p.step}"))
            return Finished(p.step, None, p.best_score, p.best_step)
        self._start()
        reason = None
        while reason is None:
            reason = self._train_epoch()
        if reason is StopReason.signal:
            if self._last_saved != p.step:
                self.save()  # first, so that a second signal during the validation loses no step
            if self.validator is not None and self._last_eval != p.step:
                # The last weights are validated, so the run folder's best can be them.
                self.validation_round()
                self.save()  # with this validation's counters (best score, patience)
            raise Interrupted(self.stop_signal or signal.SIGTERM, p.step)
        if self.validator is not None and self._last_eval != p.step and self.validation_round():
            reason = StopReason.early_stopping
        p.finished, p.early_stopped = True, reason is StopReason.early_stopping
        self.save()
        if self.tc.average_last:
            self.average_last()
        end = Finished(p.step, reason, p.best_score, p.best_step)
        self.log.show(end)
        return end

    def _finished_before(self) -> bool:
        p, tc = self.progress, self.tc
        time_spent = tc.max_minutes and p.train_seconds >= 60 * tc.max_minutes
        return bool(p.early_stopped or (tc.max_steps and p.step >= tc.max_steps) or p.epoch >= tc.max_epochs
                    or time_spent)

    def _start(self) -> None:
        p = self.progress
        self._last_saved = p.step if p.step else -1
        parameters = sum(x.numel() for x in self.model.parameters())
        precision = runstart.describe_precision(self.tc.precision, self.device)
        log.info("training on %s in %s", self.device, precision)  # train.log keeps the choice
        self.log.show(Started(p.step, self.total_steps, self.steps_per_epoch, self.dist.world_size,
                              str(self.device), parameters, precision))
        self._window_start = self._session_start = time.perf_counter()
        self._seconds_before = p.train_seconds
        self.ddp_model.train()

    def _train_epoch(self) -> StopReason | None:
        """Train on the rest of the current epoch: a reason to stop, or None to go on with the next epoch."""
        p, tc = self.progress, self.tc
        if p.epoch >= tc.max_epochs:
            return StopReason.max_epochs
        batches = self.sampler.batches(p.epoch)
        while p.batch_in_epoch < len(batches):
            self.optimizer_step.ahead(batches, p.batch_in_epoch, p.epoch, p.step)
            result = self.train_step(batches[p.batch_in_epoch : p.batch_in_epoch + tc.accum_steps])
            p.batch_in_epoch += tc.accum_steps
            epoch_done = p.batch_in_epoch >= len(batches)
            if epoch_done:
                p.epoch, p.batch_in_epoch = p.epoch + 1, 0
            reason = self._after_step(result, len(batches))
            if reason is not None or epoch_done:
                return reason
        return None

    def _after_step(self, result: StepResult, epoch_batches: int) -> StopReason | None:
        """Log, validate and save as the settings ask; a reason to stop, if there is one."""
        p, tc = self.progress, self.tc
        if not result.skipped:
            # In the checkpointed progress, so that the first record after a resume is exact too.
            values = (result.loss, result.nll, result.tgt_tokens, result.tokens, result.align_loss or 0.0)
            p.log_sums = [total + value for total, value in zip(p.log_sums, values)]
        self.faults.after_step(p.step)
        if p.step % tc.log_every == 0 and p.log_sums[2]:
            self._log_train(result, epoch_batches)
        p.train_seconds = self.elapsed()
        if result.time_up:
            return StopReason.max_minutes
        if result.stop_requested:
            return StopReason.signal
        reason = None
        if self.validator is not None and p.step % tc.eval_every == 0 and self.validation_round():
            reason = StopReason.early_stopping
        if p.step % tc.save_every == 0 and self._last_saved != p.step:
            self.save()
        if reason is None and tc.max_steps and p.step >= tc.max_steps:
            reason = StopReason.max_steps
        return reason

    def _log_train(self, result: StepResult, epoch_batches: int) -> None:
        p = self.progress
        loss, nll, tgt_tokens, tokens, aligned = p.log_sums
        speed = tokens / max(time.perf_counter() - self._window_start, 1e-9)
        epoch = p.epoch + p.batch_in_epoch / max(epoch_batches, 1)
        guided = self.tc.alignment
        frozen = guided is not None and guided.translation == "frozen"  # no translation loss computed
        losses = [None if frozen else x / tgt_tokens for x in (loss, nll)]
        self.log.record(TrainRecord(p.step, epoch, *losses, self.schedule.lr(p.step), speed, result.grad_norm,
                                    aligned / tgt_tokens if guided is not None else None))
        p.log_sums, self._window_start = [0.0] * 5, time.perf_counter()

    def elapsed(self) -> float:
        """Training wall time so far, over all resumes (seconds)."""
        return self._seconds_before + time.perf_counter() - self._session_start

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_signal is not None:
            signal.signal(signum, signal.SIG_DFL)  # a second signal: leave at once (saves are atomic anyway)
            os.kill(os.getpid(), signum)
            return
        self.stop_signal = signum

    # ---------------------------------------------------------------- one step

    def train_step(self, micro_batches: list[list[int]]) -> StepResult:
        """One optimizer step on this rank's share of the step's micro-batches; counts a skipped one."""
        p, tc, step = self.progress, self.tc, self.progress.step + 1

        def time_up() -> bool:
            return self.dist.main and tc.max_minutes > 0 and self.elapsed() >= 60 * tc.max_minutes

        result = self.optimizer_step(micro_batches, step, lambda: self.stop_signal is not None, time_up,
                                     p.epoch)
        p.step = step
        if result.skipped:
            self._skip_step(step, micro_batches)
        else:
            p.nonfinite_in_row = 0
            p.tokens_seen += int(result.tokens)
        return result

    def _skip_step(self, step: int, micro_batches: list[list[int]]) -> None:
        """Count and log a skipped step (``step.OptimizerStep``: a non-finite loss or gradient, the same on
        every rank); too many in a row stop the run (exit 6)."""
        p = self.progress
        p.nonfinite_skips += 1
        p.nonfinite_in_row += 1
        self.log.record(NonfiniteRecord(step, p.nonfinite_skips,
                                        [int(i) for batch in micro_batches for i in batch[:32]][:32]))
        if p.nonfinite_in_row >= self.tc.max_nonfinite:
            last = read_pointer(self.run, "latest").get("step")
            raise DivergedError(
                f"training diverged at step {step}: {p.nonfinite_in_row} non-finite steps in a row; "
                f"last good checkpoint: {'step ' + str(last) if last is not None else 'none'}"
            )

    # ---------------------------------------------------------------- validation and checkpoints

    def validation_round(self) -> bool:
        """Validate on rank 0, share the score, then every rank updates the same early-stopping and
        plateau state and, for a top-k score, saves; returns True when patience has run out."""
        p, metric = self.progress, self.tc.metric
        score = 0.0
        if self.dist.main:
            result = self.validator.validate(self.model, p.step)
            self.log.record(result)
            score = result.score(metric)
            # ceil: the last, off-grid validation counts as the next
            validation_number = -(-p.step // self.tc.eval_every)
            if self.tc.plot_every and validation_number % self.tc.plot_every == 0:
                self.validator.plot(self.model, p.step, self.run.root / "plots" / f"step_{p.step:08d}")
        score = self.dist.all_sum([score])[0]
        self._last_eval = p.step
        self.schedule.observe(score, self.keeper.higher_is_better)
        if improves(score, p.best_score, self.keeper.higher_is_better):
            p.best_score, p.best_step, p.evals_without_improvement = score, p.step, 0
        else:
            p.evals_without_improvement += 1
        ranking = self.keeper.admit(p.best, p.step, score)
        if ranking is not None:
            p.best = ranking
            pointer = self.save()
            if self.dist.main:
                self.keeper.saved_best(p.best, pointer)
        return bool(self.tc.patience) and p.evals_without_improvement >= self.tc.patience

    def average_last(self) -> None:
        """``train.average_last`` (``averaging``), validated on rank 0."""
        if self.dist.main:
            average = average_newest(self.run, self.tc.average_last)
            if isinstance(average, list):
                self.log.show(Message(f"train.average_last: {len(average)} checkpoint, nothing to average"))
            elif self.validator is None:
                self.log.show(Message(average.describe()))
            else:
                model = copy.deepcopy(self.model)
                model.load_state_dict(average.payload["model"], strict=True)
                result = self.validator.validate(model, self.progress.step)
                self.log.record(dataclasses.replace(result, averaged=average.steps))
                self.log.show(Message(point_best(self.run, average, result.score(self.tc.metric),
                                                 self.progress.best, self.tc.metric,
                                                 self.keeper.higher_is_better, self.progress.step)))
        self.dist.barrier()

    def save(self) -> dict:
        """Save the full training state (rank 0); every rank waits until it is on disk."""
        pointer: dict = {}
        if self.dist.main:
            payload = training_payload(self.cfg, self.tokenizer, self.fingerprint, self.model, self.optimizer,
                                       self.schedule, self.scaler, asdict(self.progress))
            pointer = save_checkpoint(self.run, payload, self.progress.step, self.faults.after_tmp_write)
            if any(entry["step"] == self.progress.step for entry in self.progress.best):
                # This step's file was written again (the save at the end of a run, after the validation
                # that ranked it): best.json takes its new sha256.
                self.keeper.saved_best(self.progress.best, pointer)
            else:
                self.keeper.prune()
        self.dist.barrier()
        self._last_saved = self.progress.step
        return pointer


def _log_bug(handler: logging.Handler | None) -> None:
    """The traceback of an unexpected error (a bug) goes to RUN/train.log only; the console shows one line."""
    if handler is not None:
        handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, "internal error", None,
                                      sys.exc_info()))


def fit(cfg: Config, run: RunDir, report: Reporter, resume: bool = False,
        faults: Faults = NO_FAULTS) -> Finished:
    """Train ``cfg`` in ``run`` (resuming it if it has a checkpoint); the caller holds the run's lock
    on rank 0.

    SIGINT and SIGTERM finish the step, save and raise ``Interrupted``; an out-of-memory error propagates
    for the caller to report (``errors.is_out_of_memory``); any other unexpected error is logged with its
    traceback in ``RUN/train.log`` and propagates."""
    trainer = Trainer(cfg, run, report, faults)
    handlers = {signum: signal.signal(signum, trainer.on_signal)
                for signum in (signal.SIGINT, signal.SIGTERM)}
    file_handler = None
    try:
        trainer.setup(resume)
        if trainer.dist.main:
            file_handler = logging.FileHandler(run.root / "train.log", encoding="utf-8")
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logging.getLogger("attnmt").addHandler(file_handler)
            logging.getLogger("attnmt").setLevel(logging.INFO)
        return trainer.fit()
    except (AttnmtError, Interrupted):
        raise
    except Exception as e:
        if not is_out_of_memory(e):
            _log_bug(file_handler)
        raise
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if file_handler is not None:
            logging.getLogger("attnmt").removeHandler(file_handler)
            file_handler.close()
        trainer.log.close()
        trainer.dist.close()
