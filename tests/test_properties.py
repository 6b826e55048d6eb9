"""Property-based tests (hypothesis): whatever a config, a corpus, an alignment file or a checkpoint holds,
attnmt reads it or refuses it with its own error, of one line, and nothing else (docs/RELIABILITY.md).

- Configs: the shipped configs with keys deleted, renamed, added, retyped or set out of range, random YAML
  documents, random text and bytes: ``load_config`` returns a config or raises a one-line ConfigError;
  ``attnmt info CONFIG`` on a few of them exits 0 or 2 with one error line.
- Corpora: random bytes, lines, TSV and JSONL rows of any Unicode are read exactly as the documented rule
  says (an independent oracle here), or refused with a one-line DataError; kept text is NFC and clean.
- Alignments: random Pharaoh lines parse to the links an ASCII oracle reads, or to one error; AER,
  precision, recall and the symmetrization heuristics keep their algebraic properties.
- Checkpoints: a real checkpoint with bytes flipped or cut short loads to exactly the intact weights and
  config, or is a CheckpointError; a payload with a key removed or retyped is loaded or refused with
  exit 4; a few damaged files go through a subprocess to show the interpreter survives; a pickle that
  runs code is refused with exit 4 and never runs.

Every test runs a fixed, derandomized budget (``budget``), so CI sees the same examples every time; the
failing inputs found while writing these tests are kept as ``@example``s.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import re
import shutil
import tempfile
import unicodedata
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml
from helpers import CONFIGS, assert_one_error_line, run_attnmt
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.describe import _models_in
from attnmt.config.schema import Config, JsonlSource, TextSource, TsvSource, load_config
from attnmt.data.readers import clean, read_corpus
from attnmt.errors import CheckpointError, ConfigError, DataError
from attnmt.insight.links import SYMMETRIZATIONS, alignment_scores, parse_pharaoh, read_gold, symmetrize
from attnmt.models.checkpoint import load_checkpoint, load_model, read_pointer
from attnmt.runfiles import RunDir


def budget(examples: int) -> settings:
    """A fixed number of derandomized examples, no deadline (two slow cores), no example database."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


@contextmanager
def scratch():
    """A fresh folder per example (pytest's tmp_path is per test, not per hypothesis example)."""
    folder = Path(tempfile.mkdtemp(prefix="attnmt-prop-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def one_line(error: Exception) -> str:
    """An error's message: non-empty, and one line however a terminal or ``str.splitlines`` reads it."""
    message = str(error)
    assert message and len(message.splitlines()) == 1 and "\n" not in message, repr(message)
    return message


# -------------------------------------------------------------------------------------------- configs

SHIPPED = {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(CONFIGS.glob("*.yaml"))}


def _schema_keys(model: type = Config, seen: set | None = None) -> list[str]:
    """Every field name in the config schema (to add known keys with wrong values)."""
    seen = set() if seen is None else seen
    keys: list[str] = []
    for name, field in model.model_fields.items():
        keys.append(name)
        for sub in _models_in(field.annotation):
            if sub not in seen:
                seen.add(sub)
                keys += _schema_keys(sub, seen)
    return sorted(set(keys))


SCHEMA_KEYS = _schema_keys()
WORDS = ["transformer", "lstm", "toy", "tsv", "jsonl", "hf", "text", "train", "dev", "test", "cpu", "cuda",
         "auto", "bpe", "unigram", "relu", "sparse", "bleu", "zh", "de", "en", "no", "010", "1e-3", "", " ",
         "~nosuchuser/x", "~/x", "a\x00b", "a\nb", "a\rb", "a\u2028b", ".nan", "null"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                    st.sampled_from(WORDS))
SMALL_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 64), st.floats(-2, 64),
                          st.text(max_size=8), st.sampled_from(WORDS))


def _nested(scalars):
    keys = st.text(max_size=8) | st.sampled_from(SCHEMA_KEYS)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(keys, inner, max_size=3), max_leaves=8)


VALUES, SMALL_VALUES = _nested(SCALARS), _nested(SMALL_SCALARS)
OUT_OF_RANGE = [-1, 0, -0.5, 0.0, 5e-324, -(10**9), 10**20, 2**63, 10**400, 1e308, -1e308,
                math.nan, math.inf, -math.inf]
SMALL_OUT_OF_RANGE = [-1, 0, -0.5, 0.0, 5e-324, 1.5, math.nan, math.inf, -math.inf]
EDITS = ("delete", "rename", "add", "retype", "convert", "out_of_range")


