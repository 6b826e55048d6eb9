"""Sequence-level knowledge distillation (Kim and Rush 2016, section 3.2): a teacher's beam translations of a
student's training sources, streamed into the student's run folder, that the student then trains on.

```
RUN/distilled/
  distill.json           what the corpus is made from, written before its first line: the teacher's checkpoint
                         (and each ensemble member's) with its sha256, the decode settings that change an
                         output, each training corpus as configured with its files' sizes and times; and which
                         corpora are complete
  train.src, train.tgt   corpus N of several: train.N.src, train.N.tgt; one line per pair read from the
                         corpus, in order: its source, cleaned (``readers.clean``), and the teacher's best
                         translation of it (an empty line for an empty source)
```

Every pair read gives one line in both files, whatever it holds: an empty source gives an empty translation,
and the student's ``prepare`` drops that pair as it drops any empty one, and filters the rest by length
as pairs, so the two sides never drift apart.

Resumable: the lines go out a chunk (``CHUNK_LINES``) at a time, the source file's then the target file's,
each flushed and fsynced. A run that is stopped (Ctrl-C, a kill, a full disk) leaves what it wrote; the
next one cuts both files back to the last chunk that both hold whole (a half-written line, or a chunk
only the source file got, is dropped and translated again), so a resumed corpus is the one an
uninterrupted run writes, batch for batch, and goes on from there. A corpus marked complete in the record
is never translated again. A rerun whose teacher, decode settings or corpora differ from the record's is
refused, naming what changed, rather than mixing two teachers in one corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from ..config.jsonfile import read_json
from ..config.schema import Config, DataConfig, TextSource, config_from_dict
from ..data.arrival import chunks
from ..data.readers import clean, raw_pairs
from ..errors import ConfigError, DataError, os_error
from ..runfiles import atomic_write_text
from .translator import Translator

RECORD = "distill.json"
# Lines translated and written at a time: the most a stop loses, and the batches' pool (the translator
# sorts a chunk by length before it cuts batches, so larger chunks pad less).
CHUNK_LINES = 1000
# The decode settings that change what the teacher outputs (``decode.max_tokens`` only batches).
OUTPUT_SETTINGS = ("beam_size", "length_penalty", "min_len", "max_len_a", "max_len_b", "max_src_len")
# What a corpus's translations do not depend on: it is distilled once whatever its share or tag.
TRAINING_ONLY = {"weight", "tag"}


@dataclass(frozen=True)
class Teacher:
    """The model that translates and what the record knows it by."""

    translator: Translator
    """Its translator: the decode settings (with the command line's overrides) and, for an ensemble, the
    members averaged step by step."""
    data: DataConfig
    """The teacher's own data section: a multilingual teacher is asked for each corpus's target language."""
    models: tuple[Path, ...]
    """Its checkpoint (or CTranslate2 export folder), then each ensemble member's."""


@dataclass(frozen=True)
class Distilled:
    """One training corpus distilled: where, how many lines, and how many this call translated."""

    key: str
    source: TextSource
    lines: int
    translated: int


def distilled_sources(data: DataConfig, folder: Path) -> list[TextSource]:
    """The distilled twin of each training corpus of ``data``: its files in ``folder``, the languages, weight
    and tag of the corpus it comes from."""
    corpora = data.corpora()
    if not corpora:
        raise ConfigError("data.train: required to distill (the student config names no training corpus)")
    twins = []
    for i, corpus in enumerate(corpora):
        stem = "train" if len(corpora) == 1 else f"train.{i}"
        twins.append(TextSource(src=folder / f"{stem}.src", tgt=folder / f"{stem}.tgt",
                                src_lang=corpus.src_lang, tgt_lang=corpus.tgt_lang, weight=corpus.weight,
                                tag=corpus.tag))
    return twins


def student_config(cfg: Config, folder: Path, keep_original: bool = False,
                   source: str = "<config>") -> Config:
    """``cfg`` with ``data.train`` replaced by the distilled corpora in ``folder`` (``keep_original``:
    followed by the original corpora), checked as a config file is (``source``: how its messages name it)."""
    data = cfg.to_dict()
    twins = [twin.model_dump(mode="json") for twin in distilled_sources(cfg.data, folder)]
    original = [corpus.model_dump(mode="json") for corpus in cfg.data.corpora()]
    if keep_original:
        data["data"]["train"] = twins + original
    else:
        data["data"]["train"] = twins if len(twins) > 1 else twins[0]
    return config_from_dict(data, source=source)


def distill(teacher: Teacher, data: DataConfig, folder: Path, chunk_lines: int | None = None,
            on_chunk: Callable[[int], None] | None = None) -> list[Distilled]:
    """Translate every training corpus of ``data`` with ``teacher`` into ``folder`` (the module docstring's
    layout), going on from what an earlier call wrote, ``chunk_lines`` (default ``CHUNK_LINES``) at a time;
    ``on_chunk(lines)`` after each chunk written. A ConfigError naming what changed when ``folder`` was
    started with another teacher, other decode settings or other corpora."""
    chunk_lines = chunk_lines or CHUNK_LINES
    record = _record(teacher, data)
    stored = _read_record(folder, data)
    if stored is not None:
        _check_same(stored, record, folder)
        record["done"] = stored.get("done", record["done"])
    else:
        _write_record(folder, record)
    twins = distilled_sources(data, folder)
    results = []
    for i, (key, corpus, twin) in enumerate(zip(data.corpus_keys(), data.corpora(), twins, strict=True)):
        start = _resume(twin, chunk_lines, done=record["done"][i])
        translated = 0
        if not record["done"][i]:
            translator = _asked_for(teacher, corpus.tgt_lang or data.tgt_lang, key)
            sources = (clean(src) for src, _, _, _ in islice(raw_pairs(corpus, key), start, None))
            translated = _append(translator, sources, twin, chunk_lines, on_chunk)
            record["done"][i] = True
            _write_record(folder, record)
        results.append(Distilled(key, twin, start + translated, translated))
    return results


def _asked_for(teacher: Teacher, lang: str, key: str) -> Translator:
    """The teacher's translator asked for ``lang``: a multilingual teacher's source prefix (``<2xx>``); a
    teacher of one target language as it is."""
    translator = teacher.translator
    if teacher.data.multilingual:
        translator.source_prefix = teacher.data.prefix_for(lang, f"{key} (its tgt_lang)")
    return translator


def _append(translator: Translator, sources: Iterator[str], twin: TextSource, chunk_lines: int,
            on_chunk: Callable[[int], None] | None) -> int:
    """Translate ``sources`` a chunk at a time onto the ends of ``twin``'s files; the lines written."""
    written = 0
    try:
        src_file, tgt_file = open(twin.src, "ab"), open(twin.tgt, "ab")  # noqa: SIM115 - closed below
    except OSError as e:
        raise os_error(twin.src.parent, e) from None
    with src_file, tgt_file:
        for chunk in chunks(sources, chunk_lines):
            outputs = [clean(t.outputs[0][0]) for t in translator.translate(chunk)]  # no line break inside
            _write(src_file, twin.src, "".join(line + "\n" for line in chunk))
            _write(tgt_file, twin.tgt, "".join(line + "\n" for line in outputs))
            written += len(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return written


def _write(handle, path: Path, text: str) -> None:
    try:
        handle.write(text.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())
    except OSError as e:
        raise os_error(path, e) from None


# ------------------------------------------------------------------------------------- resuming


def _resume(twin: TextSource, chunk_lines: int, done: bool) -> int:
    """The pairs both of ``twin``'s files hold whole, in whole chunks (a complete corpus: all of them);
    both files cut back to that many lines (new ones made empty)."""
    counts = [_count_lines(path) for path in (twin.src, twin.tgt)]
    lines = min(counts)
    if done:
        if counts[0] != counts[1] or not (twin.src.is_file() and twin.tgt.is_file()):
            raise DataError(f"{twin.src}: {counts[0]} lines, {twin.tgt}: {counts[1]} (or missing), but "
                            f"{RECORD} marks the corpus complete; distill into another --run-dir")
        return lines
    lines -= lines % chunk_lines
    for path in (twin.src, twin.tgt):
        try:
            with open(path, "ab") as handle:
                handle.truncate(_line_end(path, lines))
        except OSError as e:
            raise os_error(path, e) from None
    return lines


def _count_lines(path: Path) -> int:
    """Complete lines (ended by ``\\n``) of ``path``; 0 when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise os_error(path, e, "read") from None


def _line_end(path: Path, lines: int) -> int:
    """The byte offset just past line ``lines`` of ``path`` (which holds at least that many)."""
    offset = seen = 0
    if lines == 0:
        return 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            count = block.count(b"\n")
            if seen + count >= lines:
                end = -1
                for _ in range(lines - seen):
                    end = block.index(b"\n", end + 1)
                return offset + end + 1
            seen, offset = seen + count, offset + len(block)
    raise AssertionError(f"{path} holds fewer than {lines} lines")


# ---------------------------------------------------------------------------------------- the record


def _record(teacher: Teacher, data: DataConfig) -> dict[str, Any]:
    """What the distilled corpus is made from (the module docstring), none of its corpora complete yet."""
    decode = teacher.translator.decode
    corpora = [{"corpus": {k: v for k, v in corpus.model_dump(mode="json").items() if k not in TRAINING_ONLY},
                "files": _file_stats(corpus)} for corpus in data.corpora()]
    return {"teacher": [{"path": str(path), "sha256": _sha256(path)} for path in teacher.models],
            "decode": {name: getattr(decode, name) for name in OUTPUT_SETTINGS},
            "corpora": corpora, "done": [False] * len(corpora)}


def _file_stats(corpus: Any) -> dict[str, list[int] | None]:
    """Each file a corpus names (a path of its config), with its size and modification time (None for a
    pipe, or a file that is not there: reading it will say)."""
    found: dict[str, list[int] | None] = {}
    for _, value in corpus:  # a pydantic model yields (key, value)
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, Path):
                try:
                    info = os.stat(path)
                    found[str(path)] = [info.st_size, info.st_mtime_ns] if os.path.isfile(path) else None
                except OSError:
                    found[str(path)] = None
    return found


def _sha256(path: Path) -> str:
    """A checkpoint file's sha256, or of an export folder's files (their names and contents)."""
    digest = hashlib.sha256()
    try:
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                digest.update(f"{file.relative_to(path).as_posix()}\0{_sha256(file)}\n".encode())
            return digest.hexdigest()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise os_error(path, e, "read") from None
    return digest.hexdigest()


def _read_record(folder: Path, data: DataConfig) -> dict[str, Any] | None:
    """The record of ``folder``, or None for a new corpus; a ConfigError for a folder that holds distilled
    files without one (not this command's to append to)."""
    path = folder / RECORD
    if path.exists() or path.is_symlink():  # a pipe or a folder there is read_json's one line, not absent
        record = read_json(path, DataError)
        done, corpora = record.get("done"), record.get("corpora")
        if not (isinstance(done, list) and isinstance(corpora, list) and len(done) == len(corpora)
                and all(isinstance(d, bool) for d in done)):
            raise DataError(f"{path}: not a record of distilled corpora (which are complete is unreadable)")
        return record
    strays = [p for twin in distilled_sources(data, folder) for p in (twin.src, twin.tgt) if p.exists()]
    if strays:
        raise ConfigError(f"{strays[0]}: distilled lines without their record ({path}); distill into "
                          "another --run-dir")
    return None


def _write_record(folder: Path, record: dict[str, Any]) -> None:
    atomic_write_text(folder / RECORD, json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def _check_same(stored: dict[str, Any], record: dict[str, Any], folder: Path) -> None:
    """A ConfigError naming the first of the teacher, the decode settings and the corpora that differs."""
    where = f"{folder} was started"
    then = [m.get("sha256") for m in stored.get("teacher", [])]
    if then != [m["sha256"] for m in record["teacher"]]:
        was = ", ".join(m.get("path", "?") for m in stored.get("teacher", []))
        now = ", ".join(m["path"] for m in record["teacher"])
        raise ConfigError(f"the teacher changed: {where} with {was}, whose sha256 differs from {now}'s; give "
                          "that teacher, or distill into another --run-dir")
    for name in OUTPUT_SETTINGS:
        before, after = stored.get("decode", {}).get(name), record["decode"][name]
        if before != after:
            option = "--beam-size" if name == "beam_size" else f"decode.{name}"
            raise ConfigError(f"the decode settings changed: {where} with {option} {before}, now {after}; "
                              "set it back, or distill into another --run-dir")
    old, new = stored.get("corpora", []), record["corpora"]
    for i, (before, after) in enumerate(zip(old, new, strict=False)):
        key = "data.train" if len(new) == 1 else f"data.train.{i}"
        if before.get("corpus") != after["corpus"]:
            raise ConfigError(f"{key} changed: {where} from another corpus; set it back, or distill into "
                              "another --run-dir")
        for path, stats in after["files"].items():
            if before.get("files", {}).get(path) != stats:
                raise ConfigError(f"{key}: {path} changed (its size or time) since {where}; set it back, "
                                  "or distill into another --run-dir")
    if len(old) != len(new):
        raise ConfigError(f"data.train changed: {where} from {len(old)} corpora, it lists {len(new)} now; "
                          "set it back, or distill into another --run-dir")
