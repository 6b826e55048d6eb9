"""One optimizer step of training: forward and backward over a rank's micro-batches, then clip and update,
or skip a step whose loss or gradient is not finite.

Normalisation: each micro-batch's loss is a sum over its real target tokens, divided by the number of
target tokens of the whole step (every micro-batch, every rank). DDP averages gradients over ranks, so
the loss is multiplied by the world size first. Randomness inside a step is reseeded from (seed, step,
position of the micro-batch among the step's micro-batches on every rank), so N ranks and one rank
accumulating N micro-batches draw the same dropout masks. With ``tokenizer.sampling`` a micro-batch is
segmented anew (``subword_sampling``), and may run as several parts when sampling made it outgrow the token
budget: its first part keeps the micro-batch's seed, a later part k takes the seed of "position.k".
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config.schema import GuidedAlignmentConfig, TrainConfig
from ..data.batching import Batch, EncodedSplit, gather
from ..data.subword_sampling import SubwordSampler
from ..data.tokenizer import PAD_ID
from ..models import ModelOutput
from ..models.loss import LossOutput, guided_alignment_loss, label_smoothed_nll
from .distributed import Dist
from .faults import Faults
from .optim import Schedule, set_lr


@dataclass
class StepResult:
    """One optimizer step, summed over its micro-batches and ranks."""

    skipped: bool  # the loss or gradient was not finite: no update
    stop_requested: bool  # a rank got SIGINT/SIGTERM
    time_up: bool  # train.max_minutes is spent
    loss: float = 0.0  # label-smoothed loss, summed over target tokens
    nll: float = 0.0
    tgt_tokens: float = 0.0
    tokens: float = 0.0  # source + target
    grad_norm: float | None = None  # before clipping
    lr: float | None = None
    align_loss: float | None = None  # guided alignment loss, summed over supervised target pieces


def step_seed(seed: int, step: int, position: int | str) -> int:
    """A seed for one micro-batch, the same whichever rank or accumulation slot computes it."""
    digest = hashlib.sha256(f"{seed}/{step}/{position}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class OptimizerStep:
    """What one step needs: the model (``forward`` is the DDP-wrapped or compiled one), the optimizer, the
    schedule, the precision, the ranks and the training data."""

    model: torch.nn.Module
    ddp_model: torch.nn.Module
    forward: Callable
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    scaler: torch.amp.GradScaler | None
    autocast_dtype: torch.dtype | None
    dist: Dist
    device: torch.device
    cfg: TrainConfig
    data: EncodedSplit
    faults: Faults
    sampler: SubwordSampler | None = None
    """``tokenizer.sampling``: the training pairs segmented anew for each epoch."""

    def __call__(self, micro_batches: list[list[int]], step: int, stop_requested: Callable[[], bool],
                 time_up: Callable[[], bool], epoch: int = 0) -> StepResult:
        """Step ``step`` (of ``epoch``) on this rank's ``micro_batches``. ``stop_requested()`` (a signal
        arrived) and ``time_up()`` (rank 0's clock decides) are asked after the backward pass, so that a
        signal during this step stops the run after it, and shared with every rank, so that all stop
        together."""
        loss_sum, nll_sum, align_sum, global_tgt, global_src = self._backward(micro_batches, step, epoch)
        shared = [loss_sum, nll_sum, align_sum, float(stop_requested()), float(time_up())]
        loss_sum, nll_sum, align_sum, stop, up = self.dist.all_sum(shared)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self._clip()
        if not math.isfinite(grad_norm) or not math.isfinite(loss_sum):
            # Identical on every rank after DDP's all-reduce, so every rank skips the same step.
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler:
                self.scaler.update()
            return StepResult(skipped=True, stop_requested=stop > 0, time_up=up > 0)
        lr = self.schedule.lr(step)
        set_lr(self.optimizer, lr)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(False, stop > 0, up > 0, loss_sum, nll_sum, global_tgt, global_tgt + global_src,
                          grad_norm, lr, align_sum if self.cfg.alignment is not None else None)

    def _clip(self) -> float:
        """Clip the gradients to ``train.clip_norm``; returns the translation's norm before clipping. An
        alignment layer's gradients are clipped apart (so the translation's clipping is what it would be
        without it), and dropped, its update skipped, where they are not finite."""
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else float("inf")
        aligner = getattr(self.model, "aligner", None)
        if aligner is None:
            return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        own = {id(p) for p in aligner.parameters()}
        if not math.isfinite(float(torch.nn.utils.clip_grad_norm_(aligner.parameters(), max_norm))):
            for p in aligner.parameters():
                p.grad = None
        translation = [p for p in self.model.parameters() if id(p) not in own and p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(translation, max_norm)) if translation else 0.0

    def ahead(self, batches: list[list[int]], at: int, epoch: int, done: int) -> None:
        """With a sampler, the pieces of the step after the one about to run (``done`` steps run, its
        micro-batches ``batches[at:]`` of ``epoch``) drawn while this one computes; none past
        ``train.max_steps`` or the epoch's end."""
        if self.sampler is None or (self.cfg.max_steps and done + 2 > self.cfg.max_steps):
            return
        accum = self.cfg.accum_steps
        for indices in batches[at + accum : at + 2 * accum]:
            self.sampler.ahead(indices, epoch, self.cfg.max_tokens)

    def _parts(self, micro_batches: list[list[int]], step: int, epoch: int) -> list[tuple[int, Batch]]:
        """Each micro-batch as a ``Batch`` with the seed of its randomness; with a sampler, segmented for
        ``epoch``, in as many parts as ``train.max_tokens`` needs."""
        parts = []
        for m, indices in enumerate(micro_batches):
            position = m * self.dist.world_size + self.dist.rank
            if self.sampler is None:
                parts.append((step_seed(self.cfg.seed, step, position), gather(self.data, indices)))
                continue
            batches = self.sampler.batches(indices, epoch, self.cfg.max_tokens)
            parts += [(step_seed(self.cfg.seed, step, f"{position}.{k}" if k else position), batch)
                      for k, batch in enumerate(batches)]
        return parts

    def _backward(self, micro_batches: list[list[int]], step: int,
                  epoch: int) -> tuple[float, float, float, float, float]:
        """Gradients of this rank's micro-batches, each loss over the step's target tokens on every rank;
        returns (loss sum, nll sum, guided alignment loss sum, global target tokens, global source tokens).
        With ``train.alignment``, the loss is the translation loss + weight * the alignment loss."""
        guided = self.cfg.alignment
        layer = guided is not None and guided.module == "layer"
        align_layer = guided.layer - 1 if guided is not None and not layer else None
        frozen = layer and guided.translation == "frozen"
        if frozen:  # the translation as it decodes (no dropout), and only what the layer reads: no loss
            self.model.eval()
            self.model.aligner.train()
        parts = self._parts(micro_batches, step, epoch)
        local_tgt, local_src = sum(b.n_tgt_tokens for _, b in parts), sum(b.n_src_tokens for _, b in parts)
        global_tgt, global_src = self.dist.all_sum([float(local_tgt), float(local_src)])
        loss_sum = nll_sum = align_sum = 0.0
        autocast = {"dtype": self.autocast_dtype, "enabled": self.autocast_dtype is not None}
        for m, (seed, batch) in enumerate(parts):
            torch.manual_seed(seed)
            batch = batch.to(self.device, non_blocking=True)
            last = m == len(parts) - 1 or not self.dist.active
            with (contextlib.nullcontext() if last else self.ddp_model.no_sync(),
                  torch.autocast(self.device.type, **autocast)):
                if frozen:
                    out = self.forward(batch, align_only=True)
                elif align_layer is not None:
                    out = self.forward(batch, align_layer=align_layer, full_context=guided.full_context)
                else:
                    out = self.forward(batch)
                loss = (LossOutput(torch.zeros(()), torch.zeros(()), 0) if frozen else
                        label_smoothed_nll(out.logits, batch.tgt_out, PAD_ID, self.cfg.label_smoothing))
                if self.faults.poisons(step):
                    loss.loss = loss.loss * float("nan")
                total = loss.loss
                if guided is not None:
                    aligned = alignment_loss(guided, out, batch)
                    total = total + guided.weight * aligned
                    align_sum += float(aligned.detach())
                scaled = total * (self.dist.world_size / max(global_tgt, 1.0))
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += float(loss.loss.detach())
            nll_sum += float(loss.nll)
        return loss_sum, nll_sum, align_sum, global_tgt, global_src


def alignment_loss(guided: GuidedAlignmentConfig, out: ModelOutput, batch: Batch) -> torch.Tensor:
    """``train.alignment``'s loss, a sum over target pieces: the taught heads' or the alignment layer's
    weights against the batch's links, or the alignment layer's predictions (``objective: predict``)."""
    if guided.objective == "predict":
        return label_smoothed_nll(out.align_logits, batch.tgt_out, PAD_ID, 0.0).loss
    heads = [h - 1 for h in guided.heads] if guided.module == "head" else [0]
    return guided_alignment_loss(out.alignment, batch.align, heads)