def _paths(node, prefix=()):
    """Every key path (dict keys and list indices) under ``node``."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _at(doc, path):
    for part in path:
        doc = doc[part]
    return doc


def _convert(value, kind: str):
    """``value`` as another type: int <-> str <-> list <-> bool <-> float <-> null <-> mapping."""
    if kind in ("int", "float"):
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else 3
        if isinstance(number, float) and not math.isfinite(number):
            number = 3
        try:
            return int(number) if kind == "int" else float(number) + 0.5
        except OverflowError:  # an int too large for a float
            return 1e308
    return {"str": str(value), "list": [value], "bool": bool(value), "null": None,
            "dict": {"value": value}}[kind]


@st.composite
def edited_config(draw, small: bool = False, edits: tuple[int, int] = (1, 3)):
    """A shipped config with some random edits; ``small`` keeps numbers small enough to build the model."""
    name = draw(st.sampled_from(sorted(SHIPPED)))
    doc = copy.deepcopy(SHIPPED[name])
    values, out_of_range = (SMALL_VALUES, SMALL_OUT_OF_RANGE) if small else (VALUES, OUT_OF_RANGE)
    for _ in range(draw(st.integers(*edits))):
        paths = list(_paths(doc))
        edit = draw(st.sampled_from(EDITS))
        if edit == "add":
            sections = [p for p in [(), *paths] if isinstance(_at(doc, p), dict)]
            if not sections:
                continue
            section = _at(doc, draw(st.sampled_from(sections)))
            section[draw(st.sampled_from(SCHEMA_KEYS))] = draw(values)
            continue
        if not paths:
            doc = draw(values)
            break
        path = draw(st.sampled_from(paths))
        parent, key = _at(doc, path[:-1]), path[-1]
        if edit == "delete":
            del parent[key]
        elif edit == "rename" and isinstance(parent, dict):
            typo = draw(st.sampled_from(["drop", "double", "case", "random"]))
            word = str(key)
            i = draw(st.integers(0, max(len(word) - 1, 0)))
            new = {"drop": word[:i] + word[i + 1:], "double": word[:i] + word[i:i + 1] * 2 + word[i + 1:],
                   "case": word.upper(), "random": draw(st.text(max_size=10))}[typo]
            parent[new] = parent.pop(key)
        elif edit == "convert":
            parent[key] = _convert(parent[key], draw(st.sampled_from(
                ["int", "float", "str", "list", "bool", "null", "dict"])))
        elif edit == "out_of_range":
            parent[key] = draw(st.sampled_from(out_of_range))
        else:  # retype: any value in its place
            parent[key] = draw(values)
    return name, doc


def dump(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


def load_outcome(content: str | bytes, name: str = "config.yaml") -> str:
    """``load_config`` of a file holding ``content``: "ok", or the one-line ConfigError's message. Any other
    exception fails the test."""
    with scratch() as folder:
        path = folder / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        try:
            load_config(path)
        except ConfigError as e:
            event("ConfigError")
            return one_line(e)
        event("loaded")
        return "ok"


def _edit(name: str, *changes: tuple[str, object]) -> tuple[str, dict]:
    """A shipped config with dotted keys set (for the explicit examples)."""
    doc = copy.deepcopy(SHIPPED[name])
    for dotted, value in changes:
        *parents, last = dotted.split(".")
        _at(doc, parents)[last] = value
    return name, doc


@budget(250)
@given(edited_config())
@example(_edit("toy_transformer.yaml", ("train.run_dir", "~nosuchuser/runs")))  # pathlib's RuntimeError
@example(_edit("toy_lstm.yaml", ("model.d_model", 10**400)))
@example(_edit("toy_transformer.yaml", ("model.n_heads", 0), ("decode.nbest", 9)))
@example(_edit("toy_transformer.yaml", ("model.n\rheads", 4)))  # a line break in a key the message names
def test_edited_shipped_configs_load_or_raise_one_config_error(case):
    _, doc = case
    load_outcome(dump(doc))


def test_shipped_configs_load():
    """The baseline of the property above: unedited (and dumped again), every shipped config loads."""
    with scratch() as folder:
        for name, doc in SHIPPED.items():
            (folder / name).write_text(dump(doc), encoding="utf-8")
            load_config(folder / name)


# YAML syntax in pieces, so that random documents reach tags, anchors, flow and block styles, directives.
FRAGMENTS = ["{", "}", "[", "]", ", ", ": ", "- ", "? ", "\n", "\n  ", "  ", "\t", "# c", "'", '"',
             "!!float ", "!!int ", "!!bool ", "!!str ", "!!binary ", "!!timestamp ", "!!set ", "!!map ",
             "!!seq ", "!!null ", "!!python/object:os.system ", "!local ", "&a ", "*a", "<<: ", "---\n",
             "...\n", "%YAML 1.2\n", "|\n", ">\n", "data", "model", "arch", "transformer", "train", "lr",
             "1e-3", "010", "0x1F", "0o17", ".nan", ".inf", "-.inf", "true", "no", "~", "null", "1:30",
             "2019-01-01", "9" * 60, "abc", "x", "\x00", "\ufeff", "\r", "\x85", "\u2028", "é"]
YAML_SOUP = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=30).map("".join)


@budget(400)
@given(st.one_of(_nested(SCALARS).map(dump), st.text(), YAML_SOUP, st.binary().map(bytes)))
@example("? [a, b]\n: 1\n")  # an unhashable key: TypeError
@example("{ {a: 1}: 2 }\n")
@example("lr: !!float abc\n")  # a tagged scalar its constructor cannot read: ValueError, KeyError, ...
@example("x: !!int abc\n")
@example("x: !!bool maybe\n")
@example("x: !!timestamp xyz\n")
@example("x: " + "9" * 5000 + "\n")  # past Python's 4300-digit limit of int()
@example("[" * 5000 + "]" * 5000)  # RecursionError in PyYAML's composer
@example("{a: " * 3000 + "1" + "}" * 3000)
@example("a: \x00\n")  # PyYAML's ReaderError, whose text has two lines
@example("a\u2028b: 1\n")  # an unknown key with a line separator in it
@example(b"\xff\xfe")
def test_random_documents_load_or_raise_one_config_error(content):
    load_outcome(content)


@budget(200)
@given(st.text(max_size=40), st.text(max_size=40) | YAML_SOUP)
@example("train.lr", "!!float abc")
@example("train.run_dir", "~nosuchuser/x")
@example("model.d_model", "[" * 3000)
def test_random_overrides_load_or_raise_one_config_error(key, value):
    """``--set KEY=VALUE`` goes through the same reader; a bad one is a ConfigError too."""
    with scratch() as folder:
        path = folder / "toy.yaml"
        path.write_text(dump(SHIPPED["toy_transformer.yaml"]), encoding="utf-8")
        try:
            load_config(path, [f"{key}={value}"])
        except ConfigError as e:
            one_line(e)


@budget(10)
@given(edited_config(small=True, edits=(0, 2)))
@example(_edit("toy_lstm.yaml"))
@example(_edit("toy_transformer.yaml", ("train.run_dir", "~nosuchuser/runs")))
def test_info_on_edited_configs_exits_0_or_2_with_one_error_line(case):
    """Through the command line (in-process, CliRunner): ``attnmt info CONFIG`` loads the config and builds
    the model (numbers are kept small so that it is quick)."""
    _, doc = case
    with scratch() as folder:
        path = folder / "edited.yaml"
        path.write_text(dump(doc), encoding="utf-8")
        result = CliRunner().invoke(app, ["info", str(path)])
    assert result.exit_code in (0, 2), (result.exit_code, result.output)
    event(f"exit {result.exit_code}")
    if result.exit_code == 2:
        assert_one_error_line(result.stderr)


# -------------------------------------------------------------------------------------------- corpora

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
ANSI_CODES = ["\x1b[0m", "\x1b[31m", "\x1b[1;32m", "\x1b[m", "\x1b[", "\x1b"]
# Pieces that interact with the rules: combining marks (U+0301 ccc 230, U+0316 ccc 220), Hangul jamo that
# compose, characters whose NFC differs (U+212B ANGSTROM SIGN, U+2000), whitespace and line-like separators
# that are not "\n", controls, a byte order mark, astral characters.
PIECES = ["e", "A", "m", "0", ";", "[", " ", "  ", "\t", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028",
          "\u00a0", "\u3000", "\ufeff", "\x00", "\x07", "\x7f", "\x9b", "\u0301", "\u0316", "\u0308",
          "\u1100", "\u1161", "\u212b", "\u2000", "\u00e9", "東", "😀", "\U000e0001", "\U0010fffd"]
ANY_CHARACTER = st.characters(exclude_categories=())  # every plane, surrogates and controls included
LINE_TEXT = st.lists(st.sampled_from(PIECES + ANSI_CODES) | ANY_CHARACTER, max_size=12).map("".join)


def oracle_clean(text: str) -> str | None:
    """The documented rule, written independently of ``data.clean`` for text without ESC: controls become
    spaces, NFC, whitespace runs collapse to one space, stripped (controls and whitespace are starters that
    never compose, so the order of these steps does not matter). With ESC (ANSI codes) there is no oracle
    here; ``assert_clean`` checks what the result must look like."""
    if "\x1b" in text:
        return None
    return " ".join(unicodedata.normalize("NFC", _CONTROL.sub(" ", text)).split())


def assert_clean(kept: str, raw: str) -> None:
    """A kept side: non-empty, NFC, no control characters, single spaces only between words, what ``clean``
    gives (idempotent), and the oracle's text when there is one."""
    assert kept and unicodedata.is_normalized("NFC", kept), (raw, kept)
    assert not _CONTROL.search(kept) and kept == kept.strip(), (raw, kept)
    assert all(c == " " for c in kept if c.isspace()) and "  " not in kept, (raw, kept)
    assert clean(kept) == kept, (raw, kept)
    expected = oracle_clean(raw)
    assert expected is None or kept == expected, (raw, kept, expected)


