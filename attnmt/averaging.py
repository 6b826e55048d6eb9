"""``train.average_last``: at the end of a run, the newest k checkpoints averaged into
``checkpoints/average.pt``; once the average is validated, ``best.json`` names it only when it scores
better than the best checkpoint (never against an earlier end's average, which average.pt no longer
holds). Validation is the caller's (``train.Trainer.average_last``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .checkpoint import AVERAGE_FILE, STEP_FILE, average_checkpoints, save_payload, sha256_file, write_pointer
from .runfiles import RunDir


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
    better = best.get("score") is None or (score > single if higher_is_better else score < single)
    write_pointer(run, "best", {**best, "step": step, "score": score, "file": AVERAGE_FILE,
                                "sha256": sha256_file(average.path),
                                "averaged_from": [path.name for path in average.files]} if better else best)
    return (f"{average.describe()}: dev {metric} {score:.2f} against {single:.2f} for the best checkpoint; "
            f"the run folder's best is {'the average' if better else 'still that checkpoint'}")
