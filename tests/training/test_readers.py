"""Readers while a writer runs: ``translate``, ``eval`` and ``info`` on a run folder while training writes,
points to and prunes checkpoints in it. Each read must succeed, from a checkpoint that was complete."""

from __future__ import annotations

import subprocess
import time

from helpers import REPO, train_command, train_env
from typer.testing import CliRunner

from attnmt.cli import app

SOURCES = ["monday , 3 june 2001", "the 2nd of may 2010"]


def test_translate_eval_and_info_while_training_saves_and_prunes(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    ref.write_text("montag , 3. juni 2001\ndonnerstag , 2. mai 2010\n", encoding="utf-8")
    # Saves every step, validates (and moves best.json) every 2, keeps the last 2 and the best: checkpoints
    # appear and vanish all the time. Six seconds of it: 15 to 20 reads of each kind beside it on 2 shared
    # cores (62 in the 18 s it had before), at least 5 needed.
    sets = ["train.max_steps=400", "train.save_every=1", "train.eval_every=2", "train.keep_last=2",
            "train.log_every=10", "train.max_minutes=0.1"]
    writer = subprocess.Popen(train_command(tiny.config["transformer"], run, *sets), cwd=REPO,
                              env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runner = CliRunner()
    reads = {"translate": 0, "eval": 0, "info": 0}
    try:
        deadline = time.monotonic() + 60
        while not list((run / "checkpoints").glob("step_*.pt")):
            assert writer.poll() is None and time.monotonic() < deadline, writer.stderr.read()
            time.sleep(0.05)
        while writer.poll() is None:
            for name, args in (("translate", ["translate", run, *SOURCES, "--beam-size", "1"]),
                               ("eval", ["eval", run, "--src", src, "--ref", ref, "--metrics", "chrf",
                                         "--beam-size", "1"]),
                               ("info", ["info", run])):
                result = runner.invoke(app, [str(a) for a in args])
                assert result.exit_code == 0, (name, result.stderr)
                if name == "translate":
                    assert len(result.stdout.splitlines()) == len(SOURCES)
                reads[name] += 1
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()
    assert writer.returncode == 0, writer.stderr.read()
    assert min(reads.values()) >= 5, reads  # the loop really ran beside the writer
    assert not list((run / "checkpoints").glob(".*tmp*"))


def test_a_checkpoint_pruned_between_pointer_and_open_is_looked_up_again(tiny, tmp_path, monkeypatch):
    """The race the loop above may or may not hit: the pointer names a file that is gone by the time it is
    opened (pruned by the writer); the reader reads the pointer again instead of failing."""
    import shutil

    import attnmt.models.checkpoint as checkpoint

    run = tmp_path / "run"
    shutil.copytree(tiny.reference(), run, ignore=shutil.ignore_patterns(".lock"))
    real = checkpoint.resolve_model_path
    calls = []

    def racing(model):
        calls.append(model)
        if len(calls) == 1:
            return run / "checkpoints" / "step_00000001.pt"  # what the pointer said a moment ago
        return real(model)

    monkeypatch.setattr(checkpoint, "resolve_model_path", racing)
    _, _, _, path = checkpoint.load_model(run)
    assert len(calls) == 2 and path == real(run)
    with_file = real(run)
    monkeypatch.setattr(checkpoint, "resolve_model_path", lambda model: tmp_path / "gone.pt")
    try:  # a checkpoint file given by name that does not exist is still an error, at once
        checkpoint.load_model(tmp_path / "gone.pt")
    except checkpoint.CheckpointError as e:
        assert "not found" in str(e)
    else:
        raise AssertionError("expected a CheckpointError")
    assert with_file.exists()