def _kept(raw: str) -> bool:
    """Is a side non-empty after cleaning (by the oracle where there is one)?"""
    expected = oracle_clean(raw)
    return bool(clean(raw) if expected is None else expected)


def raw_lines(content: bytes) -> list[bytes]:
    """Lines as the readers must split them: on b"\\n" only; a final "\\n" ends the last line."""
    parts = content.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    return parts


def decoded(content: bytes) -> list[str] | None:
    """The lines as strict UTF-8 (a BOM at the start of the file dropped), or None if one is invalid."""
    out = []
    for number, line in enumerate(raw_lines(content)):
        if number == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return out


def encode_lines(lines: list[str], final_newline: bool) -> bytes:
    """Lines as UTF-8 bytes; a lone surrogate becomes its (invalid) CESU bytes, as a buggy writer would."""
    text = "\n".join(lines) + ("\n" if final_newline and lines else "")
    return text.encode("utf-8", "surrogatepass")


def write(folder: Path, name: str, content: bytes, gz: bool) -> Path:
    path = folder / name
    path.write_bytes(gzip.compress(content, mtime=0) if gz else content)
    return path


def check_corpus(source, expected_pairs: list[tuple[str, str]] | None, read: int | None) -> None:
    """Read ``source``: with ``expected_pairs`` None a one-line DataError must come (or, with ``read`` None
    too, either outcome is allowed); else exactly those raw pairs, cleaned, with the rest counted as
    dropped."""
    try:
        corpus = read_corpus(source, "train")
    except DataError as e:
        event("DataError")
        one_line(e)
        assert expected_pairs is None, (str(e), expected_pairs)
        return
    event("read")
    assert expected_pairs is not None or read is None, "expected a DataError"
    assert len(corpus.src) == len(corpus.tgt) == len(corpus.lines)
    assert corpus.read == len(corpus) + sum(corpus.dropped.values())
    if expected_pairs is None:
        return
    assert corpus.read == read
    kept = [(n, s, t) for n, (s, t) in enumerate(expected_pairs, start=1) if _kept(s) and _kept(t)]
    assert corpus.lines == [n for n, _, _ in kept]
    for (_, raw_src, raw_tgt), src, tgt in zip(kept, corpus.src, corpus.tgt):
        assert_clean(src, raw_src)
        assert_clean(tgt, raw_tgt)


