"""Shared fixtures: an offline Hugging Face cache, a socket guard, a subprocess runner for ``python -m
attnmt`` and one prepared toy run folder reused by every test that only reads it.

The Hugging Face variables are set here, at import, because ``huggingface_hub`` and ``datasets`` read
them once when they are first imported.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
TOY_CONFIG = CONFIGS / "toy_transformer.yaml"

# Small enough that prepare takes about a second; the sizes every toy run in these tests uses.
TOY_SIZES = {"train": 500, "dev": 50, "test": 50}
TOY_VOCAB = 100
TOY_SET = [
    "--set", f"data.train.size={TOY_SIZES['train']}",
    "--set", f"data.dev.size={TOY_SIZES['dev']}",
    "--set", f"data.test.size={TOY_SIZES['test']}",
    "--set", f"tokenizer.vocab_size={TOY_VOCAB}",
]  # fmt: skip

_HF_HOME = tempfile.mkdtemp(prefix="attnmt-test-hf-")
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HOME": _HF_HOME,
    "OMP_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}
os.environ.update(OFFLINE_ENV)


def hash_tree(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (to prove a failed command changed nothing)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(root).rglob("*"))
        if p.is_file()
    }


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def assert_one_error_line(stderr: str) -> str:
    """The contract for every expected failure: exactly one stderr line, ``error: ...``, no traceback."""
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def run_attnmt():
    """Run ``python -m attnmt ARGS`` as a user would, offline, with a timeout."""

    def run(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess:
        env = {**os.environ, **OFFLINE_ENV}
        return subprocess.run(
            [sys.executable, "-m", "attnmt", *map(str, args)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails loudly."""

    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"network access attempted: connect{args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
    """One toy run folder prepared in-process with ``attnmt prepare``; tests must not modify it."""
    from typer.testing import CliRunner

    from attnmt.cli import app

    run_dir = tmp_path_factory.mktemp("toy") / "run"
    result = CliRunner().invoke(app, ["prepare", str(TOY_CONFIG), "--run-dir", str(run_dir), *TOY_SET])
    return run_dir, result


@pytest.fixture
def toy_run_copy(toy_run, tmp_path):
    """A private copy of the prepared toy run folder, for tests that run prepare on it again."""
    run_dir, result = toy_run
    assert result.exit_code == 0, result.output
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy
