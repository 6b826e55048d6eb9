"""Parallel text in: file pairs, TSV, JSONL, Hugging Face datasets or the generated toy task.

Every reader returns a ``ParallelText`` of cleaned (src, tgt) string pairs and the counts of what it dropped.
Lines are split on ``\\n`` only (a stray ``\\r``, ``\\x0b`` or U+2028 inside a line stays inside it, so
two files can't drift apart), decoded as strict UTF-8 and cleaned by one rule (``clean``).

Errors name the file and line: ``train.de has 1000 lines, train.en has 999``,
``train.de:17: invalid UTF-8 at byte offset 4``.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import sys
import unicodedata
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from ..config.jsonfile import parse_json
from ..config.schema import HfSource, JsonlSource, Source, TextSource, ToySource, TsvSource
from ..errors import DataError, os_error
from .toy import toy_pairs, unsegmented

# ------------------------------------------------------------------------------------------ cleaning

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SPACES = re.compile(r"\s+")


def clean(text: str) -> str:
    """NFC, ANSI colour codes removed, control characters (NUL, ESC, ...) turned into spaces, runs of
    whitespace collapsed to one space, stripped. Tabs count as whitespace. The result is NFC: normalised
    again at the end, since removing a code can bring together what composes (``e``, a code, U+0301)."""
    if text.isprintable():  # no control character, and no whitespace but the ASCII space: 3x faster
        return unicodedata.normalize("NFC", " ".join(text.split()))
    text = unicodedata.normalize("NFC", text)
    text = _ANSI.sub("", text)
    text = _CONTROL.sub(" ", text)
    return unicodedata.normalize("NFC", _SPACES.sub(" ", text).strip())


def drop_reason(src: str, tgt: str) -> str | None:
    """Why a cleaned pair is dropped (an empty side), or None when it is kept."""
    if src and tgt:
        return None
    return "empty" if not src and not tgt else ("empty source" if not src else "empty target")


@dataclass
class ParallelText:
    """Cleaned parallel sentences and what cleaning dropped."""

    name: str
    src: list[str] = field(default_factory=list)
    tgt: list[str] = field(default_factory=list)
    read: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    alignments: list[str] | None = None
    """Gold word alignments (Pharaoh ``i-j`` sure, ``i?j`` possible), known for the toy task only."""
    lines: list[int] = field(default_factory=list)
    """The line (or row) each kept pair was read from, counting from 1."""

    def add(self, src: str, tgt: str, line: int) -> None:
        self.read += 1
        src, tgt = clean(src), clean(tgt)
        reason = drop_reason(src, tgt)
        if reason is not None:
            self.dropped[reason] = self.dropped.get(reason, 0) + 1
            return
        self.src.append(src)
        self.tgt.append(tgt)
        self.lines.append(line)

    def __len__(self) -> int:
        return len(self.src)


# ------------------------------------------------------------------------------------------ readers


def read_corpus(source: Source, name: str) -> ParallelText:
    """Read and clean one split (``name`` is ``train``, ``dev`` or ``test``, used in messages)."""
    corpus = ParallelText(name)
    if isinstance(source, ToySource):
        corpus.alignments = []
    for src, tgt, line, alignment in raw_pairs(source, name):
        corpus.add(src, tgt, line)
        if alignment is not None:
            corpus.alignments.append(alignment)
    return corpus


RawPair = tuple[str, str, int, "str | None"]
"""(source, target, line or row from 1, gold alignment) as read, before cleaning."""


def raw_pairs(source: Source, name: str) -> Iterator[RawPair]:
    """The pairs of one split as they are read, uncleaned, one at a time (``read_corpus`` cleans them; a
    streamed prepare cleans them in chunks). A DataError at the end if there were none."""
    readers = {TextSource: _read_text, TsvSource: _read_tsv, JsonlSource: _read_jsonl, HfSource: _read_hf,
               ToySource: _read_toy}
    read = 0
    for pair in readers[type(source)](source, name):
        read += 1
        yield pair
    if read == 0:
        raise DataError(f"{name}: the corpus is empty ({describe_source(source)})")


def describe_source(source: Source | list[Source]) -> str:
    """The pairs' origin in a few words, each path as short as it is true (``a/../x`` is ``x``); of a
    list of corpora, each's, joined by " + "."""
    if isinstance(source, list):
        return " + ".join(describe_source(s) for s in source)
    if isinstance(source, TextSource):
        return f"{_shown(source.src)}, {_shown(source.tgt)}"
    if isinstance(source, (TsvSource, JsonlSource)):
        return _shown(source.path)
    if isinstance(source, HfSource):
        return f"Hugging Face dataset {source.name}, split {source.split}"
    return f"toy {source.split}"