def _file_content(lines_strategy):
    """Random bytes, or random lines encoded (maybe with a final newline, maybe behind a BOM)."""
    encoded = st.builds(lambda lines, nl, bom: (b"\xef\xbb\xbf" if bom else b"") + encode_lines(lines, nl),
                        lines_strategy, st.booleans(), st.booleans())
    return st.one_of(st.binary(max_size=200), encoded)


def _text_pair_oracle(src: bytes, tgt: bytes, gz: bool):
    if not gz and (src.startswith(b"\x1f\x8b") or tgt.startswith(b"\x1f\x8b")):
        return None, None  # random bytes that claim to be gzip: no oracle, only the contract
    n_src, n_tgt = len(raw_lines(src)), len(raw_lines(tgt))
    src_lines, tgt_lines = decoded(src), decoded(tgt)
    if n_src != n_tgt or n_src == 0 or src_lines is None or tgt_lines is None:
        return None, 0
    return list(zip(src_lines, tgt_lines)), n_src


LINES = st.lists(LINE_TEXT, max_size=8)


@budget(250)
@given(_file_content(LINES), _file_content(LINES), st.booleans())
@example(b"e\x1b[0m\xcc\x81\n", b"x\n", False)  # "e", an ANSI code, U+0301: NFC must follow the removal
@example("\u1100\x1b[m\u1161".encode(), b"x", True)  # Hangul jamo that compose once the code is gone
@example(b"\xef\xbb\xbfa\n", b"b\n", False)
def test_text_files_read_as_documented_or_data_error(src, tgt, gz):
    """Two files, plain or gzipped (the content then read back whole, whatever it starts with)."""
    with scratch() as folder:
        source = TextSource(src=write(folder, "train.src", src, gz), tgt=write(folder, "train.tgt", tgt, gz))
        check_corpus(source, *_text_pair_oracle(src, tgt, gz))


CELL = st.lists(st.sampled_from(PIECES + ANSI_CODES) | ANY_CHARACTER.filter(lambda c: c not in "\t\n"),
                max_size=8).map("".join)
TSV_ROWS = st.lists(st.lists(CELL, max_size=4).map("\t".join), max_size=8)


@budget(200)
@given(_file_content(TSV_ROWS), st.integers(0, 3), st.integers(0, 3))
def test_tsv_reads_as_documented_or_data_error(content, src_column, tgt_column):
    lines = None if content.startswith(b"\x1f\x8b") else decoded(content)
    pairs, read = (None, None) if content.startswith(b"\x1f\x8b") else (None, 0)
    if lines:
        need = max(src_column, tgt_column) + 1
        rows = [line.split("\t") if line.strip() else [""] * need for line in lines]
        if all(len(row) >= need for row in rows):
            pairs, read = [(row[src_column], row[tgt_column]) for row in rows], len(rows)
    with scratch() as folder:
        source = TsvSource(format="tsv", path=write(folder, "train.tsv", content, False),
                           src_column=src_column, tgt_column=tgt_column)
        check_corpus(source, pairs, read)


