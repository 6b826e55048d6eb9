"""Which checkpoints of a run stay on disk: the best-k and pruning policy, in one object."""

from __future__ import annotations

from ..config.choices import higher_is_better
from ..models.checkpoint import STEP_FILE, read_pointer, write_pointer
from ..runfiles import RunDir


class CheckpointKeeper:
    """Which checkpoints of a run stay on disk: the newest ``keep_last``, the one ``latest.json`` names,
    and the ``keep_best`` best by the validation ``metric`` (``best.json``). The ranking lives in the
    trainer's progress (``best``: entries {step, score, file, sha256}, best first), so it is checkpointed."""

    def __init__(self, run: RunDir, keep_last: int, keep_best: int, metric: str) -> None:
        self.run, self.keep_last, self.keep_best, self.metric = run, keep_last, keep_best, metric
        self.higher_is_better = higher_is_better(metric)

    def admit(self, best: list[dict], step: int, score: float) -> list[dict] | None:
        """The new ranking if ``step`` enters the best ``keep_best`` (its checkpoint is then to be saved);
        None if it does not. Ties rank the earlier step first."""
        ranked = sorted(best + [{"step": step, "score": score}],
                        key=lambda e: -e["score"] if self.higher_is_better else e["score"])
        kept = ranked[: self.keep_best]
        return kept if any(e["step"] == step for e in kept) else None

    def saved_best(self, best: list[dict], pointer: dict) -> None:
        """Record the file of the newly saved best entry in the ranking and in ``best.json``, then prune."""
        for entry in best:
            if entry["step"] == pointer["step"]:
                entry.update(file=pointer["file"], sha256=pointer["sha256"])
        write_pointer(self.run, "best", {**best[0], "metric": self.metric, "checkpoints": best})
        self.prune()

    def prune(self) -> None:
        """Delete ``step_*.pt`` files beyond the newest ``keep_last``, never one that a pointer names."""
        folder = self.run.checkpoints.resolve()
        protected = {entry["file"] for entry in read_pointer(self.run, "best").get("checkpoints", [])}
        latest = read_pointer(self.run, "latest").get("file")
        if latest:
            protected.add(latest)
        steps = sorted((p for p in folder.iterdir() if STEP_FILE.match(p.name) and not p.is_symlink()),
                       key=lambda p: p.name)
        for path in steps[: -self.keep_last] if self.keep_last else steps:
            if path.name not in protected and path.resolve().is_relative_to(folder):
                path.unlink(missing_ok=True)
