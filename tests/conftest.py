"""Fixtures: a socket guard, one prepared toy run folder reused by every test that only reads it, and the
tiny runs of ``helpers.TinyRuns``. Plain helpers live in ``helpers.py`` (imported first: it sets the
offline environment before any Hugging Face library is imported)."""

from __future__ import annotations

import shutil
import socket

import pytest
from helpers import TOY_CONFIG, TOY_SET, TinyRuns


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


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyRuns:
    return TinyRuns(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def restore_torch_state():
    """In-process ``attnmt train`` switches on deterministic algorithms; leave the process as it was (the
    modules that train in process use it for every test: ``pytestmark``)."""
    import torch

    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(deterministic)
