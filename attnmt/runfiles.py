"""The run folder: its layout, atomic writes and the lock that keeps two processes out of one run.

```
run/
  attnmt-run.json    the marker, written first: the attnmt version and a run id
  config.yaml        the resolved config (absolute paths), written atomically
  tokenizer/         spm.model (or src.model + tgt.model) and tokenizer.json with their sha256
  data/<split>/      the encoded corpus of each split as a Hugging Face Arrow dataset
  data/stats.json    the corpus statistics printed by ``attnmt prepare``
  checkpoints/       training checkpoints and their pointer files
  metrics.jsonl      one JSON object per logged event
  train.log          warnings and a bug's traceback
  plots/             heatmaps drawn during training (train.plot_every), and plot-curves' GIFs of them
  curves.png         plot-curves' figure
  tensorboard/       train.tensorboard's event files
  distilled/         ``attnmt distill``'s corpus: a teacher's translations of the training sources
  shortlist.pt       ``attnmt shortlist``'s table: the target pieces each source piece may translate to
  .lock              held with fcntl.flock while a process writes the run
```

"Nothing lost" (``docs/RELIABILITY.md``): the run folder only ever gains complete files, because
every file is written to a temporary name in the same folder, fsynced and renamed into place. A file or
folder that replaces another keeps what the user set on the one it replaces: its permission bits, and its
owner and group where this process may set them (``keep_attributes``); a new one gets the umask's mode. A
failure to write is one error of the contract naming the path (``errors.os_error``). A run
folder is recognised by its marker, never assumed: ``RunLock`` refuses a folder that holds anything
else (``check_run_folder``), writes the marker before anything else, and removes what a killed process
left half-written (``remove_stale``), so attnmt only ever replaces or deletes paths it wrote itself.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, ResourceError, os_error

# The file that marks a folder as a CTranslate2 export written by ``attnmt export`` (``ctranslate.py``).
EXPORT_MANIFEST = "attnmt-export.json"
# The file that marks a folder as an attnmt run folder, written before anything else in it.
RUN_MARKER = "attnmt-run.json"
# The run folder's own names: written by prepare and train (plots/, curves.png also by plot-curves;
# distilled/ by distill, shortlist.pt by shortlist), never by another command's output option.
RUN_OWNED = (RUN_MARKER, "config.yaml", "tokenizer", "data", "checkpoints", "metrics.jsonl", "train.log",
             "plots", "curves.png", "tensorboard", "distilled", "shortlist.pt", ".lock")
# The run's own names that only a process holding the lock writes.
LOCKED = frozenset({RUN_MARKER, "config.yaml", "tokenizer", "metrics.jsonl"})
# A temporary file or folder of an atomic write (``.NAME.tmp-XXXX``) or the old copy a folder replacement
# moves aside (``.NAME.old-PID``).
TEMPORARY = re.compile(r"^\..+\.(tmp|old)-[A-Za-z0-9_]+$")


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def split(self, name: str) -> Path:
        return self.root / "data" / name

    @property
    def stats(self) -> Path:
        return self.root / "data" / "stats.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def distilled(self) -> Path:
        return self.root / "distilled"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def marker(self) -> Path:
        return self.root / RUN_MARKER


def keep_attributes(target: int | Path, replaced: Path | os.stat_result | None) -> None:
    """Give ``target`` (a new file or folder about to take ``replaced``'s place: its open descriptor or its
    path) what the user set on ``replaced`` (a path, or its ``stat``; missing, or not of the same kind:
    nothing to keep): the owner and group where this process may set them (else the group alone, else
    neither), then the permission bits (after the owner: a change of owner clears set-user-ID)."""
    if not isinstance(replaced, os.stat_result):
        try:
            replaced = os.stat(replaced) if replaced is not None else None
        except (FileNotFoundError, NotADirectoryError):
            replaced = None
    own = os.stat(target)
    if replaced is None or stat.S_IFMT(own.st_mode) != stat.S_IFMT(replaced.st_mode):
        return
    if (own.st_uid, own.st_gid) != (replaced.st_uid, replaced.st_gid):
        for uid in (replaced.st_uid, -1):
            try:
                os.chown(target, uid, replaced.st_gid)
                break
            except OSError as e:  # EPERM: not ours to give away; EINVAL: an owner a user namespace cannot map
                if e.errno not in (errno.EPERM, errno.EINVAL):
                    raise
    os.chmod(target, stat.S_IMODE(replaced.st_mode))


def _new_temporary(path: Path) -> tuple[int, Path]:
    """A new file ``.NAME.tmp-XXXXXXXX`` beside ``path``, open for writing, created with mode 0o666 so that
    the umask (and a folder's default ACL) decides its mode as for any new file (``mkstemp`` gives 0o600)."""
    while True:
        tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a rename is not on disk until its directory entry is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_through(path: Path, data: bytes) -> None:
    """Write ``data`` into an existing special file (a device such as ``/dev/stdout``, a named pipe) as it
    is: such a path cannot be replaced by a file. A full device is a ResourceError."""
    try:
        with open(path, "wb", buffering=0) as handle:
            view = memoryview(data)
            while view:
                view = view[handle.write(view):]
    except OSError as e:
        raise os_error(path, e) from None


def temporary_folder(final: Path) -> Path:
    """A new folder ``.NAME.tmp-XXXXXXXX`` beside ``final``, to be filled and moved into its place whole:
    with the umask's mode (``mkdtemp`` gives 0o700), or, when ``final`` is a folder it will replace, that
    folder's attributes (``keep_attributes``)."""
    while True:
        tmp = final.with_name(f".{final.name}.tmp-{secrets.token_hex(4)}")
        try:
            tmp.mkdir()
        except FileExistsError:
            continue
        keep_attributes(tmp, final)
        return tmp


def check_new_folder(out: Path) -> None:
    """A ConfigError unless ``out`` is missing or an empty folder: what ``publish_folder`` may write (an
    exporter asks before it reads a model)."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        what = "a folder that is not empty" if out.is_dir() else "a file"
        raise ConfigError(f"{out} is {what}; refusing to overwrite it (give a new folder)")


def publish_folder(out: Path, fill: Callable[[Path], None]) -> None:
    """Write a new folder ``out`` whole: ``fill(tmp)`` writes its files into a temporary folder beside it,
    which is fsynced and renamed into place; ``out`` must not exist or be an empty folder (a ConfigError
    otherwise, before ``fill`` runs), and a failure leaves nothing behind. A symbolic link stays a link:
    the folder it points to is the one written (beside it, then renamed into its place)."""
    out = Path(out)
    check_new_folder(out)
    if out.is_symlink():
        out = Path(os.path.realpath(out))  # its final target, as ``atomic_write_bytes`` does for a file
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_folder(out)
    except OSError as e:
        raise os_error(out, e) from None
    try:
        fill(tmp)
        for path in tmp.iterdir():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise os_error(out, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    A symbolic link stays a link: the file it points to is replaced. A path that exists and is not a
    regular file or a folder (a device such as ``/dev/stdout``, a named pipe) is written straight through
    (``write_through``), never replaced by a regular file.

    ``durable``: fsync the file and its folder, so that the new file survives a power cut too (what a
    checkpoint or a translation needs; a figure that can be drawn again may skip the cost)."""
    path = Path(path)
    try:
        replaced = os.stat(path)  # through any link: /dev/stdout into a pipe is a pipe
    except OSError:
        replaced = None  # a new file
    if replaced is not None and not stat.S_ISREG(replaced.st_mode) and not stat.S_ISDIR(replaced.st_mode):
        write_through(path, data)  # by the name given: a pipe's /proc target has no name to open
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # the link's final target, replaced in place of the link
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _new_temporary(path)
    except OSError as e:
        raise os_error(path, e) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        replace_file(tmp, path, durable)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise os_error(path, e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_file(tmp: Path, final: Path, durable: bool = True) -> None:
    """Rename the complete file ``tmp`` over ``final`` (the one way a file is replaced), keeping what the
    user set on ``final`` (``keep_attributes``); ``durable``: and fsync the folder, so that the rename
    survives a power cut."""
    keep_attributes(tmp, final)
    os.replace(tmp, final)
    if durable:
        fsync_dir(final.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a fully written folder ``tmp`` to ``final``, replacing an older one only after it is complete;
    the new folder and its files keep the attributes of the old ones of the same names
    (``keep_attributes``). What ``final`` is must be attnmt's: a folder of the run (never a file, nor a
    link that leads elsewhere; the run folder itself is checked by ``RunLock``). A failure leaves the
    old folder in place and is the contract's error naming ``final``."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"{final}: not a folder attnmt wrote (a file or a link); refusing to replace it")
    try:
        if final.exists():
            for folder, _, files in os.walk(tmp):
                for name in files:
                    keep_attributes(Path(folder) / name, final / Path(folder).relative_to(tmp) / name)
            keep_attributes(tmp, final)
            os.replace(final, old)
        try:
            os.replace(tmp, final)
        except OSError:
            if old.exists():
                os.replace(old, final)
            raise
        fsync_dir(final.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise os_error(final, e) from None
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------ what a run folder is


def is_run_folder(path: Path) -> bool:
    """``path`` holds attnmt's marker, or is a run folder an attnmt older than the marker wrote (a tokenizer
    with its metadata, and data statistics or a checkpoint pointer: names only attnmt writes together)."""
    path = Path(path)
    if (path / RUN_MARKER).is_file():
        return True
    return (path / "tokenizer" / "tokenizer.json").is_file() and (
        (path / "data" / "stats.json").is_file() or (path / "checkpoints" / "latest.json").is_file())


def enclosing_run(path: Path) -> Path | None:
    """The run folder ``path`` is in (or is), found by walking up from it; None when there is none."""
    here = Path(os.path.realpath(path))
    for folder in (here, *here.parents):
        if folder.is_dir() and is_run_folder(folder):
            return folder
    return None


def _left_by_a_claim(name: str) -> bool:
    """What an attnmt that started on a new folder and was killed may have left before its marker."""
    return name == ".lock" or name.startswith(".probe-") or name.startswith(f".{RUN_MARKER}.tmp-")


def _some_contents(root: Path, limit: int = 3) -> list[str]:
    """Up to ``limit`` + 1 paths under ``root`` (files, or empty folders with a slash), walked top-down in
    sorted order."""
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        if folder == str(root):
            dirs[:] = [d for d in dirs if not _left_by_a_claim(d)]
            files = [f for f in files if not _left_by_a_claim(f)]
        relative = Path(folder).relative_to(root)
        if not dirs and not files and folder != str(root):
            found.append(f"{relative.as_posix()}/")
        found += [(relative / name).as_posix() for name in sorted(files)]
        if len(found) > limit:
            break
    return found


def check_run_folder(run: RunDir) -> None:
    """Refuse, before anything is written, a run folder path that is a file, or a folder that holds
    something and is not an attnmt run folder (ConfigError, naming what it holds)."""
    root = run.root
    if not root.exists():
        return
    shown = os.path.abspath(root)  # "." or "runs/x" named in full
    if not root.is_dir():
        raise ConfigError(f"{shown}: is a file, not a run folder; give an empty or new --run-dir")
    if is_run_folder(root):
        return
    try:
        entries = [name for name in os.listdir(root) if not _left_by_a_claim(name)]
    except OSError as e:
        raise os_error(root, e, "read") from None
    if entries:
        found = _some_contents(root)
        listing = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise ConfigError(f"{shown}: not an attnmt run folder (holds {listing}); give an empty or new "
                          "--run-dir")


def write_marker(run: RunDir) -> None:
    """The run folder's marker (the attnmt version, a run id, when it was made), unless it has one."""
    from . import __version__

    if not run.marker.is_file():
        marker = {"attnmt": __version__, "run_id": uuid.uuid4().hex,
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        atomic_write_text(run.marker, json.dumps(marker, indent=2) + "\n")


def remove_stale(run: RunDir) -> list[Path]:
    """Remove the temporary files and folders (``.NAME.tmp-*``, ``.NAME.old-*``) that a killed process left
    in the run folder and in its data, tokenizer, checkpoint and distilled folders; the caller holds the
    run's lock, so no live writer owns them. In the run folder itself only the temporaries of the run's own
    names go (plot-curves writes curves.png without the lock). Returns what was removed."""
    removed = []
    owned = (run.data, run.tokenizer, run.checkpoints, run.distilled)
    folders = [(run.root, True)] + [(folder, False) for folder in owned]
    for folder, own_names_only in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if not TEMPORARY.match(name) or (own_names_only and name[1:].rsplit(".", 1)[0] not in LOCKED):
                continue
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class RunLock:
    """An exclusive ``fcntl.flock`` on ``run/.lock``; a second process gets a ResourceError at once.

    Taking it claims the folder for attnmt: a file, or a folder holding anything but an attnmt run, is
    refused before anything is written (``check_run_folder``); then the marker is written if the folder
    has none, and the temporaries of a killed process are removed."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        check_run_folder(self.run)
        try:
            self.run.root.mkdir(parents=True, exist_ok=True)
            probe = self.run.root / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
            self._fd = os.open(self.run.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except FileExistsError:
            raise ResourceError(f"{self.run.root}: run folder path exists and is not a folder") from None
        except NotADirectoryError:
            raise ResourceError(f"{self.run.root}: run folder path is not a folder") from None
        except OSError as e:
            raise os_error(self.run.root, e) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise ResourceError(f"{self.run.root}: run folder is in use "
                                "by another attnmt process (locked)") from None
        try:
            check_run_folder(self.run)  # again, now that no other attnmt can be writing it
            write_marker(self.run)
            remove_stale(self.run)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
