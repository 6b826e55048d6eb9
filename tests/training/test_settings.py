"""Settings that change what training computes, each with a test that fails if the setting stopped working:
``clip_norm``, ``keep_best`` above 1 with ``metric: loss`` and ``metric: chrf``, the plateau schedule's
``plateau_patience`` and ``plateau_factor``, ``tensorboard`` (its event file read back) and ``compile`` on
the CPU, ``precision`` on the CPU (bf16; fp16 refused), ``gradient_checkpointing`` and ``average_last``.
(The others have theirs where they live: tests/training/test_step.py, test_optim.py, test_train.py,
test_keeper.py; the note of issue 15 lists them.)"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from helpers import REPO, assert_one_error_line, read_records, train_args, train_cli, train_env
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.schema import TrainConfig, TransformerConfig
from attnmt.data.batching import EncodedSplit, gather
from attnmt.models import build_model
from attnmt.training.distributed import Dist
from attnmt.training.faults import NO_FAULTS
from attnmt.training.optim import Schedule
from attnmt.training.step import OptimizerStep


def sgd_step(clip_norm: float) -> tuple[OptimizerStep, list[torch.Tensor]]:
    """A tiny float64 Transformer's step under plain SGD (lr 1): its update is minus the clipped gradient."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    src = [torch.randint(4, 30, (n,), generator=generator).tolist() for n in (3, 7, 5, 4)]
    tgt = [torch.randint(4, 30, (n,), generator=generator).tolist() for n in (6, 2, 5, 8)]
    cfg = TrainConfig(lr=1.0, warmup_steps=0, clip_norm=clip_norm, label_smoothing=0.0, schedule="constant")
    model = build_model(TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1,
                                          dec_layers=1, d_ff=32, dropout=0.0), 30, 30).double()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    step = OptimizerStep(model, model, model, optimizer, Schedule.from_config(cfg, 10), None, None, Dist(),
                         torch.device("cpu"), cfg, EncodedSplit.from_lists(src, tgt, ["" for _ in src]),
                         NO_FAULTS)
    return step, before


@pytest.mark.parametrize("clip_norm", [0.0, 0.05, 1e6])
def test_clip_norm_bounds_the_norm_of_the_update(clip_norm):
    step, before = sgd_step(clip_norm)
    result = step([[0, 1, 2, 3]], 1, lambda: False, lambda: False)
    update = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(step.model.parameters(), before)))
    unclipped = result.grad_norm  # logged before clipping
    assert unclipped > 0.05 * 2  # the 0.05 case does clip
    expected = unclipped if clip_norm in (0.0, 1e6) else clip_norm  # 0: no clipping
    assert float(update) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("patience, factor", [(1, 0.25), (3, 0.5)])
def test_plateau_patience_and_factor_are_the_config_keys(patience, factor):
    cfg = TrainConfig(lr=1e-3, warmup_steps=0, schedule="plateau", plateau_patience=patience,
                      plateau_factor=factor)
    schedule = Schedule.from_config(cfg, 100)
    schedule.observe(10.0, higher_is_better=True)  # the first score is the best so far
    rates = []
    for _ in range(2 * patience):
        schedule.observe(9.0, higher_is_better=True)
        rates.append(schedule.lr(50))
    assert rates[patience - 1] == pytest.approx(1e-3 * factor)  # cut after `patience` bad validations
    assert rates[:patience - 1] == [pytest.approx(1e-3)] * (patience - 1)
    assert rates[-1] == pytest.approx(1e-3 * factor**2)
    schedule.observe(11.0, higher_is_better=True)  # an improvement resets the count, not the rate
    assert schedule.lr(50) == pytest.approx(1e-3 * factor**2) and schedule.bad_evals == 0


