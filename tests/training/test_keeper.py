"""The best-k and pruning policy: which checkpoints enter the ranking, what best.json says, what is
deleted."""

import json

from attnmt.models.checkpoint import read_pointer, step_file
from attnmt.runfiles import RunDir
from attnmt.training.keeper import CheckpointKeeper


def step_files(run: RunDir) -> list[str]:
    return sorted(p.name for p in run.checkpoints.iterdir() if p.name.startswith("step_"))


def test_prune_keeps_the_newest_and_the_best(tmp_path):
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    for step in (3, 6, 9, 12, 15):
        (run.checkpoints / step_file(step)).write_bytes(b"x")
    (run.checkpoints / "notes.pt").write_bytes(b"x")
    (run.checkpoints / "step_00000001.pt").symlink_to(tmp_path / "outside.pt")
    (tmp_path / "outside.pt").write_bytes(b"x")
    best = {"step": 6, "file": step_file(6),
            "checkpoints": [{"step": 6, "file": step_file(6)}, {"step": 3, "file": step_file(3)}]}
    (run.checkpoints / "best.json").write_text(json.dumps(best), encoding="utf-8")
    (run.checkpoints / "latest.json").write_text(json.dumps({"step": 15, "file": step_file(15)}),
                                                 encoding="utf-8")
    CheckpointKeeper(run, keep_last=2, keep_best=2, metric="bleu").prune()
    assert step_files(run) == ["step_00000001.pt", step_file(3), step_file(6), step_file(12), step_file(15)]
    assert (run.checkpoints / "notes.pt").exists() and (tmp_path / "outside.pt").exists()


def test_admission_ranks_by_the_metric_and_ties_keep_the_earlier_step(tmp_path):
    bleu = CheckpointKeeper(RunDir(tmp_path), keep_last=2, keep_best=2, metric="bleu")
    ranking: list[dict] = []
    for step, score in ((10, 20.0), (20, 25.0), (30, 20.0), (40, 22.0)):
        admitted = bleu.admit(ranking, step, score)
        if admitted is not None:
            ranking = admitted
    assert [(e["step"], e["score"]) for e in ranking] == [(20, 25.0), (40, 22.0)]
    assert bleu.admit(ranking, 50, 21.0) is None  # below both: no save
    loss = CheckpointKeeper(RunDir(tmp_path), keep_last=2, keep_best=1, metric="loss")
    assert [e["step"] for e in loss.admit([{"step": 1, "score": 2.0}], 2, 1.5)] == [2]  # lower is better
    assert loss.admit([{"step": 1, "score": 2.0}], 2, 2.0) is None  # equal is no improvement


def test_saved_best_names_the_file_in_the_ranking_and_in_best_json(tmp_path):
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    for step in (10, 20):
        (run.checkpoints / step_file(step)).write_bytes(b"x")
    keeper = CheckpointKeeper(run, keep_last=2, keep_best=2, metric="chrf")
    ranking = keeper.admit([{"step": 10, "score": 40.0, "file": step_file(10), "sha256": "a"}], 20, 45.0)
    keeper.saved_best(ranking, {"step": 20, "file": step_file(20), "sha256": "b"})
    assert ranking[0] == {"step": 20, "score": 45.0, "file": step_file(20), "sha256": "b"}
    best = read_pointer(run, "best")
    assert best["file"] == step_file(20) and best["metric"] == "chrf" and best["checkpoints"] == ranking


def test_the_one_better_score_rule_is_strict_and_takes_anything_over_nothing():
    from attnmt.config.choices import higher_is_better, improves

    assert [higher_is_better(m) for m in ("bleu", "chrf", "loss")] == [True, True, False]
    assert improves(30.0, 29.0, True) and not improves(29.0, 30.0, True) and not improves(30.0, 30.0, True)
    assert improves(1.5, 2.0, False) and not improves(2.0, 1.5, False) and not improves(2.0, 2.0, False)
    assert improves(-1e9, None, True) and improves(1e9, None, False)
