"""The one reader of JSON that attnmt keeps on disk or is handed: a run folder's pointers and records
(``best.json``, ``alignment.json``, ``reverse.json``, ``metrics.jsonl``, ...), an imported model's
``config.json`` and vocabularies, an export's manifest, and JSON text from elsewhere (a corpus line, the
piece map inside a checkpoint).

The files inside a model folder, a run folder or an export are not streams: one that is not a regular file
(a named pipe, a device, a folder) is refused at once, never waited on. It is opened with ``O_NONBLOCK``
(opening a pipe with no writer returns at once instead of blocking) and ``fstat``-ed before one byte is
read. The text must be UTF-8 JSON whose numbers are finite (``1e400`` is not taken for infinity, nor
``NaN`` for a number), whose integers have at most 4300 digits (Python's own limit), nested at most
``MAX_DEPTH`` deep (100,000 ``[`` would exhaust the parser's recursion, and a merely deep value the
recursion of whatever reads it next), and whose top level is of the type the caller expects. Every failure
is one error of the caller's kind (``DataError``, ``CheckpointError``, ``ConfigError``) naming the file, and
the line for JSON lines; an operating system's resource error (permission denied, too many open files) is
``errors.os_error``'s.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

from ..errors import RESOURCE_ERRNOS, AttnmtError, os_error

MAX_DEPTH = 100
"""The deepest nesting of arrays and objects taken; attnmt's own files nest at most 4 deep."""

_NAMES = {dict: "a JSON object", list: "a JSON array", str: "a JSON string"}


def shown(path: os.PathLike | str) -> str:
    """``path`` as a message shows it: a NUL byte or a control character is escaped, not printed."""
    text = os.fspath(path)
    return text if text.isprintable() else repr(text)[1:-1]


def regular_bytes(path: os.PathLike | str, kind: type[AttnmtError]) -> bytes:
    """The bytes of the regular file ``path``; FileNotFoundError when it is not there (callers word it);
    ``kind`` naming the file when it is a folder, a pipe or a device, or its path holds a NUL byte."""
    name = shown(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except ValueError:  # "embedded null byte": no file has such a name
        raise kind(f"{name}: a path cannot hold a NUL byte") from None
    except OSError as e:
        raise _os_error(path, name, e, kind) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise kind(f"{name}: is a folder; expected a JSON file")
        if not stat.S_ISREG(mode):
            raise kind(f"{name}: not a regular file (a pipe or a device); this file is read from disk, "
                       "replace it with the file itself")
        with open(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError as e:
        raise _os_error(path, name, e, kind) from None
    finally:
        os.close(fd)


def _os_error(path, name: str, error: OSError, kind: type[AttnmtError]) -> AttnmtError:
    if error.errno in RESOURCE_ERRNOS:
        return os_error(name, error, "read")
    return kind(f"{name}: cannot read: {(error.strerror or type(error).__name__).lower()}")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is too large for a float")
    return value


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (walked without recursion), stopping past MAX_DEPTH."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= MAX_DEPTH:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(data: bytes | str, where: str, kind: type[AttnmtError], expect: type | None = dict) -> Any:
    """``data`` as JSON of the top-level type ``expect`` (None: any), or ``kind`` naming ``where``: the
    file, or ``file:line``."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as e:
        raise kind(f"{where}: invalid UTF-8 (byte {e.start + 1} is 0x{e.object[e.start]:02x})") from None
    try:
        value = json.loads(text, parse_float=_finite, parse_constant=_constant)
    except json.JSONDecodeError as e:
        at = f"column {e.colno}" if e.lineno == 1 else f"line {e.lineno}, column {e.colno}"
        raise kind(f"{where}: invalid JSON: {e.msg} at {at}") from None
    except RecursionError:
        raise kind(f"{where}: invalid JSON: nested more than {MAX_DEPTH} deep") from None
    except ValueError as e:  # an integer past 4300 digits; a float past 1.8e308; NaN or Infinity
        why = "an integer of more than 4300 digits" if "digits" in str(e) else str(e)[:120]
        raise kind(f"{where}: invalid JSON: {why}") from None
    if _depth(value) > MAX_DEPTH:
        raise kind(f"{where}: invalid JSON: nested more than {MAX_DEPTH} deep")
    if expect is not None and not isinstance(value, expect):
        raise kind(f"{where}: expected {_NAMES.get(expect, expect.__name__)} at the top, "
                   f"found {_kind_of(value)}")
    return value


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    return {dict: "an object", list: "an array", str: "a string"}.get(type(value), "a number")


def read_json(path: os.PathLike | str, kind: type[AttnmtError], expect: type | None = dict,
              missing: str | None = "not found") -> Any:
    """The JSON file ``path`` (``parse_json``, read by ``regular_bytes``); when it is not there, ``kind``
    with ``missing`` as the reason, or None when ``missing`` is None (an optional file)."""
    try:
        data = regular_bytes(path, kind)
    except FileNotFoundError:
        if missing is None:
            return None
        raise kind(f"{shown(path)}: {missing}") from None
    return parse_json(data, shown(path), kind, expect)


def read_json_lines(path: os.PathLike | str, kind: type[AttnmtError], expect: type | None = dict,
                    skip_bad: bool = False) -> list[Any]:
    """The records of a JSON-lines file (one value per line, blank lines left out), each ``parse_json``-ed
    with ``path:line`` in its error; ``skip_bad``: leave out a line that is not a record instead (the
    half-written last line of a run that was killed), never a file that is not a regular one.
    FileNotFoundError when it is not there."""
    records, name = [], shown(path)
    for number, line in enumerate(regular_bytes(path, kind).split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append(parse_json(line, f"{name}:{number}", kind, expect))
        except kind:
            if not skip_bad:
                raise
    return records

