"""The run folder: its layout, atomic writes and the lock that keeps two processes out of one run.

```
run/
  config.yaml        the resolved config (absolute paths), written atomically
  tokenizer/         spm.model (or src.model + tgt.model) and tokenizer.json with their sha256
  data/<split>/      the encoded corpus of each split as a Hugging Face Arrow dataset
  data/stats.json    the corpus statistics printed by ``attnmt prepare``
  checkpoints/       training checkpoints and their pointer files
  metrics.jsonl      one JSON object per logged event
  .lock              held with fcntl.flock while a process writes the run
```

"Nothing lost" (``docs/RELIABILITY.md``): the run folder only ever gains complete files, because
every file is written to a temporary name in the same folder, fsynced and renamed into place.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ResourceError

# The file that marks a folder as a CTranslate2 export written by ``attnmt export`` (``ctranslate.py``).
EXPORT_MANIFEST = "attnmt-export.json"


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
    def lock_file(self) -> Path:
        return self.root / ".lock"


def _resource_error(path: Path, e: OSError) -> ResourceError:
    cause = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or type(e).__name__).lower()
    return ResourceError(f"{path}: cannot write: {cause}")


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
        raise _resource_error(path, e) from None


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    A symbolic link stays a link: the file it points to is replaced. A path that exists and is not a
    regular file or a folder (a device such as ``/dev/stdout``, a named pipe) is written straight through
    (``write_through``), never replaced by a regular file.

    ``durable``: fsync the file and its folder, so that the new file survives a power cut too (what a
    checkpoint or a translation needs; a figure that can be drawn again may skip the cost)."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # the link's final target, replaced in place of the link
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None  # a new file
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        write_through(path, data)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    except OSError as e:
        raise _resource_error(path, e) from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp creates 0600; give the file the user's usual mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _resource_error(path, e) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a fully written folder ``tmp`` to ``final``, replacing an older one only after it is complete."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


class RunLock:
    """An exclusive ``fcntl.flock`` on ``run/.lock``; a second process gets a ResourceError at once."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
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
            raise _resource_error(self.run.root, e) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise ResourceError(f"{self.run.root}: run folder is in use "
                                "by another attnmt process (locked)") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