JSON_TEXT = st.lists(st.sampled_from(PIECES + ANSI_CODES + ["\n", '"', "\\", "\ud800", "\udfff"])
                     | ANY_CHARACTER, max_size=10).map("".join)
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | JSON_TEXT,
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(JSON_TEXT, inner, max_size=3), max_leaves=6)
FIELD = st.one_of(JSON_TEXT, st.none(), JSON_VALUES)
RECORD = st.one_of(
    st.builds(lambda s, t, extra: {**extra, "translation": {"de": s, "en": t}}, FIELD, FIELD,
              st.dictionaries(JSON_TEXT, JSON_VALUES, max_size=2)),
    st.builds(lambda s, t: {"translation": {"de": s}, "en": t}, FIELD, FIELD),
    JSON_VALUES,
)
JSONL_LINE = st.one_of(
    st.builds(json.dumps, RECORD, ensure_ascii=st.booleans()),  # lone surrogates: "\ud800" when ascii
    st.text(max_size=10), st.just(""), st.just("  "),
)


def _jsonl_oracle(content: bytes):
    """The documented JSONL rule: blank lines are empty pairs; otherwise a JSON object with both dotted
    fields, each a string (of characters: no lone surrogate) or null (empty); anything else an error."""
    lines = decoded(content)
    if not lines:
        return None, 0
    pairs = []
    for line in lines:
        if not line.strip():
            pairs.append(("", ""))
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            return None, 0
        sides = []
        for dotted in ("translation.de", "translation.en"):
            value = record
            for part in dotted.split("."):
                value = value.get(part, KeyError) if isinstance(value, dict) else KeyError
            if value is None:
                value = ""
            if not isinstance(value, str) or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
                return None, 0
            sides.append(value)
        pairs.append(tuple(sides))
    return pairs, len(lines)


@budget(250)
@given(st.lists(JSONL_LINE, max_size=6).map(lambda lines: encode_lines(lines, True))
       | st.binary(max_size=100))
@example(b'{"translation": {"de": "a\\ud800", "en": "b"}}\n')  # a lone surrogate, escaped in JSON
@example(b"[" * 100_000 + b"\n")  # RecursionError in the json decoder
@example(b'{"translation": {"de": "a", "en": ' + b"9" * 5000 + b"}}\n")  # int() past its 4300 digits
@example(b'{"\\n": null}\n')  # a key with a line break, named in the message ("keys here: ...")
@example(b'{"a\\rb": 1}\n')
@example(b'{"translation": {"de": "e\\u001b[0m\\u0301", "en": "x"}}\n')
def test_jsonl_reads_as_documented_or_data_error(content):
    pairs, read = _jsonl_oracle(content)
    if content.startswith(b"\x1f\x8b"):
        pairs, read = None, None
    with scratch() as folder:
        source = JsonlSource(format="jsonl", path=write(folder, "train.jsonl", content, False),
                             src_field="translation.de", tgt_field="translation.en")
        check_corpus(source, pairs, read)


@budget(300)
@given(LINE_TEXT)
@example("e\x1b[0m\u0301")
@example("\u0301\x1b[m\u0316")  # marks out of canonical order once the code between them is gone
def test_clean_gives_nfc_without_controls_or_runs_of_whitespace(raw):
    """``clean`` on any string, lone surrogates included: empty, or the properties of ``assert_clean``."""
    cleaned = clean(raw)
    if cleaned:
        assert_clean(cleaned, raw)
    else:
        assert oracle_clean(raw) in (None, "")


# ----------------------------------------------------------------------------------------- alignments

INDEX = st.integers(0, 40)
VALID_LINK = st.builds(lambda i, sep, j: f"{i}{sep}{j}", INDEX, st.sampled_from("-?p"), INDEX)
GARBAGE = st.one_of(
    st.sampled_from(["1-", "-1", "1--2", "a-b", "1-2-3", "1p2p", "+1-2", "1-+2", "1_0-2", "1x2", "1P2",
                     "0b1-1", "\u0661-\u0662", "\uff11-\uff12", "\u00b9-2", "1-\u0663", "1e1-2",
                     "9" * 5000 + "-1"]),
    st.text(min_size=1, max_size=6).filter(lambda t: t.strip() == t and " " not in t and "\n" not in t),
)
SEPARATOR = st.sampled_from([" ", "  ", "\t", " \t ", "\u00a0", "\x0c"])
PHARAOH_LINE = st.lists(st.tuples(VALID_LINK | GARBAGE, SEPARATOR), max_size=8).map(
    lambda parts: "".join(token + sep for token, sep in parts))
_ASCII_LINK = re.compile(r"([0-9]+)([-?p])([0-9]+)", re.ASCII)


