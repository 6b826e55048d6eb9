"""Training as docs/RELIABILITY.md promises it: kill -9 / SIGTERM / SIGINT / a full disk / a kill inside a
save lose at most the steps since the last checkpoint, and a resumed run logs the uninterrupted run's curve
exactly; non-finite steps are skipped, then stop the run; two DDP ranks equal one rank accumulating two
micro-batches; resume guards; early stopping; pruning; the learning-rate schedules.

The oracle is always another run of the same tiny config (conftest ``tiny``): the uninterrupted reference.
Runs that get killed, signalled or limited are subprocesses; the others go in-process through the CLI
(``CliRunner``), which skips the two seconds of imports that each new process pays.
"""

from __future__ import annotations

import hashlib
import math
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import (
    REPO,
    assert_one_error_line,
    curve,
    hash_tree,
    read_records,
    train_args,
    train_cli,
    train_env,
)
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.models.checkpoint import latest_checkpoint, load_checkpoint, read_pointer, sha256_file, step_file
from attnmt.runfiles import RunDir, RunLock
from attnmt.training.faults import Faults

KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)  # subprocess's and a shell's way of saying SIGKILL


pytestmark = pytest.mark.usefixtures("restore_torch_state")  # in-process training: conftest.py


@pytest.fixture(scope="module")
def killed(tiny, tmp_path_factory):
    """arch -> a run folder killed with SIGKILL at step 17, after the checkpoint of step 14, and the results.
    The Transformer's was killed at step 3 first, before any checkpoint, so its second run started afresh
    over orphan records. Tests copy the folder, never change it."""
    made: dict[str, tuple[Path, list[subprocess.CompletedProcess]]] = {}

    def get(arch: str):
        if arch not in made:
            run = tiny.copy_prepared(tmp_path_factory.mktemp("killed") / arch)
            kills = (3, 17) if arch == "transformer" else (17,)
            results = [train_cli(tiny.config[arch], run, fault=f"sigkill_at_step:{k}") for k in kills]
            made[arch] = run, results
        return made[arch]

    return get


def private_copy(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns(".lock"))
    return dest


def checkpoint(run: Path, step: int) -> dict:
    return load_checkpoint(run / "checkpoints" / step_file(step))


def assert_same_tree(a, b, where="") -> None:
    """Nested dicts/lists of tensors and plain values, equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tree(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


VALIDATION_COUNTERS = ("best_score", "best_step", "evals_without_improvement")


def assert_same_state(run: Path, reference: Path, step: int, ignore: tuple[str, ...] = ()) -> None:
    """The same weights, optimizer, schedule and counters (but ``ignore``) at ``step``."""
    mine, theirs = checkpoint(run, step), checkpoint(reference, step)
    for key in ("model", "optimizer", "schedule"):
        assert_same_tree(mine[key], theirs[key], key)
    left_out = ("train_seconds", "best", *ignore)
    progress = {k: v for k, v in mine["progress"].items() if k not in left_out}
    assert progress == {k: v for k, v in theirs["progress"].items() if k not in left_out}


def tmp_files(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob(".step_*.pt.tmp-*"))


# ------------------------------------------------------------------------------- exact resume


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tiny, killed, tmp_path, arch):
    reference = tiny.reference(arch)
    pristine, results = killed(arch)
    assert all(r.returncode in KILLED for r in results), [r.stderr for r in results]
    pointer = read_pointer(RunDir(pristine), "latest")
    assert pointer["step"] == 14  # the last multiple of save_every 7 before the kill at 17
    assert pointer["sha256"] == sha256_file(pristine / "checkpoints" / pointer["file"])
    # (Transformer) the run killed at step 3 had no checkpoint; the fresh start dropped its records.
    assert [r["step"] for r in read_records(pristine)] == list(range(1, 17))
    assert curve(pristine) == curve(reference)[:16]  # a fresh start is the same run, initial weights included

    run = private_copy(pristine, tmp_path / "run")
    # A stray tmp file holding a later state (the reference's final one) must never be loaded.
    stray = run / "checkpoints" / ".step_00000030.pt.tmp-4242"
    shutil.copy(reference / "checkpoints" / step_file(30), stray)
    result = invoke_train(tiny.config[arch], run)
    assert result.exit_code == 0, result.output
    assert "resumed from step_00000014.pt" in result.stdout
    assert not stray.exists()

    assert curve(run) == curve(reference)  # every train record, loss compared with ==
    assert curve(run, "valid") == curve(reference, "valid")
    assert_same_state(run, reference, 30)


def test_sigkill_during_save_keeps_the_previous_checkpoint(tiny, killed, tmp_path):
    reference = tiny.reference()
    run = private_copy(killed("transformer")[0], tmp_path / "run")
    pointer_before = (run / "checkpoints" / "latest.json").read_bytes()

    result = train_cli(tiny.config["transformer"], run, fault="sigkill_after_tmp_write")
    assert result.returncode in KILLED, result.stderr
    assert (run / "checkpoints" / "latest.json").read_bytes() == pointer_before
    [tmp] = tmp_files(run)
    died_at = int(re.match(r"\.step_(\d{8})\.pt\.tmp-", tmp.name).group(1))
    assert died_at > 14 and not (run / "checkpoints" / step_file(died_at)).exists()
    path, payload = latest_checkpoint(RunDir(run))
    assert path.name == step_file(14) and payload["progress"]["step"] == 14

    result = invoke_train(tiny.config["transformer"], run)
    assert result.exit_code == 0, result.output
    assert not tmp_files(run)
    assert curve(run) == curve(reference)
    assert_same_state(run, reference, 30)


def limit_file_size() -> None:
    """preexec_fn: a 200 kB file-size limit, far below one checkpoint (its tokenizer alone is 240 kB), and
    SIGXFSZ ignored, so a write beyond it fails with EFBIG like a full disk."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_disk_full_during_save_exits_5_and_keeps_the_previous_checkpoint(tiny, killed, tmp_path):
    run = private_copy(killed("transformer")[0], tmp_path / "run")
    pointer_before = (run / "checkpoints" / "latest.json").read_bytes()

    result = train_cli(tiny.config["transformer"], run, preexec_fn=limit_file_size)
    assert result.returncode == 5, result.stderr
    line = assert_one_error_line(result.stderr)
    assert re.search(rf"{re.escape(str(run / 'checkpoints'))}/step_\d{{8}}\.pt: "
                     r"cannot write checkpoint", line), line
    assert not tmp_files(run)
    assert (run / "checkpoints" / "latest.json").read_bytes() == pointer_before
    path, payload = latest_checkpoint(RunDir(run))
    assert path.name == step_file(14) and payload["progress"]["step"] == 14