def test_plateau_keys_reach_the_run(tiny, tmp_path):
    """End to end: with a dev loss that cannot improve on itself for long (lr far too low to learn), the
    logged rate falls by plateau_factor after plateau_patience validations."""
    run = tiny.copy_prepared(tmp_path / "run")
    result = train_cli(tiny.config["transformer"], run, "train.max_steps=8", "train.eval_every=2",
                       "train.log_every=1", "train.save_every=100", "train.schedule=plateau",
                       "train.warmup_steps=0", "train.lr=1e-9", "train.metric=bleu",
                       "train.plateau_patience=1", "train.plateau_factor=0.25", "model.dropout=0.0")
    assert result.returncode == 0, result.stderr
    rates = {r["step"]: r["lr"] for r in read_records(run)}
    # Validations at steps 2, 4, 6: the first sets the best; BLEU stays where it was (equal is no
    # improvement), so each later one cuts the rate by 0.25 (the defaults would cut by 0.5, once, at 6).
    assert [rates[s] / 1e-9 for s in range(1, 9)] == pytest.approx([1, 1, 1, 1, 0.25, 0.25, 0.0625, 0.0625])


@pytest.mark.parametrize("metric", ["loss", "chrf"])
def test_keep_best_two_keeps_the_two_best_by_the_metric(tiny, tmp_path, metric):
    run = tiny.copy_prepared(tmp_path / "run")
    result = train_cli(tiny.config["transformer"], run, "train.max_steps=30", "train.eval_every=5",
                       "train.save_every=5", "train.keep_best=2", "train.keep_last=2",
                       f"train.metric={metric}")
    assert result.returncode == 0, result.stderr
    valid = read_records(run, "valid")
    assert len(valid) == 6
    score = {r["step"]: r["loss"] if metric == "loss" else r["chrf"] for r in valid}
    ranked = sorted(score, key=lambda s: (score[s] if metric == "loss" else -score[s], s))
    best = json.loads((run / "checkpoints" / "best.json").read_text(encoding="utf-8"))
    assert best["metric"] == metric
    assert [c["step"] for c in best["checkpoints"]] == ranked[:2]
    assert best["step"] == ranked[0]
    kept = sorted(int(p.stem.split("_")[1]) for p in (run / "checkpoints").glob("step_*.pt"))
    assert set(ranked[:2]) <= set(kept)  # the two best stay
    assert set(kept) == set(ranked[:2]) | {25, 30}  # and the last two; everything else is pruned
    assert len({score[s] for s in score}) > 1  # the ranking had something to decide


