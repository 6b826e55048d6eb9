"""Checkpoint averaging: the weights of several checkpoints of one model config averaged into one
(``average_checkpoints``: ``attnmt average``); and ``train.average_last``: at the end of a run, the newest
k checkpoints averaged into ``checkpoints/average.pt``, and once the average is validated, ``best.json``
names it only when it scores better than the best checkpoint (never against an earlier end's average,
which average.pt no longer holds). Validation is the caller's (``train.Trainer.average_last``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config.choices import improves
from ..errors import CheckpointError
from ..models.checkpoint import (
    AVERAGE_FILE,
    STEP_FILE,
    diff_dicts,
    load_checkpoint,
    save_payload,
    sha256_file,
    write_pointer,
)
from ..runfiles import RunDir


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """A checkpoint payload whose weights are the element-wise mean of those in ``paths`` (Vaswani et al.
    2017, sec. 6.1: the last checkpoints of a run, averaged, translate better than any one of them).

    All files must hold the same model config and tokenizer. Floating-point tensors are summed in float64
    and cast back; other tensors must be equal and are kept. The result is the first file's payload with
    the mean weights and its progress, without optimizer, schedule or scaler state (it translates and
    scores, it does not resume training), plus ``averaged_from``: the file names in order.
    """
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise ValueError("averaging needs at least two checkpoints")
    first = load_checkpoint(paths[0])
    fingerprint = first.get("fingerprint")
    if (not isinstance(fingerprint, dict) or "model_sha256" not in fingerprint
            or "tokenizer" not in fingerprint):
        raise CheckpointError(f"{paths[0]}: checkpoint has no model and tokenizer fingerprint")
    sums: dict[str, torch.Tensor] = {}
    for i, path in enumerate(paths):
        payload = first if i == 0 else load_checkpoint(path)
        other = payload.get("fingerprint") or {}
        if other.get("model_sha256") != fingerprint["model_sha256"]:
            changes = diff_dicts(fingerprint.get("model"), other.get("model"))
            raise CheckpointError(f"{path}: another model config than {paths[0].name} "
                                  f"({'; '.join(changes[:4]) or 'fingerprints differ'})")
        if other.get("tokenizer") != fingerprint["tokenizer"]:
            raise CheckpointError(f"{path}: tokenizer does not match {paths[0].name}")
        state = payload["model"]
        if sums and state.keys() != sums.keys():
            raise CheckpointError(f"{path}: other parameter names than {paths[0].name} "
                                  f"({', '.join(sorted(state.keys() ^ sums.keys())[:4])})")
        for name, tensor in state.items():
            if name in sums and ((tensor.shape, tensor.is_floating_point())
                                 != (sums[name].shape, sums[name].is_floating_point())):
                raise CheckpointError(f"{path}: {name} is {tensor.dtype} {tuple(tensor.shape)}, "
                                      f"in {paths[0].name} "
                                      f"{first['model'][name].dtype} {tuple(sums[name].shape)}")
            if not tensor.is_floating_point():
                if name in sums and not torch.equal(tensor, sums[name]):
                    raise CheckpointError(f"{path}: {name} differs from {paths[0].name} "
                                          "(not a float tensor, so not averaged)")
                sums[name] = tensor
            elif not bool(torch.isfinite(tensor).all()):
                raise CheckpointError(f"{path}: parameter {name} holds non-finite values")
            elif name in sums:
                sums[name] += tensor.double()
            else:
                sums[name] = tensor.to(torch.float64, copy=True)
    dtypes = {name: tensor.dtype for name, tensor in first["model"].items()}
    model = {name: (s / len(paths)).to(dtypes[name]) if dtypes[name].is_floating_point else s
             for name, s in sums.items()}
    return {**first, "model": model, "optimizer": None, "schedule": None, "scaler": None,
            "averaged_from": [p.name for p in paths]}  # fmt: skip


@dataclass(frozen=True)
class Average:
    payload: dict  # the averaged checkpoint, as saved
    path: Path
    files: list[Path]  # the checkpoints averaged
    steps: list[int]

    def describe(self) -> str:
        return f"averaged the checkpoints of steps {', '.join(map(str, self.steps))} into {self.path}"


def average_newest(run: RunDir, k: int) -> Average | list[Path]:
    """The newest ``k`` checkpoints of ``run`` averaged and saved as ``average.pt``; fewer than two: the
    list of what there is, and nothing written."""
    files = sorted(path for path in run.checkpoints.glob("step_*.pt") if STEP_FILE.match(path.name))[-k:]
    if len(files) < 2:
        return files
    payload = average_checkpoints(files)
    out = run.checkpoints / AVERAGE_FILE
    save_payload(payload, out)
    return Average(payload, out, files, [int(STEP_FILE.match(path.name).group(1)) for path in files])


def point_best(run: RunDir, average: Average, score: float, ranking: list[dict], metric: str,
               higher_is_better: bool, step: int) -> str:
    """``best.json`` after the average scored ``score`` on ``metric``: the average's when it beats the best
    checkpoint of ``ranking`` (the keeper's, best first), else that checkpoint's; returns what to say."""
    best = {**ranking[0], "metric": metric, "checkpoints": ranking} if ranking else {}
    single = best.get("score", float("nan"))
    better = improves(score, best.get("score"), higher_is_better)
    write_pointer(run, "best", {**best, "step": step, "score": score, "file": AVERAGE_FILE,
                                "sha256": sha256_file(average.path),
                                "averaged_from": [path.name for path in average.files]} if better else best)
    return (f"{average.describe()}: dev {metric} {score:.2f} against {single:.2f} for the best checkpoint; "
            f"the run folder's best is {'the average' if better else 'still that checkpoint'}")
