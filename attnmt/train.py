"""``fit``: build, loop, validate, checkpoint; resumes exactly, and scales out under torchrun (DDP).

Exactness (``../shared/RELIABILITY.md``): the batches of an epoch are a pure function of (seed, epoch)
(``batching.TokenBatchSampler``), and randomness inside a step is reseeded from (seed, step, position of
the micro-batch in the step's global group). So a resumed run, or N ranks, or one rank accumulating N
micro-batches, all draw the same batches and the same dropout masks, and log the same losses.

Normalisation: each micro-batch's loss is a sum over its real target tokens, divided by the number of
target tokens of the whole step (every micro-batch, every rank). DDP averages gradients over ranks, so
the loss is multiplied by the world size first.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

from . import __version__
from .attention_maps import teacher_forced_attention
from .batching import Batch, TokenBatchSampler, collate
from .checkpoint import (
    FORMAT,
    bytes_tensor,
    diff_dicts,
    latest_checkpoint,
    prune_checkpoints,
    read_pointer,
    remove_stale_tmp,
    save_checkpoint,
    write_pointer,
)
from .config import Config
from .decode import Translator
from .errors import AttnmtError, CheckpointError, ConfigError, DataError, DivergedError, ResourceError
from .loss import label_smoothed_nll
from .metrics import corpus_scores
from .models import build_model
from .prepare import prepare
from .runfiles import RunDir, atomic_write_text
from .tokenizer import PAD_ID, Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

# train.* keys that may change when a run resumes: they do not change what the steps compute.
RESUMABLE = {"max_steps", "max_epochs", "max_minutes", "valid_beam_size", "log_every", "eval_every", "save_every", "keep_last", "keep_best",
             "patience", "plot_every", "tensorboard", "run_dir", "max_nonfinite", "compile", "device"}


class Interrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after saving; ``exit_code`` is 130 or 143."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}; checkpoint saved")
        self.exit_code = 128 + signum


# ---------------------------------------------------------------------------------------- helpers


@dataclass
class Dist:
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where collectives' tensors live

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.active:
            torch_dist.barrier()

    def all_sum(self, values: list[float]) -> list[float]:
        if not self.active:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)  # nccl needs CUDA tensors
        torch_dist.all_reduce(tensor)
        return tensor.tolist()


def setup_distributed(device: torch.device) -> Dist:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; without them this is a one-process run on the same path."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(world, torch_dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), device)


def choose_device(name: str) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("train.device: CUDA is not available on this machine; use device: cpu or auto")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def step_seed(seed: int, step: int, position: int) -> int:
    """A seed for one micro-batch, the same whichever rank or accumulation slot computes it."""
    digest = hashlib.sha256(f"{seed}/{step}/{position}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


class Schedule:
    """Learning rate per step: linear warmup, then inverse_sqrt | cosine | constant, times a plateau factor.

    The plateau factor halves the rate after ``PLATEAU_PATIENCE`` validations without improvement
    (schedule ``plateau``). All state is plain numbers, saved in checkpoints.
    """

    PLATEAU_PATIENCE, PLATEAU_FACTOR = 2, 0.5

    def __init__(self, kind: str, peak: float, warmup: int, total: int, min_lr: float) -> None:
        self.kind, self.peak, self.warmup, self.total, self.min_lr = kind, peak, warmup, max(total, 1), min_lr
        self.factor, self.bad_evals, self.best = 1.0, 0, None

    def lr(self, step: int) -> float:
        """The rate for optimizer step ``step`` (1-based)."""
        if self.warmup and step <= self.warmup:
            return self.peak * step / self.warmup
        if self.kind == "inverse_sqrt":
            rate = self.peak * math.sqrt(max(self.warmup, 1) / step)
        elif self.kind == "cosine":
            progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
            rate = self.min_lr + 0.5 * (self.peak - self.min_lr) * (1 + math.cos(math.pi * progress))
        else:  # constant, plateau
            rate = self.peak
        return max(self.min_lr, rate * self.factor)

    def observe(self, score: float, higher_is_better: bool) -> None:
        if self.kind != "plateau":
            return
        if self.best is None or (score > self.best if higher_is_better else score < self.best):
            self.best, self.bad_evals = score, 0
            return
        self.bad_evals += 1
        if self.bad_evals >= self.PLATEAU_PATIENCE:
            self.factor *= self.PLATEAU_FACTOR
            self.bad_evals = 0

    def state_dict(self) -> dict:
        return {"factor": self.factor, "bad_evals": self.bad_evals, "best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.factor, self.bad_evals, self.best = state["factor"], state["bad_evals"], state["best"]


@dataclass
class Progress:
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
    log_sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # loss, nll, tgt and all tokens since the last log
    train_seconds: float = 0.0  # wall time spent in the loop, over all resumes
    best: list[dict] = field(default_factory=list)  # [{"step", "file", "sha256", "score"}], best first


@dataclass
class Corpus:
    """An encoded split in memory (from the run folder's Arrow dataset)."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    tgt_text: list[str]

    @functools.cached_property
    def lengths(self) -> list[int]:
        return [max(len(s), len(t)) + 1 for s, t in zip(self.src_ids, self.tgt_ids)]

    def batch(self, indices: list[int]) -> Batch:
        return collate([self.src_ids[i] for i in indices], [self.tgt_ids[i] for i in indices], indices)


def load_split(run: RunDir, name: str) -> Corpus | None:
    import datasets

    path = run.split(name)
    if not path.exists():
        return None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"{path}: cannot read the encoded {name} split ({type(e).__name__}); run attnmt prepare again") from None
    return Corpus(ds["src_ids"], ds["tgt_ids"], ds["tgt"])