# ------------------------------------------------------------------------------------------ signals


def count_train_records(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return metrics.read_text(encoding="utf-8").count('"event": "train"') if metrics.exists() else 0


def interrupt(tiny, run: Path, signum: int) -> str:
    """Start training (max_steps 20), send ``signum`` once two train records are written; returns stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", *train_args(tiny.config["transformer"], run, "train.max_steps=20")],
        cwd=REPO, env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while count_train_records(run) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, f"the run ended before the signal? {stderr}"
    assert f"stopped by {signal.Signals(signum).name}" in stderr
    last = read_records(run)[-1]["step"]
    pointer = read_pointer(RunDir(run), "latest")
    assert pointer["step"] == last < 20  # the checkpoint is the last logged (completed) step
    progress = load_checkpoint(run / "checkpoints" / pointer["file"], pointer["sha256"])["progress"]
    assert progress["step"] == last and not progress["finished"]
    # The last weights were validated before the exit, and the checkpoint holds that validation's counters.
    # The signal comes before the first scheduled validation (step 10), so this one is the best so far
    # and the run folder's best pointer names it.
    assert [r["step"] for r in read_records(run, "valid")] == [last]
    assert progress["best_step"] == last and read_pointer(RunDir(run), "best")["step"] == last
    return stderr


def test_sigint_exits_130_after_saving_the_last_completed_step(tiny, tmp_path):
    interrupt(tiny, tiny.copy_prepared(tmp_path / "run"), signal.SIGINT)


def test_sigterm_exits_143_after_saving_and_resume_continues_the_curve(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    interrupt(tiny, run, signal.SIGTERM)
    # max_steps 20 -> 30 is an allowed change; the schedule does not depend on it, so this is the reference.
    result = invoke_train(tiny.config["transformer"], run)
    assert result.exit_code == 0, result.output
    assert curve(run) == curve(tiny.reference())
    # Only the validation at the signal's step (which the reference did not have) tells them apart.
    assert_same_state(run, tiny.reference(), 30, ignore=VALIDATION_COUNTERS)


# --------------------------------------------------------------------------------- non-finite steps


def test_one_nan_step_is_skipped(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    sets = ("train.max_steps=6", "train.save_every=1", "train.keep_last=10", "train.eval_every=100")
    result = invoke_train(tiny.config["transformer"], run, *sets, faults=Faults(nan_at_step=4))
    assert result.exit_code == 0, result.output
    assert [r["step"] for r in read_records(run, "nonfinite")] == [4]
    assert [r["step"] for r in read_records(run)] == [1, 2, 3, 5, 6]
    assert curve(run)[:3] == curve(tiny.reference())[:3]

    before, skipped, after = checkpoint(run, 3), checkpoint(run, 4), checkpoint(run, 5)
    assert_same_tree(skipped["model"], before["model"], "model")
    assert_same_tree(skipped["optimizer"], before["optimizer"], "optimizer")  # Adam's step count too
    assert not all(torch.equal(after["model"][k], skipped["model"][k]) for k in after["model"])
    final = load_checkpoint(run / "checkpoints" / read_pointer(RunDir(run), "latest")["file"])
    assert final["progress"]["step"] == 6 and final["progress"]["finished"]
    assert final["progress"]["nonfinite_skips"] == 1 and final["progress"]["nonfinite_in_row"] == 0


def test_nan_streak_stops_with_exit_6_and_finite_checkpoints(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    result = invoke_train(tiny.config["transformer"], run, "train.max_nonfinite=3", "train.save_every=2",
                          faults=Faults(nan_from_step=5))
    assert result.exit_code == 6, result.output
    line = assert_one_error_line(result.stderr)
    assert "diverged at step 7" in line and "last good checkpoint: step 6" in line
    assert [r["step"] for r in read_records(run, "nonfinite")] == [5, 6, 7]
    assert read_pointer(RunDir(run), "latest")["step"] == 6
    files = sorted((run / "checkpoints").glob("step_*.pt"))
    assert files and not tmp_files(run)
    for path in files:
        payload = load_checkpoint(path)
        assert payload["progress"]["step"] <= 6
        assert all(torch.isfinite(t).all() for t in payload["model"].values()), path


# ----------------------------------------------------------------------------------------------- DDP


def test_two_ranks_equal_one_rank_accumulating_two(tiny, tmp_path):
    """docs/RELIABILITY.md, "Several processes": same global batches, same dropout masks, same losses."""
    config = tiny.config["transformer"]
    sets = ("train.max_steps=8", "train.eval_every=100", "train.save_every=100")
    one, two = tiny.copy_prepared(tmp_path / "one"), tiny.copy_prepared(tmp_path / "two")
    result = train_cli(config, one, *sets, "train.accum_steps=2")
    assert result.returncode == 0, result.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"]
    result = subprocess.run(
        [*torchrun, *train_args(config, two, *sets)],
        cwd=REPO, env=train_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]

    accumulated, ranks = read_records(one), read_records(two)
    assert [r["step"] for r in accumulated] == [r["step"] for r in ranks] == list(range(1, 9))
    for a, b in zip(accumulated, ranks):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=0), b["step"]
        assert b["nll"] == pytest.approx(a["nll"], rel=1e-6, abs=0), b["step"]
    final_one, final_two = checkpoint(one, 8), checkpoint(two, 8)
    assert final_one["fingerprint"]["dynamics"]["world_size"] == 1
    assert final_two["fingerprint"]["dynamics"]["world_size"] == 2
    for name, tensor in final_one["model"].items():
        assert torch.allclose(final_two["model"][name], tensor, rtol=0, atol=1e-6), name

    # Teeth: one micro-batch per step (what one rank alone sees) logs losses far outside that tolerance.
    single = read_records(tiny.reference())[:8]
    assert max(abs(s["loss"] - a["loss"]) / a["loss"] for s, a in zip(single, accumulated)) > 1e-3


# ------------------------------------------------------------------------------------ resume guards


def invoke_train(config: Path, run: Path, *sets: str, resume: bool = False, faults: Faults | None = None):
    """``attnmt train`` in-process; ``faults`` reach it as the Click context object, as tests/fault_run.py
    passes them."""
    args = ["train", str(config), "--run-dir", str(run)] + [a for s in sets for a in ("--set", s)]
    return CliRunner().invoke(app, args + (["--resume"] if resume else []), obj=faults)


def test_resume_with_a_changed_lr_exits_2_naming_it(tiny, tmp_path):
    run = private_copy(tiny.reference(), tmp_path / "run")
    result = invoke_train(tiny.config["transformer"], run, "train.lr=0.02")
    assert result.exit_code == 2, result.output
    assert "lr: 0.01 -> 0.02" in assert_one_error_line(result.stderr)


def test_resume_with_a_changed_model_exits_4_naming_it(tiny, tmp_path):
    run = private_copy(tiny.reference(), tmp_path / "run")
    result = invoke_train(tiny.config["transformer"], run, "model.d_model=32")
    assert result.exit_code == 4, result.output
    assert "d_model: 16 -> 32" in assert_one_error_line(result.stderr)


def test_finished_run_has_nothing_to_do(tiny, tmp_path):
    run = private_copy(tiny.reference(), tmp_path / "run")
    before = hash_tree(run)
    result = invoke_train(tiny.config["transformer"], run)
    assert result.exit_code == 0, result.output
    assert "nothing to do" in result.stdout
    after = hash_tree(run)
    assert after.pop(".lock") == hashlib.sha256(b"").hexdigest()  # the lock file is empty
    assert after == before


def test_raising_max_steps_continues_a_finished_run(tiny, tmp_path):
    run = private_copy(tiny.reference(), tmp_path / "run")
    result = invoke_train(tiny.config["transformer"], run, "train.max_steps=33")
    assert result.exit_code == 0, result.output
    assert [r["step"] for r in read_records(run)][-4:] == [30, 31, 32, 33]
    assert read_pointer(RunDir(run), "latest")["step"] == 33


def test_a_log_window_cut_by_a_kill_is_exact_after_resume(tiny, tmp_path):
    """log_every 4, save_every 7: the kill at 17 resumes from 14, inside the window of steps 13-16."""
    reference = tiny.copy_prepared(tmp_path / "reference")
    assert invoke_train(tiny.config["transformer"], reference, "train.log_every=4",
                        "train.max_steps=20").exit_code == 0
    run = tiny.copy_prepared(tmp_path / "run")
    killed = train_cli(tiny.config["transformer"], run, "train.log_every=4", "train.max_steps=20",
                       fault="sigkill_at_step:17")
    assert killed.returncode in KILLED
    assert invoke_train(tiny.config["transformer"], run, "train.log_every=4",
                        "train.max_steps=20").exit_code == 0
    assert [r["step"] for r in read_records(run)] == [4, 8, 12, 16, 20]
    assert curve(run) == curve(reference)


def test_resume_flag_on_an_empty_run_folder_exits_4(tiny, tmp_path):
    result = invoke_train(tiny.config["transformer"], tmp_path / "empty", resume=True)
    assert result.exit_code == 4, result.output
    assert "no checkpoint" in assert_one_error_line(result.stderr)


def test_second_trainer_on_a_locked_run_folder_exits_5(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    with RunLock(RunDir(run)):
        result = invoke_train(tiny.config["transformer"], run)
    assert result.exit_code == 5, result.output
    assert "in use by another attnmt process" in assert_one_error_line(result.stderr)
    assert not (run / "checkpoints").exists()


# --------------------------------------------------------------- validation, early stopping, pruning


def test_valid_records_carry_scores_and_sacrebleu_signatures(tiny):
    valid = read_records(tiny.reference(), "valid")
    assert [r["step"] for r in valid] == [10, 20, 30]
    for r in valid:
        assert 0 <= r["bleu"] <= 100 and 0 <= r["chrf"] <= 100
        assert math.isfinite(r["loss"]) and r["ppl"] > 1
        assert r["bleu_signature"].startswith("nrefs:1|") and "|version:2." in r["bleu_signature"]
        assert r["chrf_signature"].startswith("nrefs:1|") and "|version:2." in r["chrf_signature"]


def test_validation_with_beam_search_scores_the_beam_translations(tiny, tmp_path, monkeypatch):
    """valid_beam_size 3: validation searches with a beam of 3, and the dev BLEU is that of those
    translations."""
    import attnmt.training.validation
    from attnmt.data.batching import load_split
    from attnmt.decoding.metrics import corpus_scores
    from attnmt.decoding.translator import Translator
    from attnmt.models.checkpoint import load_model

    beams = []

    def spy(model, tokenizer, decode, *args, **kwargs):
        beams.append(decode.beam_size)
        return Translator(model, tokenizer, decode, *args, **kwargs)

    monkeypatch.setattr(attnmt.training.validation, "Translator", spy)
    run = tiny.copy_prepared(tmp_path / "run")
    result = invoke_train(tiny.config["transformer"], run, "train.valid_beam_size=3", "train.eval_every=30",
                          "train.save_every=30")
    assert result.exit_code == 0, result.output
    assert beams == [3]
    (valid,) = read_records(run, "valid")
    model, tokenizer, cfg, _ = load_model(run / "checkpoints" / step_file(30))
    dev = load_split(RunDir(run), "dev")
    decode = cfg.decode.model_copy(update={"beam_size": 3, "nbest": 1})
    hyps = Translator(model, tokenizer, decode).search(dev.src_ids)
    texts = tokenizer.decode_tgt([h[0].tokens for h in hyps])
    assert valid["bleu"] == corpus_scores(texts, [dev.tgt_text], ["bleu"], tgt_lang="de")["bleu"].score
    assert valid["example"] == texts[0]


def test_pruning_keeps_the_last_two_and_the_best(tiny):
    reference = tiny.reference()
    # the first of equals: ties don't improve
    best = max(read_records(reference, "valid"), key=lambda r: r["bleu"])
    steps = {28, 30, best["step"]}
    assert (sorted(p.name for p in (reference / "checkpoints").glob("step_*.pt"))
            == sorted(map(step_file, steps)))
    pointer = read_pointer(RunDir(reference), "best")
    assert pointer["file"] == step_file(best["step"]) and pointer["score"] == best["bleu"]
    assert pointer["sha256"] == sha256_file(reference / "checkpoints" / pointer["file"])
    assert read_pointer(RunDir(reference), "latest")["file"] == step_file(30)


def test_early_stopping_when_the_metric_cannot_improve(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    sets = ("train.lr=1.0e-9", "train.warmup_steps=0", "train.patience=1", "train.eval_every=2")
    result = invoke_train(tiny.config["transformer"], run, *sets)
    assert result.exit_code == 0, result.output
    assert "early stopping" in result.stdout
    valid = read_records(run, "valid")
    assert [r["step"] for r in valid] == [2, 4] and valid[0]["bleu"] == valid[1]["bleu"]
    assert read_records(run)[-1]["step"] == 4
    progress = load_checkpoint(run / "checkpoints" / read_pointer(RunDir(run), "latest")["file"])["progress"]
    assert progress["step"] == 4 and progress["finished"] and progress["evals_without_improvement"] == 1


# ------------------------------------------------------------------------------------------- fine-tuning


def test_init_from_starts_a_new_run_from_a_checkpoints_weights(tiny, tmp_path):
    """train.init_from: a new run (its own folder, its data prepared with the checkpoint's tokenizer)
    starts from the checkpoint's weights with a fresh optimizer and schedule, so its first validation
    (after one step with a negligible learning rate) scores as the checkpoint did at its own."""
    reference = tiny.reference()
    checkpoint = reference / "checkpoints" / step_file(30)
    ref_valid = [r for r in read_records(reference, "valid") if r["step"] == 30][0]
    run = tmp_path / "fine"
    result = invoke_train(tiny.config["transformer"], run, f"train.init_from={checkpoint}", "train.lr=1e-12",
                          "train.schedule=constant", "train.warmup_steps=0", "train.max_steps=1",
                          "train.eval_every=1", "train.save_every=1")
    assert result.exit_code == 0, result.output
    assert "fine-tuning from" in result.output
    (valid,) = read_records(run, "valid")
    assert valid["step"] == 1 and valid["loss"] == pytest.approx(ref_valid["loss"], abs=1e-5)
    assert valid["bleu"] == pytest.approx(ref_valid["bleu"], abs=1e-6)
    for name in ("spm.model",):
        assert (run / "tokenizer" / name).read_bytes() == (reference / "tokenizer" / name).read_bytes()
    # Running again resumes the new run's own checkpoint; init_from no longer matters.
    again = invoke_train(tiny.config["transformer"], run, f"train.init_from={checkpoint}", "train.lr=1e-12",
                         "train.schedule=constant", "train.warmup_steps=0", "train.max_steps=2",
                         "train.eval_every=1", "train.save_every=1")
    assert again.exit_code == 0 and "resumed from" in again.output


def test_init_from_another_architecture_is_refused_naming_the_keys(tiny, tmp_path):
    checkpoint = tiny.reference() / "checkpoints" / step_file(30)
    run = tmp_path / "fine"
    result = invoke_train(tiny.config["transformer"], run, f"train.init_from={checkpoint}",
                          "model.d_ff=48")
    assert result.exit_code == 2, result.output
    line = assert_one_error_line(result.stderr)
    assert "its model config differs from this run's" in line and "d_ff" in line
    assert not list(run.glob("checkpoints/*.pt"))