def _shown(path: Path | str) -> str:
    return str(path) if str(path) == "-" else os.path.normpath(str(path))


def read_lines(path: Path | str) -> Iterator[str]:
    """Decoded lines of a plain or gzipped UTF-8 file, split on ``\\n`` only, without the ``\\n``; a byte
    order mark at the start of the file (Windows tools write one) is not part of the first line. ``-`` is
    standard input; a pipe (``<(...)``, ``/dev/stdin``) is read as it comes, whatever arrives first."""
    name = STDIN_NAME if str(path) == "-" else str(path)
    for number, raw in enumerate(_raw_lines(path), start=1):
        bom = 3 if number == 1 and raw.startswith(b"\xef\xbb\xbf") else 0
        try:
            yield raw[bom:].decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{name}:{number}: invalid UTF-8 at byte offset {e.start + bom}") from None


STDIN_NAME = "<stdin>"


def is_regular_file(path: Path | str) -> bool:
    """A file that can be read twice: not stdin (``-``), a pipe or a device."""
    try:
        return str(path) != "-" and stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def count_lines(path: Path | str) -> int | None:
    """Lines as ``read_lines`` yields them: the number of ``\\n`` bytes, plus one for a last line without
    one; None for stdin, a pipe or a device, whose lines can be read only once."""
    if not is_regular_file(path):
        return None
    return sum(1 for _ in _raw_lines(path))


def _raw_lines(path: Path | str) -> Iterator[bytes]:
    name = STDIN_NAME if str(path) == "-" else str(path)
    with _open(path) as handle:
        tail = b""
        while True:
            try:
                chunk = handle.read1(1 << 20)  # what has arrived, up to 1 MiB: a pipe is never waited on
            except (OSError, EOFError, zlib.error) as e:
                raise DataError(f"{name}: cannot read: {e}") from None
            if not chunk:
                break
            parts = (tail + chunk).split(b"\n")
            tail = parts.pop()
            yield from parts
        if tail:
            yield tail


@contextmanager
def _open(path: Path | str) -> Iterator[io.BufferedIOBase]:
    """The bytes of ``path`` (``-``: stdin, left open), gunzipped when they start with gzip's magic; the
    magic is peeked at in the buffer, so pipes work as files do."""
    own = True
    if str(path) == "-":
        handle, own = _stdin()
        name = STDIN_NAME
    else:
        name = str(path)
        try:
            handle = open(path, "rb")
        except FileNotFoundError:
            raise DataError(f"{path}: file not found") from None
        except IsADirectoryError:
            raise DataError(f"{path}: is a directory, not a file") from None
        except OSError as e:
            raise os_error(path, e, "open", user_input=True) from None
    # stdin may be a stream without a read buffer to peek into (a test harness's BytesIO)
    stream = handle if hasattr(handle, "peek") else io.BufferedReader(handle)
    try:
        try:
            head = stream.peek(2)[:2]
            if head == GZIP_MAGIC[:1]:  # a pipe that has delivered one byte so far: read the second
                stream = io.BufferedReader(_Replay(stream.read(2), stream))
                head = stream.peek(2)[:2]
        except OSError as e:
            raise os_error(name, e, "read", user_input=True) from None
        yield gzip.GzipFile(fileobj=stream, mode="rb") if head == GZIP_MAGIC else stream
    finally:
        if own:
            handle.close()


def _stdin() -> tuple[io.BufferedIOBase, bool]:
    """Standard input's bytes through a descriptor of our own (and True: the caller closes it). A reader
    thread blocked in a read holds its stream's lock, and the interpreter's shutdown closes
    ``sys.stdin``: Ctrl-C while ``translate -i -`` waited for a line aborted the process ("could not
    acquire lock for <stdin> at interpreter shutdown") when the two met. A stdin without a descriptor
    (a test harness's) is read as it is."""
    try:
        fd = sys.stdin.buffer.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.stdin.buffer, False
    return open(os.dup(fd), "rb"), True  # noqa: SIM115 - closed by _open


GZIP_MAGIC = b"\x1f\x8b"


class _Replay(io.RawIOBase):
    """A stream whose first bytes (``head``) were already read from ``rest``, and then the rest of it."""

    def __init__(self, head: bytes, rest: io.BufferedIOBase) -> None:
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.head[:len(buffer)] if self.head else self.rest.read1(len(buffer))
        self.head = self.head[len(data):]
        buffer[:len(data)] = data
        return len(data)


