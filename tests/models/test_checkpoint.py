"""Checkpoint files: weights-only loading, refusal of corrupt, unsafe and future files, pointer fallback,
atomic saves under a full disk, pruning. The real checkpoints come from the tiny reference run (conftest)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import assert_one_error_line
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.errors import CheckpointError, DivergedError, ResourceError
from attnmt.models.checkpoint import (
    FORMAT,
    latest_checkpoint,
    load_checkpoint,
    read_pointer,
    save_checkpoint,
    sha256_file,
    step_file,
)
from attnmt.runfiles import RunDir


@pytest.fixture
def run_copy(tiny, tmp_path) -> RunDir:
    """A private copy of the reference run's checkpoints folder (final step 30, best step 10 or later)."""
    shutil.copytree(tiny.reference() / "checkpoints", tmp_path / "run" / "checkpoints")
    return RunDir(tmp_path / "run")


def newest(run: RunDir) -> Path:
    return run.checkpoints / read_pointer(run, "latest")["file"]


def step_files(run: RunDir) -> list[str]:
    return sorted(p.name for p in run.checkpoints.iterdir() if p.name.startswith("step_"))


class MakesMarker:
    """Pickles as ``open(marker, "w")``: loading it with plain pickle would create the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


# ------------------------------------------------------------------------------------------ loading


def test_real_checkpoint_loads_with_plain_weights_only(run_copy):
    path = newest(run_copy)
    payload = torch.load(path, map_location="cpu", weights_only=True)  # no allow-list, no attnmt code
    assert payload["format"] == FORMAT
    assert payload["progress"]["step"] == 30 and payload["progress"]["finished"]
    assert all(isinstance(t, torch.Tensor) and torch.isfinite(t).all() for t in payload["model"].values())
    assert {"model_sha256", "dynamics", "tokenizer", "data_sha256"} <= set(payload["fingerprint"])
    assert payload["fingerprint"]["dynamics"]["world_size"] == 1
    assert (load_checkpoint(path, read_pointer(run_copy, "latest")["sha256"])["progress"]
            == payload["progress"])


def test_checkpoint_with_a_torch_version_object_still_loads(run_copy, tmp_path):
    """Files written before torch_version was stored as str hold a TorchVersion; they stay usable."""
    payload = load_checkpoint(newest(run_copy))
    payload["torch_version"] = torch.__version__  # a TorchVersion, pickled as a global
    torch.save(payload, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt")["torch_version"] == str(torch.__version__)


@pytest.mark.parametrize("damage", ["truncated", "empty", "random"])
def test_damaged_file_is_a_checkpoint_error(run_copy, tmp_path, damage):
    data = newest(run_copy).read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "random": os.urandom(4096)}[damage])
    with pytest.raises(CheckpointError, match="bad.pt"):
        load_checkpoint(bad)


def test_cli_exits_4_on_a_truncated_checkpoint(run_copy, tmp_path):
    data = newest(run_copy).read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(data[:1000])
    result = CliRunner().invoke(app, ["info", str(bad)])
    assert result.exit_code == 4, result.output
    assert str(bad) in assert_one_error_line(result.stderr)


def test_pickled_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "model": {}, "extra": MakesMarker(marker)}, evil)
    with pytest.raises(CheckpointError, match="pickled objects"):
        load_checkpoint(evil)
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # the oracle: the file really is armed
    assert marker.exists()


def test_newer_format_is_refused(run_copy, tmp_path):
    payload = load_checkpoint(newest(run_copy))
    payload["format"] = FORMAT + 1
    torch.save(payload, tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match=f"format {FORMAT + 1}"):
        load_checkpoint(tmp_path / "future.pt")


def test_sha256_mismatch_is_refused(run_copy):
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(newest(run_copy), "0" * 64)


# ------------------------------------------------------------------------------------------ pointers


def previous_step_file(run: RunDir) -> str:
    return [name for name in step_files(run) if name != read_pointer(run, "latest")["file"]][-1]


@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_unreadable_latest_json_falls_back_to_the_newest_step_file(run_copy, damage):
    target = newest(run_copy)
    pointer = run_copy.checkpoints / "latest.json"
    if damage == "garbage":
        pointer.write_text('{"step": 3', encoding="utf-8")
    else:
        pointer.unlink()
    path, payload = latest_checkpoint(run_copy)
    assert path == target and payload["progress"]["step"] == 30
    assert read_pointer(run_copy, "latest") == {"step": 30, "file": target.name,
                                                "sha256": sha256_file(target), "format": FORMAT}


def test_sha256_mismatch_falls_back_to_the_previous_checkpoint(run_copy, caplog):
    previous = previous_step_file(run_copy)
    pointer = read_pointer(run_copy, "latest")
    (run_copy.checkpoints / "latest.json").write_text(json.dumps({**pointer, "sha256": "0" * 64}),
                                                      encoding="utf-8")
    path, _ = latest_checkpoint(run_copy)
    assert path.name == previous
    assert pointer["file"] in caplog.text and "sha256" in caplog.text


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(run_copy):
    previous = previous_step_file(run_copy)
    target = newest(run_copy)
    target.write_bytes(target.read_bytes()[:5000])
    path, payload = latest_checkpoint(run_copy)
    assert path.name == previous and payload["progress"]["step"] == int(previous[5:13])
    assert read_pointer(run_copy, "latest")["file"] == previous


def test_no_loadable_checkpoint_is_an_error_not_a_fresh_start(run_copy):
    """Starting over would overwrite and prune the step files; the run must stop and say why."""
    for name in step_files(run_copy):
        (run_copy.checkpoints / name).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="no loadable checkpoint"):
        latest_checkpoint(run_copy)


def test_stray_tmp_file_is_not_a_checkpoint(run_copy):
    shutil.copy(newest(run_copy), run_copy.checkpoints / ".step_00000099.pt.tmp-12345")
    (run_copy.checkpoints / "latest.json").unlink()
    path, _ = latest_checkpoint(run_copy)
    assert path.name == step_file(30)


# ------------------------------------------------------------------------------------------- saving


def test_disk_full_during_save_keeps_the_previous_checkpoint(run_copy, monkeypatch):
    payload = load_checkpoint(newest(run_copy))
    pointer_before = (run_copy.checkpoints / "latest.json").read_bytes()
    files_before = sorted(os.listdir(run_copy.checkpoints))

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(ResourceError, match="no space left on device") as raised:
        save_checkpoint(run_copy, payload, 31)
    assert str(run_copy.checkpoints / step_file(31)) in str(raised.value)
    assert sorted(os.listdir(run_copy.checkpoints)) == files_before  # no tmp, no step_31
    assert (run_copy.checkpoints / "latest.json").read_bytes() == pointer_before
    path, _ = latest_checkpoint(run_copy)
    assert path.name == step_file(30)


def test_non_finite_weights_are_never_saved(run_copy):
    payload = load_checkpoint(newest(run_copy))
    name = next(iter(payload["model"]))
    payload["model"][name] = payload["model"][name].clone().fill_(float("nan"))
    files_before = sorted(os.listdir(run_copy.checkpoints))
    with pytest.raises(DivergedError, match=name):
        save_checkpoint(run_copy, payload, 31)
    assert sorted(os.listdir(run_copy.checkpoints)) == files_before


def test_save_writes_file_and_pointer_atomically(run_copy):
    payload = load_checkpoint(newest(run_copy))
    pointer = save_checkpoint(run_copy, payload, 31)
    assert pointer == read_pointer(run_copy, "latest")
    assert pointer["sha256"] == sha256_file(run_copy.checkpoints / step_file(31))
    assert not [p for p in os.listdir(run_copy.checkpoints) if ".tmp-" in p]
    assert (load_checkpoint(run_copy.checkpoints / step_file(31), pointer["sha256"])["progress"]
            == payload["progress"])


def test_a_setting_added_later_stays_out_of_the_fingerprint_at_its_old_value():
    """Checkpoints written before train.alignment existed have no such key in their dynamics; a run that
    leaves it unset must still resume from them, and one that sets it must not."""
    from helpers import write_tiny_config

    from attnmt.config.schema import load_config
    from attnmt.models.checkpoint import ADDED_DYNAMICS, fingerprint

    class Tokenizer:
        def fingerprint(self):
            return {"src_sha256": "0"}

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        config = write_tiny_config(Path(tmp) / "tiny.yaml")
        plain = fingerprint(load_config(config), 1, Tokenizer(), [3, 4])
        guided = fingerprint(load_config(config, ["train.alignment.weight=0.1"]), 1, Tokenizer(), [3, 4])
    assert "alignment" in ADDED_DYNAMICS and "alignment" not in plain["dynamics"]
    assert guided["dynamics"]["alignment"]["weight"] == 0.1