# ------------------------------------------------------------------------------------------ fitting

Reporter = Callable[[str, dict], None]


class Trainer:
    """Holds what ``fit`` needs across steps; each method is one named piece of the loop."""

    def __init__(self, cfg: Config, run: RunDir, report: Reporter) -> None:
        self.cfg, self.tc, self.run, self.report = cfg, cfg.train, run, report
        self.device = choose_device(self.tc.device)
        self.dist = setup_distributed(self.device)
        self.stop_signal: int | None = None
        self.fault = os.environ.get("ATTNMT_FAULT", "")
        if self.tc.deterministic:
            torch.use_deterministic_algorithms(True)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    # ---------------------------------------------------------------- set-up

    def setup(self, resume: bool) -> None:
        cfg, run = self.cfg, self.run
        if resume and not any(run.checkpoints.glob("step_*.pt")):
            raise CheckpointError(f"{run.root}: --resume given, but the run folder has no checkpoint")
        if self.dist.main:
            remove_stale_tmp(run)
            # config.yaml is written last, so without it an earlier prepare stopped halfway: prepare again.
            if not run.split("train").exists() or not run.tokenizer.exists() or not run.config.exists():
                self.report("message", {"text": "preparing data (attnmt prepare) ..."})
                prepare(cfg, run)
            else:
                self._check_prepared()
        self.dist.barrier()
        # The checkpoint names its tokenizer, so a swapped model file is refused before sentencepiece parses it.
        found = latest_checkpoint(run)
        expected = (found[1].get("fingerprint") or {}).get("tokenizer") if found is not None else None
        self.tokenizer: Tokenizer = load_tokenizer(run.tokenizer, expected)
        self.train_data = load_split(run, "train")
        self.dev_data = load_split(run, "dev")
        self.sampler = TokenBatchSampler(
            self.train_data.lengths, self.tc.max_tokens, self.tc.seed,
            num_replicas=self.dist.world_size, rank=self.dist.rank, multiple_of=self.tc.accum_steps,
        )
        self.steps_per_epoch = len(self.sampler) // self.tc.accum_steps
        torch.manual_seed(self.tc.seed)  # the initial weights follow from train.seed too, not from chance
        self.model = build_model(cfg.model, self.tokenizer.src_vocab_size, self.tokenizer.tgt_vocab_size, PAD_ID).to(self.device)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.tc.lr, betas=tuple(self.tc.betas),
        )
        total = self.tc.max_steps or self.tc.max_epochs * self.steps_per_epoch
        self.total_steps = total
        self.schedule = Schedule(self.tc.schedule, self.tc.lr, self.tc.warmup_steps, total, self.tc.min_lr)
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.tc.precision) if self.device.type == "cuda" else None
        self.scaler = torch.amp.GradScaler("cuda") if self.autocast_dtype == torch.float16 else None
        self.progress = Progress()
        self.fingerprint = self._fingerprint()
        if found is not None:
            self._restore(*found)
        elif self.dist.main:
            self._truncate_metrics(0)  # records of a run killed before its first checkpoint
        self.ddp_model = self.model
        if self.dist.active:
            self.ddp_model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.forward = torch.compile(self.ddp_model) if self.tc.compile else self.ddp_model
        self.tensorboard = None
        if self.tc.tensorboard and self.dist.main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("train.tensorboard: needs the tensorboard package (pip install tensorboard)") from None
            self.tensorboard = SummaryWriter(str(run.root / "tensorboard"))

    def _check_prepared(self) -> None:
        """The run folder's data must come from the same data and tokenizer settings as this config."""
        from .config import load_config

        stored = load_config(self.run.config)
        changes = diff_dicts(
            {"data": stored.data.model_dump(mode="json"), "tokenizer": stored.tokenizer.model_dump(mode="json")},
            {"data": self.cfg.data.model_dump(mode="json"), "tokenizer": self.cfg.tokenizer.model_dump(mode="json")},
        )
        if changes:
            raise ConfigError(
                f"{self.run.root}: this run was prepared with other data or tokenizer settings ({'; '.join(changes[:3])}); "
                "use another --run-dir"
            )

    def _fingerprint(self) -> dict:
        dynamics = {k: v for k, v in self.tc.model_dump(mode="json").items() if k not in RESUMABLE}
        dynamics["world_size"] = self.dist.world_size
        return {
            "model": self.cfg.model.model_dump(mode="json"),
            "model_sha256": canonical_hash(self.cfg.model.model_dump(mode="json")),
            "dynamics": dynamics,
            "tokenizer": self.tokenizer.fingerprint(),
            "data_sha256": canonical_hash([len(self.train_data.src_ids), sum(self.train_data.lengths)]),
        }

    def _restore(self, path, payload: dict) -> None:
        if payload.get("optimizer") is None:
            raise CheckpointError(f"{path}: has no training state (an averaged checkpoint?); it can translate, not resume")
        old = payload["fingerprint"]
        if old["model_sha256"] != self.fingerprint["model_sha256"]:
            changes = diff_dicts(old["model"], self.fingerprint["model"])
            raise CheckpointError(f"{path}: checkpoint was trained with another model config ({'; '.join(changes[:4])})")
        if old["tokenizer"] != self.fingerprint["tokenizer"]:
            raise CheckpointError(f"{path}: tokenizer does not match checkpoint (expected sha256 {old['tokenizer']['src_sha256'][:12]}…)")
        if old["dynamics"] != self.fingerprint["dynamics"]:
            changes = diff_dicts(old["dynamics"], self.fingerprint["dynamics"])
            raise ConfigError(f"{path}: cannot resume with changed training settings: {'; '.join(changes[:4])}")
        if old["data_sha256"] != self.fingerprint["data_sha256"]:
            raise DataError(f"{path}: the training data changed since this checkpoint; an exact resume is impossible")
        try:
            self.model.load_state_dict(payload["model"], strict=True)
            self.optimizer.load_state_dict(payload["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{path}: does not fit the model: {str(e).splitlines()[0][:200]}") from None
        self.schedule.load_state_dict(payload["schedule"])
        if self.scaler is not None and payload.get("scaler"):
            self.scaler.load_state_dict(payload["scaler"])
        self.progress = Progress(**payload["progress"])
        if self.dist.main:
            self._truncate_metrics(self.progress.step)
        self.report("message", {"text": f"resumed from {path.name} (step {self.progress.step}, epoch {self.progress.epoch + 1})"})

    def _truncate_metrics(self, step: int) -> None:
        """Keep only records up to the checkpoint's step, so the log has no duplicate or orphan steps."""
        if not self.run.metrics.exists():
            return
        kept = []
        for line in self.run.metrics.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line + "\n")
            except ValueError:
                continue
        atomic_write_text(self.run.metrics, "".join(kept))

    # ---------------------------------------------------------------- events

    def elapsed(self) -> float:
        """Training wall time so far, over all resumes (seconds)."""
        return self._seconds_before + time.perf_counter() - self._session_start

    _session_start = _seconds_before = 0.0
    tensorboard = None

    def record(self, kind: str, values: dict) -> None:
        """Append one record to metrics.jsonl (rank 0) and show it."""
        if not self.dist.main:
            return
        line = {"event": kind, **values, "elapsed_s": round(self.elapsed(), 2)}
        with open(self.run.metrics, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        if self.tensorboard is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.tensorboard.add_scalar(f"{kind}/{key}", value, values.get("step", 0))
            self.tensorboard.flush()
        log.info("%s", json.dumps(line, ensure_ascii=False))
        self.report(kind, line)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_signal is not None:
            signal.signal(signum, signal.SIG_DFL)  # a second signal: leave at once (saves are atomic anyway)
            os.kill(os.getpid(), signum)
            return
        self.stop_signal = signum

    # ---------------------------------------------------------------- one step

    def train_step(self, group: list[list[int]]) -> dict | None:
        """Forward and backward every micro-batch of this rank's group, then maybe step; returns its totals."""
        p = self.progress
        step = p.step + 1
        batches = [self.train_data.batch(indices) for indices in group]
        local_tgt = sum(b.n_tgt_tokens for b in batches)
        local_src = sum(b.n_src_tokens for b in batches)
        global_tgt, global_src = self.dist.all_sum([float(local_tgt), float(local_src)])
        loss_sum = nll_sum = 0.0
        for m, batch in enumerate(batches):
            torch.manual_seed(step_seed(self.tc.seed, step, m * self.dist.world_size + self.dist.rank))
            batch = batch.to(self.device, non_blocking=True)
            sync = contextlib.nullcontext() if m == len(batches) - 1 or not self.dist.active else self.ddp_model.no_sync()
            with sync, torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                out = self.forward(batch)
                loss = label_smoothed_nll(out.logits, batch.tgt_out, PAD_ID, self.tc.label_smoothing)
                if self.fault == f"nan_at_step:{step}" or self.fault.startswith("nan_from_step:") and step >= int(self.fault.split(":")[1]):
                    loss.loss = loss.loss * float("nan")
                scaled = loss.loss * (self.dist.world_size / max(global_tgt, 1.0))
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += float(loss.loss.detach())
            nll_sum += float(loss.nll)
        stop_requested = float(self.stop_signal is not None)
        # Rank 0's clock decides max_minutes; the sum shares its decision, so every rank stops together.
        time_up = float(self.dist.main and self.tc.max_minutes > 0 and self.elapsed() >= 60 * self.tc.max_minutes)
        loss_sum, nll_sum, stop_requested, time_up = self.dist.all_sum([loss_sum, nll_sum, stop_requested, time_up])
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.tc.clip_norm if self.tc.clip_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        p.step = step
        if not math.isfinite(grad_norm) or not math.isfinite(loss_sum):
            # Identical on every rank after DDP's all-reduce, so every rank skips the same step.
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler:
                self.scaler.update()
            p.nonfinite_skips += 1
            p.nonfinite_in_row += 1
            self.record("nonfinite", {"step": step, "skips": p.nonfinite_skips, "sentences": [i for g in group for i in g][:32]})
            if p.nonfinite_in_row >= self.tc.max_nonfinite:
                last = read_pointer(self.run, "latest").get("step")
                raise DivergedError(
                    f"training diverged at step {step}: {p.nonfinite_in_row} non-finite steps in a row; "
                    f"last good checkpoint: {'step ' + str(last) if last is not None else 'none'}"
                )
            return {"stop": stop_requested > 0, "time_up": time_up > 0, "skipped": True}
        p.nonfinite_in_row = 0
        lr = self.schedule.lr(step)
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        p.tokens_seen += int(global_tgt + global_src)
        return {"loss": loss_sum, "nll": nll_sum, "tgt_tokens": global_tgt, "tokens": global_tgt + global_src,
                "grad_norm": grad_norm, "lr": lr, "stop": stop_requested > 0, "time_up": time_up > 0, "skipped": False}

    # ---------------------------------------------------------------- validation

    @torch.no_grad()
    def validate(self) -> dict:
        model, data = self.model, self.dev_data
        model.eval()
        loss_sum = nll_sum = tokens = 0.0
        for indices in TokenBatchSampler(data.lengths, self.cfg.decode.max_tokens, shuffle=False).batches(0):
            batch = data.batch(indices).to(self.device)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                out = model(batch)
            loss = label_smoothed_nll(out.logits, batch.tgt_out, PAD_ID, self.tc.label_smoothing)
            loss_sum, nll_sum, tokens = loss_sum + float(loss.loss), nll_sum + float(loss.nll), tokens + loss.n_tokens
        d = self.cfg.decode
        search = Translator(model, self.tokenizer, self.tc.valid_beam_size, 1, d.length_penalty, d.max_len_a, d.max_len_b,
                            d.min_len, d.max_src_len, d.max_tokens, self.device).search
        texts = self.tokenizer.decode_tgt([hyps[0].tokens for hyps in search(data.src_ids)])
        scores = corpus_scores(texts, [data.tgt_text], ("bleu", "chrf"), tgt_lang=self.cfg.data.tgt_lang)
        model.train()
        return {
            "step": self.progress.step,
            "loss": loss_sum / max(tokens, 1),
            "ppl": math.exp(min(nll_sum / max(tokens, 1), 50)),
            "bleu": scores["bleu"].score,
            "chrf": scores["chrf"].score,
            "bleu_signature": scores["bleu"].signature,
            "chrf_signature": scores["chrf"].signature,
            "example": texts[0] if texts else "",
        }

    def validation_round(self) -> bool:
        """Validate on rank 0, share the score, then every rank updates the same early-stopping and
        plateau state and, for a top-k score, saves; returns True when patience has run out."""
        p, metric = self.progress, self.tc.metric
        score = 0.0
        if self.dist.main:
            result = self.validate()
            self.record("valid", result)
            score = result[metric]
            validation_number = -(-p.step // self.tc.eval_every)  # ceil: the last, off-grid validation counts as the next
            if self.tc.plot_every and validation_number % self.tc.plot_every == 0:
                self.plot_dev()
        score = self.dist.all_sum([score])[0]
        self._last_eval = p.step
        higher = metric != "loss"
        self.schedule.observe(score, higher)
        if p.best_score is None or (score > p.best_score if higher else score < p.best_score):
            p.best_score, p.best_step, p.evals_without_improvement = score, p.step, 0
        else:
            p.evals_without_improvement += 1
        ranked = sorted(p.best + [{"step": p.step, "score": score}], key=lambda e: -e["score"] if higher else e["score"])
        if any(e["step"] == p.step for e in ranked[: self.tc.keep_best]):
            p.best = ranked[: self.tc.keep_best]
            pointer = self.save()
            if self.dist.main:
                for e in p.best:
                    if e["step"] == p.step:
                        e.update(file=pointer["file"], sha256=pointer["sha256"])
                write_pointer(self.run, "best", {**p.best[0], "metric": metric, "checkpoints": p.best})
                prune_checkpoints(self.run, self.tc.keep_last)
        return bool(self.tc.patience) and p.evals_without_improvement >= self.tc.patience

    PLOT_SENTENCES = 3

    def plot_dev(self) -> None:
        """Heatmaps of the cross-attention on the first dev sentences and their translations, into
        ``plots/step_XXXXXXXX/`` (rank 0). Looking inside is a side show: a failure is logged, never raised."""
        step = self.progress.step
        try:
            from .plot import HeatmapFigure, sentence_maps

            src_ids = self.dev_data.src_ids[: self.PLOT_SENTENCES]
            d = self.cfg.decode
            translator = Translator(self.model, self.tokenizer, self.tc.valid_beam_size, 1, d.length_penalty, d.max_len_a,
                                    d.max_len_b, d.min_len, d.max_src_len, d.max_tokens, self.device)
            self.model.eval()
            hyps = [found[0].tokens for found in translator.search(src_ids)]
            maps = teacher_forced_attention(self.model, src_ids, hyps, self.device, d.max_tokens, ["cross"])
            out, painter = self.run.root / "plots" / f"step_{step:08d}", HeatmapFigure()
            for number, (src, hyp, pair_maps) in enumerate(zip(src_ids, hyps, maps), start=1):
                labels = {"cross": (self.tokenizer.src_pieces(src) + ["</s>"], self.tokenizer.tgt_pieces(hyp) + ["</s>"])}
                sentence_maps(out, number, pair_maps, labels, title=f"step {step}: ", painter=painter)
        except Exception as e:  # any failure: training goes on
            log.warning("step %d: could not plot the dev attention: %s: %s", step, type(e).__name__, e)
        finally:
            self.model.train()

    # ---------------------------------------------------------------- checkpoints

    def save(self) -> dict:
        """Save the full training state (rank 0); every rank waits until it is on disk."""
        pointer: dict = {}
        if self.dist.main:
            payload = {
                "format": FORMAT,
                "attnmt_version": __version__,
                "torch_version": str(torch.__version__),  # str(): a TorchVersion is not weights_only-loadable
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "progress": asdict(self.progress),
                "fingerprint": self.fingerprint,
                "config": self.cfg.to_dict(),
                "tokenizer": {name: bytes_tensor(data) for name, data in self.tokenizer.files().items()},
                "tokenizer_meta": self.tokenizer.meta(self.cfg.tokenizer.model_dump(mode="json")),
            }
            pointer = save_checkpoint(self.run, payload, self.progress.step)
            prune_checkpoints(self.run, self.tc.keep_last)
        self.dist.barrier()
        self._last_saved = self.progress.step
        return pointer

    # ---------------------------------------------------------------- the loop

    def fit(self) -> dict:
        tc, p = self.tc, self.progress
        time_spent = tc.max_minutes and p.train_seconds >= 60 * tc.max_minutes
        if p.early_stopped or (tc.max_steps and p.step >= tc.max_steps) or p.epoch >= tc.max_epochs or time_spent:
            self.report("message", {"text": f"nothing to do: the run already finished at step {p.step}"})
            return {"step": p.step, "nothing_to_do": True}
        self._last_saved = p.step if p.step else -1
        self.report("start", {"step": p.step, "total": self.total_steps, "steps_per_epoch": self.steps_per_epoch,
                              "world_size": self.dist.world_size, "device": str(self.device),
                              "parameters": sum(x.numel() for x in self.model.parameters())})
        window_start = time.perf_counter()
        self._session_start, self._seconds_before = time.perf_counter(), p.train_seconds
        self.ddp_model.train()
        stop_reason = None
        while stop_reason is None and p.epoch < tc.max_epochs:
            batches = self.sampler.batches(p.epoch)
            while p.batch_in_epoch < len(batches):
                group = batches[p.batch_in_epoch : p.batch_in_epoch + tc.accum_steps]
                result = self.train_step(group)
                p.batch_in_epoch += tc.accum_steps
                epoch_done = p.batch_in_epoch >= len(batches)
                if epoch_done:
                    p.epoch, p.batch_in_epoch = p.epoch + 1, 0
                if not result["skipped"]:
                    # In the checkpointed progress, so that the first record after a resume is exact too.
                    for i, key in enumerate(("loss", "nll", "tgt_tokens", "tokens")):
                        p.log_sums[i] += result[key]
                if self.fault == f"sigkill_at_step:{p.step}":
                    os.kill(os.getpid(), signal.SIGKILL)
                if p.step % tc.log_every == 0 and p.log_sums[2]:
                    loss, nll, tgt_tokens, tokens = p.log_sums
                    elapsed = time.perf_counter() - window_start
                    self.record("train", {"step": p.step, "epoch": p.epoch + (p.batch_in_epoch / max(len(batches), 1)),
                                          "loss": loss / tgt_tokens, "nll": nll / tgt_tokens, "lr": self.schedule.lr(p.step),
                                          "tokens_per_s": tokens / max(elapsed, 1e-9), "grad_norm": result.get("grad_norm")})
                    p.log_sums, window_start = [0.0, 0.0, 0.0, 0.0], time.perf_counter()
                p.train_seconds = self.elapsed()
                if result["time_up"]:
                    stop_reason = "max_minutes"
                stop_reason = stop_reason or self._maybe_validate_and_save(result)
                if stop_reason or (tc.max_steps and p.step >= tc.max_steps):
                    stop_reason = stop_reason or "max_steps"
                    break
                if epoch_done:
                    break
        stop_reason = stop_reason or "max_epochs"
        if stop_reason.startswith("signal"):
            if self._last_saved != p.step:
                self.save()
            raise Interrupted(self.stop_signal or signal.SIGTERM, p.step)
        if self.dev_data is not None and self._last_eval != p.step and self.validation_round():
            stop_reason = "early stopping"
        p.finished, p.early_stopped = True, stop_reason == "early stopping"
        self.save()
        self.report("end", {"step": p.step, "reason": stop_reason, "best_score": p.best_score, "best_step": p.best_step})
        return {"step": p.step, "reason": stop_reason, "best_score": p.best_score, "best_step": p.best_step}

    _last_eval = -1

    def _maybe_validate_and_save(self, result: dict) -> str | None:
        p, tc = self.progress, self.tc
        if result["stop"]:
            return f"signal {self.stop_signal}"
        stop = None
        if self.dev_data is not None and p.step % tc.eval_every == 0 and self.validation_round():
            stop = "early stopping"
        if p.step % tc.save_every == 0 and self._last_saved != p.step:
            self.save()
        return stop


def _log_bug(handler: logging.Handler | None) -> None:
    """The traceback of an unexpected error (a bug) goes to RUN/train.log only; the console shows one line."""
    if handler is not None:
        handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, "internal error", None, sys.exc_info()))