def oracle_pharaoh(line: str, one_based: bool):
    """(sure, possible) of a Pharaoh line by the format's definition (ASCII digits, ``-`` sure, ``?`` or
    ``p`` possible, possible including sure), or None when a token is not a link."""
    sure, possible = set(), set()
    for token in line.split():
        match = _ASCII_LINK.fullmatch(token)
        if not match or max(len(match.group(1)), len(match.group(3))) > 4300:
            return None
        i, j = int(match.group(1)) - one_based, int(match.group(3)) - one_based
        if i < 0 or j < 0:
            return None
        (sure if match.group(2) == "-" else possible).add((i, j))
    return sure, possible | sure


@budget(300)
@given(PHARAOH_LINE, st.booleans())
@example("\u0661-\u0662", False)  # Arabic-Indic digits: \d matched them, int() read them
@example("\uff11-\uff12 0-0", True)
@example("9" * 5000 + "-1", False)
def test_pharaoh_lines_parse_to_the_format_or_value_error(line, one_based):
    expected = oracle_pharaoh(line, one_based)
    try:
        got = parse_pharaoh(line, one_based)
    except ValueError as e:
        event("ValueError")
        one_line(e)
        assert expected is None, (line, str(e))
        return
    assert got == expected, line


@budget(100)
@given(st.lists(PHARAOH_LINE, max_size=5), st.booleans(), st.integers(0, 6))
def test_gold_files_read_or_data_error(lines, one_based, pairs):
    """``read_gold``: the file's links line by line, or one DataError (wrong line count, a bad link)."""
    with scratch() as folder:
        path = folder / "gold.align"
        path.write_bytes(encode_lines(lines, True))
        try:
            gold = read_gold(path, pairs, folder / "test.src", one_based)
        except DataError as e:
            one_line(e)
            parsed = [oracle_pharaoh(line, one_based) for line in lines]
            assert len(lines) != pairs or None in parsed
            return
    assert len(lines) == pairs
    assert [(s, p) for s, p in zip(gold.sure, gold.possible)] == [oracle_pharaoh(x, one_based) for x in lines]


LINKS = st.sets(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20)


def _transpose(links):
    return {(j, i) for i, j in links}


@budget(300)
@given(st.lists(st.tuples(LINKS, LINKS, LINKS), min_size=1, max_size=4))
def test_aer_precision_recall_are_in_range_and_zero_on_the_gold(sentences):
    """Corpus-level scores of predicted links A against sure S and possible P (S ⊆ P enforced as the
    reader does): all in [0, 1], as Och & Ney's formulas give them; A = S = P is AER 0 with precision and
    recall 1; any A between S and P is AER 0; nothing predicted against some sure links is AER 1."""
    predicted = [a for a, _, _ in sentences]
    sure = [s for _, s, _ in sentences]
    possible = [s | p for _, s, p in sentences]
    score = alignment_scores(predicted, sure, possible)
    assert 0.0 <= score.aer <= 1.0 and 0.0 <= score.precision <= 1.0 and 0.0 <= score.recall <= 1.0
    a, s = sum(map(len, predicted)), sum(map(len, sure))
    a_s = sum(len(x & y) for x, y in zip(predicted, sure))
    a_p = sum(len(x & y) for x, y in zip(predicted, possible))
    assert score.aer == pytest.approx(1 - (a_s + a_p) / (a + s) if a + s else 0.0)
    assert score.precision == pytest.approx(a_p / a if a else 1.0)
    assert score.recall == pytest.approx(a_s / s if s else 1.0)
    itself = alignment_scores(predicted, predicted, predicted)
    assert (itself.aer, itself.precision, itself.recall) == (0.0, 1.0, 1.0)
    between = [x | (y & p) for x, y, p in zip(sure, predicted, possible)]  # S ⊆ A ⊆ P
    assert alignment_scores(between, sure, possible).aer == 0.0
    if s:
        assert alignment_scores([set()] * len(sure), sure, possible).aer == 1.0


@budget(300)
@given(LINKS, LINKS)
@example({(0, 0), (2, 2)}, {(0, 0), (1, 1), (2, 2), (1, 2)})
def test_symmetrization_lies_between_intersection_and_union(forward, reverse):
    """Both directions are given as (source word, target word) links, so swapping them needs no
    transposition: intersection, union and grow-diag (which reads only those two) are the same either way;
    every heuristic lies between the intersection and the union; the -final variants only add to
    grow-diag; intersection and union commute with transposing both inputs; after -final both words of
    every directional link are aligned, after -final-and at least one of them."""
    inter, union = forward & reverse, forward | reverse
    results = {m: symmetrize(forward, reverse, m) for m in SYMMETRIZATIONS}
    assert results["intersection"] == inter and results["union"] == union
    for method, links in results.items():
        assert inter <= links <= union, method
    for method in ("intersection", "union", "grow-diag"):
        assert symmetrize(reverse, forward, method) == results[method], method
    for method in ("intersection", "union"):
        assert symmetrize(_transpose(forward), _transpose(reverse), method) == _transpose(results[method])
    assert results["grow-diag"] <= results["grow-diag-final"]
    assert results["grow-diag"] <= results["grow-diag-final-and"]
    for method, both in (("grow-diag-final", True), ("grow-diag-final-and", False)):
        src = {i for i, _ in results[method]}
        tgt = {j for _, j in results[method]}
        assert all((i in src and j in tgt) if both else (i in src or j in tgt) for i, j in union), method
    with pytest.raises(ValueError):
        symmetrize(forward, reverse, "grow")