def test_tensorboard_event_file_holds_the_logged_scalars(tiny, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tiny.copy_prepared(tmp_path / "run")
    result = train_cli(tiny.config["transformer"], run, "train.max_steps=6", "train.log_every=2",
                       "train.eval_every=3", "train.save_every=100", "train.tensorboard=true")
    assert result.returncode == 0, result.stderr
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    train_loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    logged = [(r["step"], r["loss"]) for r in read_records(run)]
    assert [s for s, _ in train_loss] == [s for s, _ in logged] == [2, 4, 6]
    assert [v for _, v in train_loss] == pytest.approx([v for _, v in logged], rel=1e-6)
    assert [e.step for e in events.Scalars("valid/bleu")] == [3, 6]


def invoke_train(config, run, *sets: str):
    """``attnmt train`` in-process (``CliRunner``), for runs that are not about the process; its exit code."""
    args = ["train", str(config), "--run-dir", str(run)] + [a for s in sets for a in ("--set", s)]
    return CliRunner().invoke(app, args).exit_code


@pytest.mark.usefixtures("restore_torch_state")
def test_compile_on_the_cpu_gives_the_eager_losses(tiny, tmp_path):
    """torch.compile (inductor, CPU) for two steps: the same losses as eager within float tolerance. The
    eager run in-process; the compiled one in a process of its own (inductor's caches stay there)."""
    sets = ("train.max_steps=2", "train.log_every=1", "train.eval_every=100", "train.save_every=100",
            "model.dropout=0.0")
    eager, compiled = tiny.copy_prepared(tmp_path / "eager"), tiny.copy_prepared(tmp_path / "compiled")
    assert invoke_train(tiny.config["transformer"], eager, *sets) == 0
    result = train_cli(tiny.config["transformer"], compiled, *sets, "train.compile=true", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = read_records(eager), read_records(compiled)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4)
    # Teeth: the second step's loss differs from the first's by far more than the tolerance.
    assert abs(a[1]["loss"] - a[0]["loss"]) > 1e-3 * a[0]["loss"]


def test_max_epochs_stops_after_that_many_passes_over_the_data(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    result = train_cli(tiny.config["transformer"], run, "train.max_steps=0", "train.max_epochs=2",
                       "train.log_every=1", "train.eval_every=1000", "train.save_every=1000")
    assert result.returncode == 0, result.stderr
    records = read_records(run)
    per_epoch = sum(1 for r in records if r["epoch"] <= 1.0 + 1e-9)
    assert len(records) == 2 * per_epoch and records[-1]["epoch"] == pytest.approx(2.0)
    assert "max_epochs" in result.stdout


@pytest.mark.usefixtures("restore_torch_state")
def test_seed_changes_the_run_and_the_same_seed_repeats_it(tiny, tmp_path):
    sets = ("train.max_steps=3", "train.log_every=1", "train.eval_every=1000", "train.save_every=1000")
    losses = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        run = tiny.copy_prepared(tmp_path / name)
        assert invoke_train(tiny.config["transformer"], run, *sets, f"train.seed={seed}") == 0
        losses[name] = [r["loss"] for r in read_records(run)]
    assert losses["a"] == losses["b"]  # compared with ==
    assert losses["a"] != losses["c"]


def test_deterministic_turns_on_torchs_deterministic_algorithms(tiny, tmp_path):
    """On the CPU every kernel attnmt uses is deterministic already; the key must still reach torch (where
    CUDA would otherwise pick nondeterministic kernels) and leave the losses as they are."""
    sets = ("train.max_steps=2", "train.log_every=1", "train.eval_every=1000", "train.save_every=1000")
    plain, strict = tiny.copy_prepared(tmp_path / "plain"), tiny.copy_prepared(tmp_path / "strict")
    assert train_cli(tiny.config["transformer"], plain, *sets).returncode == 0
    probe = ("import torch; seen = []; real = torch.use_deterministic_algorithms; "
             "torch.use_deterministic_algorithms = lambda on, **k: (seen.append(on), real(on, **k)); "
             "import sys; from attnmt.cli import app; "
             "sys.argv = ['attnmt'] + sys.argv[1:]; "
             "import atexit; atexit.register(lambda: print('DETERMINISTIC', seen)); app()")
    args = train_args(tiny.config["transformer"], strict, *sets, "train.deterministic=true")[1:]
    result = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO, env=train_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "DETERMINISTIC [True]" in result.stdout
    assert [r["loss"] for r in read_records(strict)] == [r["loss"] for r in read_records(plain)]


def test_max_minutes_stops_the_run_on_its_clock(tiny, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    result = train_cli(tiny.config["transformer"], run, "train.max_steps=0", "train.max_epochs=100000",
                       "train.max_minutes=0.05", "train.eval_every=100000", "train.save_every=100000")
    assert result.returncode == 0, result.stderr
    assert "(max_minutes)" in result.stdout
    assert list((run / "checkpoints").glob("step_*.pt"))  # it saved on the way out
    # ... after validating its last weights (eval_every alone would never have), so that the run
    # folder's best pointer can name them.
    last = read_records(run)[-1]["step"]
    assert [r["step"] for r in read_records(run, "valid")] == [last]
    assert json.loads((run / "checkpoints" / "best.json").read_text())["step"] == last


def test_betas_and_weight_decay_reach_the_optimizer():
    from attnmt.training.optim import make_optimizer

    model = build_model(TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1,
                                          dec_layers=1, d_ff=32), 30, 30)
    optimizer = make_optimizer(model, TrainConfig(betas=(0.8, 0.95), weight_decay=0.1))
    assert {tuple(g["betas"]) for g in optimizer.param_groups} == {(0.8, 0.95)}
    assert sorted(g["weight_decay"] for g in optimizer.param_groups) == [0.0, 0.1]


# ------------------------------------------------------------------ precision, checkpointing, averaging


def tiny_step(precision_dtype, seed: int = 0) -> tuple[OptimizerStep, float]:
    """A tiny Transformer's first AdamW step under ``precision_dtype`` autocast (None: fp32), with dropout;
    returns the step and its loss per target token."""
    from attnmt.training.optim import make_optimizer

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    src = [torch.randint(4, 30, (n,), generator=generator).tolist() for n in (3, 7, 5, 4)]
    tgt = [torch.randint(4, 30, (n,), generator=generator).tolist() for n in (6, 2, 5, 8)]
    cfg = TrainConfig(lr=1e-2, warmup_steps=0, schedule="constant")
    model = build_model(TransformerConfig(arch="transformer", d_model=32, n_heads=2, enc_layers=2,
                                          dec_layers=2, d_ff=64, dropout=0.1), 30, 30)
    step = OptimizerStep(model, model, model, make_optimizer(model, cfg), Schedule.from_config(cfg, 10), None,
                         precision_dtype, Dist(), torch.device("cpu"), cfg,
                         EncodedSplit.from_lists(src, tgt, ["" for _ in src]), NO_FAULTS)
    losses = [step([[0, 1, 2, 3]], s, lambda: False, lambda: False) for s in (1, 2, 3)]
    return step, [r.loss / r.tgt_tokens for r in losses]


def test_bf16_on_the_cpu_trains_finite_and_close_to_fp32_with_fp32_weights():
    fp32_step, fp32 = tiny_step(None)
    bf16_step, bf16 = tiny_step(torch.bfloat16)
    assert all(math.isfinite(x) for x in bf16)
    assert bf16 == pytest.approx(fp32, rel=0.02)
    assert bf16 != fp32  # teeth: the products did run in bf16
    assert {p.dtype for p in bf16_step.model.parameters()} == {torch.float32}  # master weights stay fp32
    assert fp32[2] < fp32[0] and bf16[2] < bf16[0]  # both learn


def test_precision_bf16_reaches_the_cpu_run_and_fp16_is_refused_before_the_folder_is_touched(tiny, tmp_path):
    # The first two steps against the fp32 reference run (the same batches and masks; log_every 1).
    bf16 = tiny.copy_prepared(tmp_path / "bf16")
    result = train_cli(tiny.config["transformer"], bf16, "train.max_steps=2", "train.eval_every=2",
                       "train.save_every=100", "train.precision=bf16")
    assert result.returncode == 0, result.stderr
    a, b = read_records(tiny.reference())[:2], read_records(bf16)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=0.03)
    assert [r["loss"] for r in b] != [r["loss"] for r in a]
    assert all(math.isfinite(r["loss"]) for r in read_records(bf16, "valid"))
    fresh = tmp_path / "fp16"
    result = train_cli(tiny.config["transformer"], fresh, "train.precision=fp16")
    assert result.returncode == 2
    assert "train.precision: fp16 needs CUDA" in assert_one_error_line(result.stderr)
    assert not fresh.exists()  # refused before the run folder was made


def test_gradient_checkpointing_gives_the_plain_gradients(monkeypatch):
    """torch.utils.checkpoint per layer, with dropout on: the recomputation draws the same masks, so the
    gradients are the plain run's."""
    cfg = TransformerConfig(arch="transformer", d_model=32, n_heads=2, enc_layers=3, dec_layers=3, d_ff=64,
                            dropout=0.3, attn_dropout=0.1)
    generator = torch.Generator().manual_seed(0)
    src = [torch.randint(4, 30, (n,), generator=generator).tolist() for n in (3, 7, 5, 4)]
    tgt = [torch.randint(4, 30, (n,), generator=generator).tolist() for n in (6, 2, 5, 8)]
    batch = gather(EncodedSplit.from_lists(src, tgt, ["" for _ in src]), [0, 1, 2, 3])
    real, seen = torch.utils.checkpoint.checkpoint, []

    def counting(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)
    grads, calls = {}, {}
    for on in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg, 30, 30)
        model.gradient_checkpointing = on
        seen.clear()
        torch.manual_seed(1)
        model(batch).logits.float().logsumexp(-1).sum().backward()
        grads[on] = [p.grad.clone() for p in model.parameters()]
        calls[on] = len(seen)
    assert calls == {False: 0, True: 6}  # every layer, and only with the key on
    for plain, checkpointed in zip(grads[False], grads[True]):
        torch.testing.assert_close(checkpointed, plain, rtol=1e-5, atol=1e-7)


