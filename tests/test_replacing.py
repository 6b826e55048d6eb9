"""Replacing a file or a folder keeps what the user set on it (``runfiles.keep_attributes``), and an
operating system's error is one error of the contract (``errors.os_error``). ``tests/cli/test_cli_fuzz.py``
checks both through every output option of every command; these are the cases a command line cannot set
up cheaply: a link, another owner, a rename that fails, a checkpoint saved again."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
import torch

from attnmt import runfiles
from attnmt.errors import DataError, ResourceError, os_error
from attnmt.models.checkpoint import save_checkpoint, step_file
from attnmt.runfiles import RunDir, atomic_write_bytes, replace_dir, temporary_folder

ROOT = os.geteuid() == 0


@pytest.fixture
def umask_027():
    """A umask that is not the usual one, so that a mode written into the code shows."""
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_and_folder_get_the_umasks_mode(tmp_path, umask_027):
    atomic_write_bytes(tmp_path / "new.txt", b"x")
    assert mode(tmp_path / "new.txt") == 0o640
    assert mode(temporary_folder(tmp_path / "folder")) == 0o750


def test_a_replaced_file_keeps_its_mode_and_owner_through_a_link(tmp_path, umask_027):
    target = tmp_path / "private.txt"
    target.write_bytes(b"old")
    target.chmod(0o600)
    owner = (4321, 4322) if ROOT else (os.getuid(), os.getgid())
    os.chown(target, *owner)
    link = tmp_path / "link.txt"
    link.symlink_to(target.name)
    atomic_write_bytes(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    info = target.stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o600, *owner)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "private.txt"]  # no temporary left


def test_a_replaced_folder_keeps_its_mode_and_its_files_theirs(tmp_path, umask_027):
    final = tmp_path / "tokenizer"
    final.mkdir()
    (final / "spm.model").write_bytes(b"old")
    (final / "spm.model").chmod(0o400)
    final.chmod(0o700)
    tmp = temporary_folder(final)
    assert mode(tmp) == 0o700  # the folder it will replace
    (tmp / "spm.model").write_bytes(b"new")
    (tmp / "tokenizer.json").write_bytes(b"{}")
    replace_dir(tmp, final)
    assert mode(final) == 0o700 and mode(final / "spm.model") == 0o400
    assert mode(final / "tokenizer.json") == 0o640  # new: the umask's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]


def test_a_folder_whose_rename_fails_is_put_back(tmp_path, monkeypatch):
    final = tmp_path / "data"
    final.mkdir()
    (final / "keep").write_bytes(b"old")
    tmp = temporary_folder(final)
    (tmp / "keep").write_bytes(b"new")
    real = os.replace

    def failing(src, dst):
        if Path(src) == tmp:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(runfiles.os, "replace", failing)
    with pytest.raises(ResourceError, match=f"^{final}: cannot write: no space left on device$"):
        replace_dir(tmp, final)
    assert (final / "keep").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_a_checkpoint_saved_again_keeps_its_mode(tmp_path, umask_027):
    run = RunDir(tmp_path / "run")
    payload = {"model": {"w": torch.zeros(2)}}
    save_checkpoint(run, payload, 3)
    path = run.checkpoints / step_file(3)
    assert mode(path) == 0o640
    path.chmod(0o600)
    save_checkpoint(run, payload, 3)
    assert mode(path) == 0o600 and mode(run.checkpoints / "latest.json") == 0o640


CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large (the process's file-size limit)",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EMFILE: "too many open files",
    errno.ENOMEM: "out of memory",
}


@pytest.mark.parametrize("number", CAUSES, ids=[errno.errorcode[n] for n in CAUSES])
def test_an_os_error_is_the_contracts_naming_its_path(number):
    error = OSError(number, os.strerror(number))
    written = os_error("out.txt", error)
    assert isinstance(written, ResourceError) and str(written) == f"out.txt: cannot write: {CAUSES[number]}"
    read = os_error("corpus.en", error, "read", user_input=True)
    # The process's own resources are not the input's fault.
    expected = ResourceError if number in (errno.EMFILE, errno.ENOMEM) else DataError
    assert type(read) is expected and str(read) == f"corpus.en: cannot read: {CAUSES[number]}"