# ---------------------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def intact(tiny):
    """The tiny reference run's latest checkpoint: its path, bytes, weights and config as loaded, and the
    byte ranges of its zip structure (local headers, each record's data, the central directory)."""
    run = tiny.reference()
    path = run / "checkpoints" / read_pointer(RunDir(run), "latest")["file"]
    model, _, cfg, _ = load_model(path)
    raw = path.read_bytes()
    regions = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            header = info.header_offset
            name_len, extra_len = int.from_bytes(raw[header + 26:header + 28], "little"), int.from_bytes(
                raw[header + 28:header + 30], "little")
            start = header + 30 + name_len + extra_len
            regions += [(header, start), (start, start + max(info.compress_size, 1))]
        regions.append((archive.start_dir, len(raw)))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Intact({"path": path, "raw": raw, "state": state, "config": cfg.to_dict(), "regions": regions})


class Intact(dict):
    """The intact checkpoint's facts, with a short repr for hypothesis's reports."""

    def __repr__(self) -> str:
        return f"Intact({self['path'].name}, {len(self['raw'])} bytes)"


def damage_strategy(size: int, regions: list[tuple[int, int]]):
    """1-3 flipped bytes anywhere (uniformly, or inside a zip header, a record, the central directory), or
    the file cut at a random length."""
    position = st.one_of(st.integers(0, size - 1),
                         st.sampled_from(regions).flatmap(lambda r: st.integers(r[0], r[1] - 1)))
    flips = st.lists(st.tuples(position, st.integers(1, 255)), min_size=1, max_size=3)
    return st.one_of(flips.map(lambda f: ("flip", f)), st.integers(0, size - 1).map(lambda n: ("cut", n)))


def damaged(raw: bytes, damage) -> bytes:
    kind, what = damage
    if kind == "cut":
        return raw[:what]
    data = bytearray(raw)
    for position, mask in what:
        data[position] ^= mask
    return bytes(data)


def assert_same_as_intact(intact, model, cfg) -> None:
    state = model.state_dict()
    assert state.keys() == intact["state"].keys()
    different = [k for k, v in intact["state"].items() if not torch.equal(state[k], v)]
    assert not different, f"loaded other weights: {different[:3]}"
    assert cfg.to_dict() == intact["config"]


@budget(200)
@given(data=st.data())
def test_damaged_checkpoint_loads_the_intact_weights_or_is_a_checkpoint_error(intact, data):
    """In-process, ``load_model``: a flipped byte that the format does not check (a zip timestamp, say)
    may load, but then to exactly the intact weights and config; anything else is a CheckpointError."""
    damage = data.draw(damage_strategy(len(intact["raw"]), intact["regions"]), label="damage")
    with scratch() as folder:
        path = folder / "damaged.pt"
        path.write_bytes(damaged(intact["raw"], damage))
        try:
            model, _, cfg, _ = load_model(path)
        except CheckpointError as e:
            event("CheckpointError")
            one_line(e)
            return
    event("loaded")
    assert_same_as_intact(intact, model, cfg)


def test_a_flipped_weight_is_refused(intact):
    """The failing example kept: torch's zip reader does not check CRC-32s, so a flipped bit inside a
    tensor's record used to load as a different weight."""
    with zipfile.ZipFile(intact["path"]) as archive:
        record = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size > 16)
    raw = intact["raw"]
    header = record.header_offset
    start = header + 30 + int.from_bytes(raw[header + 26:header + 28], "little") + int.from_bytes(
        raw[header + 28:header + 30], "little")
    bad = damaged(raw, ("flip", [(start + 5, 0x10)]))
    with scratch() as folder:
        path = folder / "flipped.pt"
        path.write_bytes(bad)
        with pytest.raises(CheckpointError, match="CRC"):
            load_checkpoint(path)


@pytest.mark.parametrize("region", ["record", "central directory", "cut", "header time"])
@budget(1)
@given(data=st.data())
def test_damaged_checkpoint_through_a_subprocess(intact, region, data):
    """``python -m attnmt translate`` on a damaged file, in its own interpreter: exit 4 with one error line,
    or exit 0 with the intact file's translation; never a signal (a crash) or another code."""
    regions = intact["regions"]
    if region == "cut":
        damage = ("cut", data.draw(st.integers(0, len(intact["raw"]) - 1)))
    elif region == "header time":  # a local header's modification time, which neither reader checks
        header = data.draw(st.sampled_from(regions[0:-1:2]))[0]
        position = data.draw(st.integers(header + 10, header + 13))
        damage = ("flip", [(position, data.draw(st.integers(1, 255)))])
    else:
        span = regions[-1] if region == "central directory" else data.draw(st.sampled_from(regions[1:-1:2]))
        damage = ("flip", [(data.draw(st.integers(span[0], span[1] - 1)), data.draw(st.integers(1, 255)))])
    with scratch() as folder:
        path = folder / "damaged.pt"
        path.write_bytes(damaged(intact["raw"], damage))
        result = run_attnmt("translate", path, "tuesday , march 14th , 2019", "--beam-size", "1", timeout=120)
    assert result.returncode in (0, 4), (result.returncode, result.stderr)
    event(f"exit {result.returncode}")
    if result.returncode == 4:
        assert str(path) in assert_one_error_line(result.stderr)
    else:
        reference = CliRunner().invoke(app, ["translate", str(intact["path"]), "tuesday , march 14th , 2019",
                                             "--beam-size", "1"])
        assert result.stdout == reference.stdout


