"""Process-wide settings that attnmt's own commands apply (never on import: a library user's process is
theirs to configure).

``settle_process``: what every command checks and sets before it imports anything heavy (``app.command``
calls it first):

- the working folder exists: run from a deleted one, importing torch aborts the process inside oneMKL
  ("Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so", exit 2 and no ``error:`` line); a relative
  path could not be resolved either, so it is a ConfigError (exit 2) before any import;
- matplotlib's config and cache folders are usable, or ``MPLCONFIGDIR`` is a private temporary folder
  (removed at exit): with a home that does not exist, is a file or cannot be written, matplotlib prints
  two warnings on stderr, or (as root) makes the missing home;
- stdout and stderr write UTF-8 (attnmt's files are UTF-8 whatever the locale): under ``LC_ALL=C
  PYTHONUTF8=0`` they are ASCII and a translation with an umlaut would fail to print.

``keep_freed_memory``: decoding frees and allocates the same few large tensors every step (the logits and
log-probabilities of every row, 10 MB each for 320 rows x 8,000 pieces). glibc's malloc serves blocks that
size with fresh ``mmap`` pages, or trims them off the heap once freed, so each step pays page faults to get
zeroed memory back from the kernel. Raising the mmap threshold to its maximum (32 MiB) and the trim threshold
to 1 GiB keeps freed memory in the process for reuse; ``scripts/bench/bench_decode.py --equal-work`` with and
without ``--no-malloc-tuning`` (under ``/usr/bin/time`` for the page faults) measures what that saves. The
cost is that up to 1 GiB of freed memory is held until the process ends, which suits a command that translates
and exits.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import ConfigError

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as above. Returns whether it took effect (False off Linux or off glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no libc found, or one without mallopt (musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1 and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1


def settle_process() -> None:
    """The checks and settings of the module docstring, in its order."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise ConfigError("the working folder was deleted (or moved away); cd into a folder that exists "
                          "and run the command again") from None
    private_matplotlib_dirs()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.encoding.lower().replace("-", "") != "utf8":
            stream.reconfigure(encoding="utf-8")


def private_matplotlib_dirs() -> str | None:
    """``MPLCONFIGDIR`` set to a new private folder, removed at exit, unless the user set one or matplotlib's
    own folders (``$XDG_CONFIG_HOME/matplotlib`` and ``$XDG_CACHE_HOME/matplotlib``, under ``~/.config`` and
    ``~/.cache`` by default) are usable (``_usable``). Returns the folder it made, if any."""
    if os.environ.get("MPLCONFIGDIR"):
        return None
    home = os.path.expanduser("~")
    bases = [os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"),
             os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")]
    if home != "~" and all(_usable(Path(base, "matplotlib")) for base in bases):
        return None
    folder = tempfile.mkdtemp(prefix="attnmt-matplotlib-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = folder
    return folder


def _usable(folder: Path) -> bool:
    """A writable folder, or one that can be made inside an existing writable folder other than the root:
    matplotlib makes its folders with their parents, and a home that does not exist must not be made."""
    existing = folder
    while not os.path.lexists(existing):
        existing = existing.parent
    if existing != folder and existing == Path(existing.anchor):
        return False
    return existing.is_dir() and os.access(existing, os.W_OK)
