"""The error types every stage raises, the exit code each one maps to, and the one out-of-memory message.

Library code raises these with a message that names the file, key or line; only the command line
(``cli/``) turns them into one ``error:`` line on stderr and an exit code (``docs/RELIABILITY.md``, the
contract).
"""

from __future__ import annotations


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
