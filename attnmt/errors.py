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


def is_out_of_memory(error: BaseException) -> bool:
    """``MemoryError``, ``torch.OutOfMemoryError`` (CUDA) or the CPU allocator's ``RuntimeError``, told
    apart by name and message so that this module needs no torch."""
    text = str(error)
    return (
        isinstance(error, MemoryError)
        or type(error).__name__ == "OutOfMemoryError"
        or "DefaultCPUAllocator" in text
        or "can't allocate memory" in text
    )


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
