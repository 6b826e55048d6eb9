"""Faults across processes under torchrun (2 processes on gloo, CPU), through ``python -m
attnmt.training.launch`` (torchrun with the exit-code contract on signals): a rank killed with SIGKILL,
SIGTERM to the launcher, a non-finite gradient on one rank only, and two nodes simulated on this machine. Each
compares with an uninterrupted 2-rank run: the same losses (compared with ==) and the same final
parameters."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import FAULT_RUNNER, REPO, curve, read_records, train_args, train_env

from attnmt.models.checkpoint import load_checkpoint

SETS = ("train.max_steps=12", "train.save_every=4", "train.keep_last=10", "train.eval_every=100",
        "train.log_every=1")
TIMEOUT = 240  # no hang: every launch here ends well within this


def launcher(run: Path, config: Path, *sets: str, fault: str | None = None, nodes: int = 1,
             endpoint: str | None = None) -> list[str]:
    """The command line of ``python -m attnmt.training.launch`` running ``attnmt train`` on two processes (one
    node with two, or one of ``nodes`` with one each)."""
    cmd = [sys.executable, "-m", "attnmt.training.launch"]
    if nodes == 1:
        cmd += ["--standalone", "--nproc-per-node", "2"]
    else:
        cmd += ["--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "attnmt-test"]
    args = train_args(config, run, *SETS, *sets)
    if fault:
        return cmd + [str(FAULT_RUNNER), fault, *args[1:]]
    return cmd + ["-m", *args]


def launch(run: Path, config: Path, *sets: str, fault: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(launcher(run, config, *sets, fault=fault), cwd=REPO, env=train_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)


def final_weights(run: Path, step: int = 12) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / f"step_{step:08d}.pt")["model"]


def assert_same_weights(run: Path, reference: Path, step: int = 12) -> None:
    mine, theirs = final_weights(run, step), final_weights(reference, step)
    assert mine.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(mine[name], tensor), name


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory) -> Path:
    """Two ranks on one node, 12 steps, uninterrupted."""
    run = tiny.copy_prepared(tmp_path_factory.mktemp("torchrun") / "reference")
    result = launch(run, tiny.config["transformer"])
    assert result.returncode == 0, result.stderr[-4000:]
    assert [r["step"] for r in read_records(run)] == list(range(1, 13))
    return run


def test_sigkill_of_one_rank_ends_the_job_and_the_same_command_resumes_exactly(tiny, reference, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    start = time.monotonic()
    killed = launch(run, tiny.config["transformer"], fault="sigkill_at_step:6@rank:1")
    assert killed.returncode != 0 and time.monotonic() - start < TIMEOUT  # ended, no hang
    assert "SIGKILL" in killed.stderr
    saved = sorted(p.name for p in (run / "checkpoints").glob("step_*.pt"))
    assert saved == ["step_00000004.pt"]  # the last complete one before the kill
    resumed = launch(run, tiny.config["transformer"])  # the same command
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from step_00000004.pt" in resumed.stdout
    assert curve(run) == curve(reference)
    assert_same_weights(run, reference)


def test_sigterm_to_the_launcher_saves_once_exits_143_and_resumes_exactly(tiny, reference, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    process = subprocess.Popen(launcher(run, tiny.config["transformer"], "train.save_every=1000"), cwd=REPO,
                               env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + TIMEOUT
    while not (metrics.exists() and metrics.read_text(encoding="utf-8").count('"train"') >= 3):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 143, stderr[-3000:]
    assert stderr.rstrip().splitlines()[-1].startswith("error: stopped by signal 15")
    saved = sorted((run / "checkpoints").glob("step_*.pt"))
    assert len(saved) == 1  # one checkpoint, rank 0's, at the step the ranks stopped after together
    stopped_at = int(saved[0].stem.split("_")[1])
    assert [r["step"] for r in read_records(run)] == list(range(1, stopped_at + 1))
    assert stopped_at < 12
    resumed = launch(run, tiny.config["transformer"], "train.save_every=1000")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert curve(run) == curve(reference)
    assert_same_weights(run, reference)


def test_a_nonfinite_gradient_on_one_rank_is_skipped_by_every_rank(tiny, tmp_path):
    """NaN on rank 1 alone at step 5 gives exactly what NaN on both ranks gives: DDP's all-reduce carries
    it to every rank, each sees the same non-finite norm and skips the same step, and the run goes on."""
    one, both = tiny.copy_prepared(tmp_path / "one"), tiny.copy_prepared(tmp_path / "both")
    for run, fault in ((one, "nan_at_step:5@rank:1"), (both, "nan_at_step:5")):
        result = launch(run, tiny.config["transformer"], fault=fault)
        assert result.returncode == 0, result.stderr[-4000:]
    assert [r["step"] for r in read_records(one, "nonfinite")] == [5]
    assert [r["step"] for r in read_records(one)] == [s for s in range(1, 13) if s != 5]
    assert curve(one) == curve(both)
    assert_same_weights(one, both)
    assert all(torch.isfinite(t).all() for t in final_weights(one).values())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(run: Path, config: Path, *sets: str) -> None:
    """Two launchers, one process each, meeting through a c10d rendezvous on 127.0.0.1."""
    command = launcher(run, config, *sets, nodes=2, endpoint=f"127.0.0.1:{free_port()}")
    nodes = [subprocess.Popen(command, cwd=REPO, env=train_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for node in nodes:
        _, stderr = node.communicate(timeout=TIMEOUT)
        assert node.returncode == 0, stderr[-4000:]


def test_two_nodes_equal_two_ranks_on_one_node_and_resume_the_same(tiny, reference, tmp_path):
    run = tiny.copy_prepared(tmp_path / "run")
    two_nodes(run, tiny.config["transformer"], "train.max_steps=8")
    assert curve(run) == curve(reference)[:8]
    assert_same_weights(run, reference, 8)
    two_nodes(run, tiny.config["transformer"])  # max_steps back to 12: a resume from step 8
    assert curve(run) == curve(reference)
    assert_same_weights(run, reference)
