"""The error types every stage raises, the exit code each one maps to, the one out-of-memory message, and
the one mapping of an operating system's error (a full disk, a file-size limit, ...) to them (``os_error``).

Library code raises these with a message that names the file, key or line; only the command line
(``cli/``) turns them into one ``error:`` line on stderr and an exit code (``docs/RELIABILITY.md``, the
contract).
"""

from __future__ import annotations

import errno
import os


class AttnmtError(Exception):
    """An expected failure: the message is complete and is shown to the user as it is."""

    exit_code = 1


class ConfigError(AttnmtError):
    """A usage or configuration error: bad YAML, an unknown key, a value out of range."""

    exit_code = 2


class DataError(AttnmtError):
    """Input data that cannot be used: a missing file, invalid UTF-8, mismatched line counts."""

    exit_code = 3


class ConstraintError(DataError):
    """A line's lexical constraints that no search can meet; ``line`` is 1-based."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line, self.reason = line, reason


class CheckpointError(AttnmtError):
    """A checkpoint, model or tokenizer that is corrupt, unsafe or does not match."""

    exit_code = 4


class ResourceError(AttnmtError):
    """Disk full, permission denied, out of memory, a run folder locked by another process."""

    exit_code = 5


class DivergedError(AttnmtError):
    """Training produced non-finite values too many times in a row."""

    exit_code = 6


# Training batches follow train.max_tokens; validation, translation and attention maps follow
# decode.max_tokens (or --max-tokens), so the message names both.
OUT_OF_MEMORY = (
    "out of memory: reduce the batch (--max-tokens or decode.max_tokens when decoding and validating, "
    "train.max_tokens when training); checkpoints already saved are kept"
)

# Memory that ran out before any batch: loading a library, starting a thread (its stack is address space
# too). The batch is not what to change.
LOADING_OUT_OF_MEMORY = (
    "out of memory while loading the libraries or starting threads: the process's memory limit is too low; "
    "raise it (ulimit -v: a command that loads a model needs about 1 GB of address space)"
)

# What memory running out says where it is not a MemoryError: PyTorch's CPU allocator, the C library's
# ENOMEM, the dynamic loader unable to map a library under an address-space limit (``ulimit -v``; numpy wraps
# that in an ImportError of its own, the loader's words at its end), and a thread that could not start
# (C++'s std::system_error EAGAIN, as sentencepiece raises it; Python's own RuntimeError).
_MEMORY_WORDS = ("defaultcpuallocator", "can't allocate memory", "cannot allocate memory",
                 "failed to map segment from shared object")
_THREAD_WORDS = ("resource temporarily unavailable", "can't start new thread")
# CPython's words for a C function that returned an error without setting an exception: under ``ulimit -v``,
# an allocation a module's initialisation did not check, as the module was imported.
_NULL_WORDS = ("without setting an exception", "error return without exception set")


def _chain(error: BaseException) -> list[BaseException]:
    """The error, its cause, and theirs (a chain is short, and may loop)."""
    found: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and len(found) < 8 and seen not in found:
        found.append(seen)
        seen = seen.__cause__ or seen.__context__
    return found


def is_out_of_memory(error: BaseException) -> bool:
    """``MemoryError``, ``torch.OutOfMemoryError`` (CUDA), or an error whose text (or its cause's) says the
    memory or the threads ran out (``_MEMORY_WORDS``, ``_THREAD_WORDS``), or a SystemError of ``_NULL_WORDS``
    out of an import; told apart by name and message so that this module needs no torch. An OSError with an
    errno is ``os_error``'s to map (ENOMEM: exit 5 naming its file)."""
    if isinstance(error, MemoryError):  # at once: with no memory left, even the chain's list may fail
        return True
    for seen in _chain(error):
        if isinstance(seen, MemoryError) or type(seen).__name__ == "OutOfMemoryError":
            return True
        if isinstance(seen, OSError) and seen.errno is not None:
            continue
        text = str(seen).lower()
        if any(words in text for words in _MEMORY_WORDS + _THREAD_WORDS):
            return True
        if isinstance(seen, SystemError) and any(w in text for w in _NULL_WORDS) and \
                raised_while_importing(seen):
            return True
    return False


def raised_while_importing(error: BaseException) -> bool:
    """``error`` came out of a module being imported: an ImportError, Python's import machinery on its
    traceback, or the import itself returning NULL (``_find_and_load``)."""
    if isinstance(error, ImportError) or "_find_and_load" in str(error):
        return True
    tb = error.__traceback__  # walked by hand: no import, so little memory, where memory ran out
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        tb = tb.tb_next
    return False


def memory_message(error: BaseException) -> str:
    """The one line for an error ``is_out_of_memory`` recognises: ``LOADING_OUT_OF_MEMORY`` before any batch
    (an import, a thread), else ``OUT_OF_MEMORY``."""
    early = any(raised_while_importing(e) or any(w in str(e).lower() for w in _THREAD_WORDS)
                for e in _chain(error))
    return LOADING_OUT_OF_MEMORY if early else OUT_OF_MEMORY


# The operating system's errors that are the machine's resources, not attnmt's bug nor the user's data, in
# plain words (``os.strerror``'s "File too large" does not say which limit).
RESOURCE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large (the process's file-size limit)",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EMFILE: "too many open files",
    errno.ENFILE: "too many open files in the system",
    errno.ENOMEM: "out of memory",
}
# Of those, the process's own: the same whatever file it was reading.
PROCESS_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def os_error(path: os.PathLike | str | None, error: OSError, doing: str | None = "write",
             user_input: bool = False) -> AttnmtError:
    """The contract's error for ``error``, which ``doing`` ("write", "read", ...; None: not known) to
    ``path`` raised: a DataError (exit 3) when ``path`` is a user's input file (``user_input``) and the
    cause is not the process's own (too many open files, out of memory); otherwise a ResourceError (exit 5).
    The message names the path and says the cause in words: ``out.txt: cannot write: no space left on
    device``."""
    cause = RESOURCE_ERRNOS.get(error.errno) or (error.strerror or type(error).__name__).lower()
    where = f"{os.fspath(path)}: " if path is not None else ""
    what = f"cannot {doing}: " if doing else ""
    kind = DataError if user_input and error.errno not in PROCESS_ERRNOS else ResourceError
    return kind(f"{where}{what}{cause}")
