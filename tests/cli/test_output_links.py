"""A folder output given as a symbolic link (round 5: ``attnmt export RUN LINK`` where LINK points at an
empty folder was exit 5 "not a directory"): the command writes into the folder the link points to and the
link stays, as a file output through a link replaces the file it points to. Every refusal stays: a folder
that is not empty, an output inside an input.

``publish_folder`` (a new folder written whole) is checked over every shape of link; the commands over
every folder output the app declares, found by walking ``contract.DECLARED``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import assert_one_error_line, hash_tree
from marian_fixture import make_marian
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.cli.contract import DECLARED
from attnmt.errors import ConfigError
from attnmt.runfiles import publish_folder


def fill(folder: Path) -> None:
    (folder / "model.bin").write_bytes(b"weights")


@pytest.mark.parametrize("shape", ["absolute", "relative", "chain", "dangling"])
def test_a_new_folder_through_a_link_is_written_where_the_link_points(tmp_path, shape):
    target = tmp_path / "real" / "export"
    (tmp_path / "real").mkdir()
    if shape != "dangling":
        target.mkdir()
    link = tmp_path / "link"
    if shape == "chain":
        (tmp_path / "middle").symlink_to(target)
        link.symlink_to(tmp_path / "middle")
    else:
        link.symlink_to(os.path.relpath(target, tmp_path) if shape == "relative" else target)
    publish_folder(link, fill)
    assert link.is_symlink() and os.path.realpath(link) == str(target)
    assert (target / "model.bin").read_bytes() == b"weights"
    assert sorted(os.listdir(tmp_path / "real")) == ["export"]  # no temporary left beside it


def test_a_link_to_a_folder_that_is_not_empty_is_refused_untouched(tmp_path):
    target = tmp_path / "full"
    target.mkdir()
    (target / "mine.txt").write_text("keep\n")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ConfigError, match="not empty"):
        publish_folder(tmp_path / "link", fill)
    assert sorted(os.listdir(target)) == ["mine.txt"]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def marian_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint ``export --to huggingface`` takes (an imported Marian model)."""
    root = tmp_path_factory.mktemp("links")
    result = invoke("import", make_marian(root / "marian"), root / "marian.pt")
    assert result.exit_code == 0, result.output
    return root / "marian.pt"


# Each folder output of the app, as (command, option) -> its arguments with {out} for the output. prepare's,
# train's and distill's run folder is RunLock's (``test_nothing_lost.py``); study trains a model per variant.
FOLDER_OUTPUTS = {
    ("export", "out"): [["export", "{ckpt}", "{out}"],
                        ["export", "{marian}", "{out}", "--to", "huggingface"]],
    ("plot", "out"): [["plot", "{run}", "monday , 3 june 2001", "--out", "{out}"]],
    ("toy-data", "out_dir"): [["toy-data", "{out}", "--train-size", "3", "--dev-size", "2",
                               "--test-size", "2"]],
}
ELSEWHERE = {("prepare", "run_dir"), ("train", "run_dir"), ("distill", "run_dir"), ("study", "out")}


def test_every_folder_output_is_covered():
    declared = {(command, name) for command, d in DECLARED.items()
                for name, output in d.outputs.items() if output.folder}
    assert declared == set(FOLDER_OUTPUTS) | ELSEWHERE


@pytest.mark.parametrize("args", [args for cases in FOLDER_OUTPUTS.values() for args in cases],
                         ids=lambda args: "-".join(a for a in args if not a.startswith("{"))[:40])
def test_a_folder_output_through_a_link_to_an_empty_folder_goes_into_it(tiny, marian_checkpoint, tmp_path,
                                                                           args):
    run = tiny.reference("transformer")
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    places = {"{ckpt}": sorted(run.glob("checkpoints/step_*.pt"))[-1], "{run}": run,
              "{marian}": marian_checkpoint, "{out}": link}
    result = invoke(*[places.get(a, a) for a in args])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.path.realpath(link) == str(target)
    assert any(target.iterdir()) and sorted(os.listdir(tmp_path)) == ["link", "target"]


def test_export_through_a_link_keeps_every_refusal(tiny, tmp_path):
    """A link to a folder that is not empty, and a link into the model's own run folder: exit 2, unchanged."""
    run = tiny.reference("transformer")
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep\n")
    (tmp_path / "to-full").symlink_to(full)
    (tmp_path / "into-run").symlink_to(run / "checkpoints")
    before = hash_tree(run), hash_tree(full)
    for link, fragment in (("to-full", "not empty"), ("into-run", "")):
        result = invoke("export", run, tmp_path / link)
        assert result.exit_code == 2, result.output
        assert fragment in assert_one_error_line(result.stderr)
    assert (hash_tree(run), hash_tree(full)) == before