PLAIN = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True),
                  st.text(max_size=6), st.lists(st.integers(0, 9), max_size=3), st.just({}),
                  st.just(torch.zeros(3)), st.just(torch.tensor([math.nan])),
                  st.just(torch.zeros(2, 2, dtype=torch.int64)))


def _payload_paths(payload: dict) -> list[tuple]:
    """Key paths of the payload down to two levels (and three under ``fingerprint``), tensors excluded from
    descent."""
    paths = []
    for key, value in payload.items():
        paths.append((key,))
        if isinstance(value, dict):
            for sub, inner in value.items():
                paths.append((key, sub))
                if key == "fingerprint" and isinstance(inner, dict):
                    paths += [(key, sub, k) for k in inner]
    return paths


@budget(60)
@given(data=st.data())
def test_payload_with_a_key_removed_or_retyped(intact, data):
    """A file that loads weights-only but whose payload lost a key or holds a wrong type there (a file
    from another tool, or hand-edited): ``load_model`` loads it (the key did not matter) or raises a
    CheckpointError; ``attnmt info`` exits 0 or 4, with one error line."""
    payload = load_checkpoint(intact["path"])
    path = data.draw(st.sampled_from(_payload_paths(payload)), label="key")
    parent = _at(payload, path[:-1])
    if data.draw(st.booleans(), label="delete"):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(PLAIN, label="value")
    with scratch() as folder:
        file = folder / "edited.pt"
        torch.save(payload, file)
        try:
            load_model(file)
            event("load_model: loaded")
        except CheckpointError as e:
            event("load_model: CheckpointError")
            one_line(e)
        result = CliRunner().invoke(app, ["info", str(file)])
    assert result.exit_code in (0, 4), (result.exit_code, result.output)
    event(f"info: exit {result.exit_code}")
    if result.exit_code:
        assert_one_error_line(result.stderr)


def _first_weight(payload: dict) -> str:
    return next(iter(payload["model"]))


@pytest.mark.parametrize("change", [
    ("delete", ("config",)),  # KeyError in load_model and in info (then: info exited 2, load_model 4)
    ("delete", ("fingerprint", "tokenizer", "src_sha256")),  # KeyError
    ("set", ("model",), None),  # AttributeError: no .items()
    ("set", ("model", _first_weight), None),  # AttributeError: no .is_floating_point()
    ("set", ("fingerprint", "tokenizer", "joint"), torch.zeros(3)),  # RuntimeError: bool() of a tensor
    ("set", ("fingerprint", "tokenizer"), torch.zeros(3)),  # IndexError: a tensor indexed by a string
])
def test_payload_changes_found_by_the_property_are_checkpoint_errors(intact, tmp_path, change):
    """The failing examples of ``test_payload_with_a_key_removed_or_retyped``, kept."""
    payload = load_checkpoint(intact["path"])
    kind, path, *value = change
    path = tuple(part(payload) if callable(part) else part for part in path)
    parent = _at(payload, path[:-1])
    if kind == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value[0]
    torch.save(payload, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match="edited.pt"):
        load_model(tmp_path / "edited.pt")
    result = CliRunner().invoke(app, ["info", str(tmp_path / "edited.pt")])
    assert result.exit_code in (0, 4), result.output
    if result.exit_code:
        assert_one_error_line(result.stderr)


class RunsCode:
    """Pickles as ``open(marker, "w")``: an unpickler that runs code would create the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("command", [["translate", "{path}", "hello"], ["info", "{path}"]])
def test_checkpoint_that_would_run_code_exits_4_and_never_runs(intact, tmp_path, command):
    """The real payload with one object whose unpickling runs code: exit 4 through the command line, one
    error line, and the marker file never appears (``torch.load(weights_only=True)``)."""
    marker, evil = tmp_path / "marker", tmp_path / "evil.pt"
    payload = load_checkpoint(intact["path"])
    payload["progress"] = {**payload["progress"], "extra": RunsCode(marker)}
    torch.save(payload, evil)
    result = CliRunner().invoke(app, [part.format(path=evil) for part in command])
    assert result.exit_code == 4, result.output
    assert "pickled objects" in assert_one_error_line(result.stderr)
    assert not marker.exists()