def _read_text(source: TextSource, name: str) -> Iterator[RawPair]:
    n_src, n_tgt = count_lines(source.src), count_lines(source.tgt)
    if n_src is not None and n_tgt is not None and n_src != n_tgt:
        raise DataError(f"{name}: {source.src} has {n_src} lines, {source.tgt} has {n_tgt}")
    # A pipe is read once: its lines are counted as they are read (the counts agree for regular files).
    counts = [0, 0]
    for line, (src, tgt) in enumerate(zip_longest(read_lines(source.src), read_lines(source.tgt)), start=1):
        counts[0] += src is not None
        counts[1] += tgt is not None
        if src is not None and tgt is not None:
            yield src, tgt, line, None
    if counts[0] != counts[1]:
        raise DataError(f"{name}: {source.src} has {counts[0]} lines, {source.tgt} has {counts[1]}")


def _read_tsv(source: TsvSource, name: str) -> Iterator[RawPair]:
    need = max(source.src_column, source.tgt_column) + 1
    for line, text in enumerate(read_lines(source.path), start=1):
        if not text.strip():
            yield "", "", line, None
            continue
        columns = text.split("\t")
        if len(columns) < need:
            raise DataError(f"{source.path}:{line}: expected at least {need} tab-separated columns, "
                            f"found {len(columns)}")
        yield columns[source.src_column], columns[source.tgt_column], line, None


def _read_jsonl(source: JsonlSource, name: str) -> Iterator[RawPair]:
    for line, text in enumerate(read_lines(source.path), start=1):
        if not text.strip():
            yield "", "", line, None
            continue
        record = parse_json(text, f"{source.path}:{line}", DataError, expect=None)
        where = f"{source.path}:{line}"
        yield _field(record, source.src_field, where), _field(record, source.tgt_field, where), line, None


def _field(record: object, dotted: str, where: str) -> str:
    """``record["translation"]["de"]`` for ``dotted = "translation.de"``; None counts as empty."""
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            keys = sorted(value) if isinstance(value, dict) else []
            hint = f" (keys here: {', '.join(map(str, keys))})".translate(_LINE_BREAKS) if keys else ""
            raise DataError(f"{where}: no field {dotted!r}{hint}")
        value = value[part]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field {dotted!r} is a {type(value).__name__}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # JSON's "\ud800": a lone surrogate, which is no character
        raise DataError(f"{where}: field {dotted!r} holds a lone surrogate "
                        f"(U+{ord(value[e.start]):04X}) at character {e.start}, which is not text") from None
    return value


# What str.splitlines() (and a terminal) breaks a line at: escaped where a message shows the data's keys.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


def _read_hf(source: HfSource, name: str) -> Iterator[RawPair]:
    import datasets  # heavy: imported only when a Hugging Face source is read

    datasets.disable_progress_bars()

    files = source.data_files
    data_files = [str(p) for p in files] if isinstance(files, list) else (str(files) if files else None)
    for path in [files] if isinstance(files, Path) else (files or []):
        if not Path(path).exists():
            raise DataError(f"{name}: {path}: file not found")
    try:
        dataset = datasets.load_dataset(source.name, source.config_name, data_files=data_files,
                                        split=source.split)
    except ValueError as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{name}: Hugging Face dataset {source.name!r}: {message}") from None
    except (FileNotFoundError, ConnectionError, OSError) as e:
        offline = (" (offline: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are set or there is no network)"
                   if _offline() else "")
        raise DataError(f"{name}: cannot load Hugging Face dataset {source.name!r}{offline}: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except Exception as e:  # datasets raises many private types (DatasetNotFoundError, ...)
        raise DataError(f"{name}: cannot load Hugging Face dataset {source.name!r}: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}") from None
    top_src, top_tgt = source.src_field.split(".")[0], source.tgt_field.split(".")[0]
    for top in (top_src, top_tgt):
        if top not in dataset.column_names:
            raise DataError(f"{name}: Hugging Face dataset {source.name!r} has no field {top!r} "
                            f"(fields: {', '.join(dataset.column_names)})")
    for row, record in enumerate(dataset.select_columns(sorted({top_src, top_tgt})), start=1):
        where = f"{source.name} ({source.split}) row {row}"
        yield _field(record, source.src_field, where), _field(record, source.tgt_field, where), row, None


def _offline() -> bool:
    import os

    return any(os.environ.get(v, "").lower() in ("1", "true", "yes")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _read_toy(source: ToySource, name: str) -> Iterator[RawPair]:
    pairs = toy_pairs(source.split, source.size, source.seed, source.lang)
    for line, (src, tgt, alignment) in enumerate(pairs, start=1):
        yield src, unsegmented(tgt, source.lang), line, alignment