# Validation batches follow decode.max_tokens, so an out-of-memory error may come from either budget.
OOM_HINT = "reduce train.max_tokens (training batches) or decode.max_tokens (validation batches); the last checkpoint is kept"


def fit(cfg: Config, run: RunDir, report: Reporter, resume: bool = False) -> dict:
    """Train ``cfg`` in ``run`` (resuming it if it has a checkpoint); the caller holds the run's lock on rank 0."""
    trainer = Trainer(cfg, run, report)
    handlers = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handlers[signum] = signal.signal(signum, trainer._on_signal)
    file_handler = None
    try:
        trainer.setup(resume)
        if trainer.dist.main:
            file_handler = logging.FileHandler(run.root / "train.log", encoding="utf-8")
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logging.getLogger("attnmt").addHandler(file_handler)
            logging.getLogger("attnmt").setLevel(logging.INFO)
        return trainer.fit()
    except torch.OutOfMemoryError:
        raise ResourceError(f"out of GPU memory: {OOM_HINT}") from None
    except RuntimeError as e:
        if "can't allocate memory" in str(e) or "DefaultCPUAllocator" in str(e):
            raise ResourceError(f"out of memory: {OOM_HINT}") from None
        _log_bug(file_handler)
        raise
    except (AttnmtError, Interrupted):
        raise
    except Exception:
        _log_bug(file_handler)
        raise
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if file_handler is not None:
            logging.getLogger("attnmt").removeHandler(file_handler)
            file_handler.close()
        if trainer.dist.active and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