def test_gradient_checkpointing_is_refused_for_the_lstm(tiny, tmp_path):
    result = train_cli(tiny.config["lstm"], tmp_path / "lstm", "train.gradient_checkpointing=true")
    assert result.returncode == 2
    assert "train.gradient_checkpointing: for the Transformer only" in assert_one_error_line(result.stderr)
    assert not (tmp_path / "lstm").exists()  # refused before the run folder was made


def test_average_last_writes_the_mean_of_the_newest_checkpoints_and_validates_it(tiny, tmp_path):
    from attnmt.models.checkpoint import load_checkpoint, read_pointer, sha256_file
    from attnmt.runfiles import RunDir

    run = tiny.copy_prepared(tmp_path / "run")
    # Saves at 4, 8 and 12; the one validation is the last weights' (step 12), then the average's.
    result = train_cli(tiny.config["transformer"], run, "train.max_steps=12", "train.save_every=4",
                       "train.eval_every=100", "train.keep_last=3", "train.average_last=3")
    assert result.returncode == 0, result.stderr
    folder = run / "checkpoints"
    steps = [load_checkpoint(folder / f"step_{s:08d}.pt")["model"] for s in (4, 8, 12)]
    average = load_checkpoint(folder / "average.pt")
    assert average["averaged_from"] == [f"step_{s:08d}.pt" for s in (4, 8, 12)]
    for name, tensor in average["model"].items():
        if tensor.is_floating_point():
            expected = sum(s[name].double() for s in steps) / 3
            torch.testing.assert_close(tensor.double(), expected, rtol=1e-6, atol=1e-7)
    assert not torch.equal(steps[0]["output.weight"], steps[2]["output.weight"])  # teeth: they differ
    # Its validation is recorded apart from the curve, and the best pointer follows the better score.
    valid = read_records(run, "valid")
    assert [(r["step"], r["averaged"]) for r in valid] == [(12, None), (12, [4, 8, 12])]
    best = read_pointer(RunDir(run), "best")
    if valid[1]["bleu"] > valid[0]["bleu"]:
        assert best["file"] == "average.pt" and best["averaged_from"] == average["averaged_from"]
    else:
        assert best["file"] == "step_00000012.pt" and best["score"] == valid[0]["bleu"]
    assert "averaged the checkpoints of steps 4, 8, 12" in result.stdout
    # Continued to step 16, the run averages again, and best.json never names an average.pt that has
    # since been replaced: it names a file whose sha256 it holds.
    result = train_cli(tiny.config["transformer"], run, "train.max_steps=16", "train.save_every=4",
                       "train.eval_every=100", "train.keep_last=3", "train.average_last=3")
    assert result.returncode == 0, result.stderr
    best = read_pointer(RunDir(run), "best")
    averaged = load_checkpoint(folder / "average.pt")["averaged_from"]
    assert averaged == [f"step_{s:08d}.pt" for s in (8, 12, 16)]
    assert best["sha256"] == sha256_file(folder / best["file"])


@pytest.mark.parametrize("sets, words", [
    (("train.average_last=1",), "average_last: 1 is no average"),
    (("train.average_last=3", "train.keep_last=2"), "must not exceed keep_last (2)"),
])
def test_average_last_out_of_range_is_one_line_naming_the_key(tiny, tmp_path, sets, words):
    result = train_cli(tiny.config["transformer"], tmp_path / "run", *sets)
    assert result.returncode == 2
    assert words in assert_one_error_line(result.stderr)
