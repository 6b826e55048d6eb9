"""Hostile files where attnmt reads JSON: every reader of ``config/jsonfile.py`` (found by walking the
library's call sites, so a reader added later without a place here fails the first test) is given each
hostile variant of its file, and the command (or library call) that reads it must answer with one
``error:`` line and a contract exit code, at once, changing nothing; and ``import`` is given hostile values
in every field of ``config.json`` that it reads."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, assert_one_error_line, hash_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marian_fixture import make_marian
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.jsonfile import MAX_DEPTH, parse_json, read_json
from attnmt.errors import AttnmtError, CheckpointError, DataError
from attnmt.models.marian import MarianConfig

pytest.importorskip("transformers")  # a dev dependency: installed by the set-up, so never skipped in CI

CONTRACT = {2, 3, 4, 5}
READERS = {"read_json", "read_json_lines", "parse_json", "regular_bytes"}
LIMIT = 5.0  # seconds: a reader that waits on a pipe is released after this and the test fails


# ----------------------------------------------------------------------------------------- variants

def _deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


# Each hostile variant: how it is planted at a file's path. Content variants keep a regular file.
VARIANTS: dict[str, Callable[[Path, type], None]] = {
    "fifo": lambda path, top: os.mkfifo(path),
    "folder": lambda path, top: path.mkdir(),
    "deep": lambda path, top: _deep(path),
    "1e400": lambda path, top: path.write_text('{"a": 1e400}' if top is dict else "[1e400]"),
    "10**5000": lambda path, top: path.write_text('{"a": 1' + "0" * 5000 + "}" if top is dict
                                                  else "[1" + "0" * 5000 + "]"),
    "NaN": lambda path, top: path.write_text('{"a": NaN}' if top is dict else "[NaN]"),
    "latin-1": lambda path, top: path.write_bytes(b'{"a": "caf\xe9"}' if top is dict else b'["caf\xe9"]'),
    "wrong top": lambda path, top: path.write_text("[1, 2]" if top is dict else '{"a": 1}'),
    "truncated": lambda path, top: path.write_text('{"a": [1, ' if top is dict else '[{"a": '),
}


# ----------------------------------------------------------------------------------------- places

@dataclass(frozen=True)
class Place:
    """A JSON file attnmt reads: which world holds it, its path there, what reads it (``run`` gives
    (exit code, stderr) for a copy of the world), and the call sites (``module:function``) that read it."""

    world: str
    file: str
    run: Callable[[Path], tuple[int, str]]
    readers: tuple[str, ...]
    top: type = dict
    tolerant: bool = False  # bad content may be passed over (a pointer the step files rebuild, a half-written
    # line of JSON lines), never a pipe, a device or a folder
    writes: bool = False  # the reader may rewrite the file (the pointer rebuilt, the log truncated)


def cli(*words: str) -> Callable[[Path], tuple[int, str]]:
    """``attnmt WORDS`` in process, ``{w}`` in a word standing for the world's copy."""
    def run(world: Path) -> tuple[int, str]:
        result = CliRunner().invoke(app, [w.format(w=world) for w in words])
        return result.exit_code, result.stderr
    return run


def library(call: Callable[[Path], object]) -> Callable[[Path], tuple[int, str]]:
    """A library call: its AttnmtError as the command line would show it."""
    def run(world: Path) -> tuple[int, str]:
        try:
            call(world)
        except AttnmtError as e:
            return e.exit_code, f"error: {e}\n"
        return 0, ""
    return run


def _latest(world: Path):
    from attnmt.models.checkpoint import latest_checkpoint
    from attnmt.runfiles import RunDir

    return latest_checkpoint(RunDir(world))


def _guided_stats(world: Path):
    from attnmt.runfiles import RunDir
    from attnmt.training.runstart import guided_links

    return guided_links(None, RunDir(world), None, None)  # the stats are read before anything else


def _truncate(world: Path):
    from attnmt.runfiles import RunDir
    from attnmt.training.runlog import MetricsLog

    MetricsLog(RunDir(world), True, lambda event: None, lambda: 0.0).truncate(10)


def _tokenizer_settings(world: Path):
    from attnmt.config.schema import load_config
    from attnmt.data.prepare import obtain_tokenizer
    from attnmt.runfiles import RunDir

    return obtain_tokenizer(load_config(world / "config.yaml"), RunDir(world), None)


def _study(world: Path):
    from attnmt.study.run import Study, open_study

    open_study(Study(world, None, [], 1.0, 1))


def _study_results(world: Path):
    from attnmt.study.run import Study

    return Study(world, None, [], 1.0, 1).results()


def _study_metrics(world: Path):
    from attnmt.runfiles import RunDir
    from attnmt.study.measure import read_metrics

    return read_metrics(RunDir(world))


def _growth(world: Path):
    from attnmt.study.measure import update_growth

    return update_growth(world / "growth.json", [], [8, 16])


def _distill_record(world: Path):
    from attnmt.config.schema import load_config
    from attnmt.decoding.distill import _read_record

    return _read_record(world / "distilled", load_config(world / "config.yaml").data)


def _split(world: Path):
    from attnmt.data.encoded import open_split

    return open_split(world / "data" / "train", "train")


ALIGN = ("align", "{w}", "--src", "{w}/../src.txt")
PLACES = [
    Place("marian", "config.json", cli("import", "{w}", "{w}/../out.pt"), ("marian_io:_json",)),
    Place("marian", "vocab.json", cli("import", "{w}", "{w}/../out.pt"), ("marian_io:_json",)),
    Place("marian", "tokenizer_config.json", cli("import", "{w}", "{w}/../out.pt"), ("marian_io:_json",)),
    Place("marian", "source.spm", cli("import", "{w}", "{w}/../out.pt"), ("marian_io:_bytes",), top=bytes),
    Place("run", "checkpoints/best.json", cli("translate", "{w}", "-i", "/dev/null"),
          ("checkpoint:read_pointer",), tolerant=True),
    Place("run", "checkpoints/latest.json", library(_latest), ("checkpoint:read_pointer",), tolerant=True,
          writes=True),
    Place("run", "alignment.json", cli(*ALIGN, "--one-way"), ("links:read_calibration",)),
    Place("run", "reverse.json", cli(*ALIGN), ("links:read_reverse",)),
    Place("run", "metrics.jsonl", cli("plot-curves", "{w}", "--out", "{w}/../c.png"),
          ("curves:read_metrics",), tolerant=True),
    Place("run", "metrics.jsonl", library(_truncate), ("runlog:truncate",), tolerant=True, writes=True),
    Place("run", "metrics.jsonl", library(_study_metrics), ("measure:read_metrics",)),
    Place("run", "tokenizer/tokenizer.json", cli("info", "{w}"), ("tokenizer:_read_meta",)),
    Place("run", "tokenizer/tokenizer.json", library(_tokenizer_settings), ("prepare:obtain_tokenizer",)),
    Place("run", "data/train/split.json", library(_split), ("encoded:open_split",)),
    Place("run", "distilled/distill.json", library(_distill_record), ("distill:_read_record",)),
    Place("run", "data/stats.json", library(_guided_stats), ("runstart:guided_links",), top=list),
    Place("run", "study.json", library(_study), ("run:open_study",)),
    Place("run", "results.json", library(_study_results), ("run:results",)),
    Place("run", "growth.json", library(_growth), ("measure:update_growth",)),
    Place("export", "attnmt-export.json", cli("info", "{w}"), ("checkpoint:_spec",)),
    Place("export", "attnmt-export.json", cli("translate", "{w}", "-i", "/dev/null"),
          ("ctranslate:read_export",)),
]
# Readers of JSON text that is no file of a folder (a stream's line, bytes inside a checkpoint): each has
# its test of content variants elsewhere.
TEXT_READERS = {
    "readers:_read_jsonl": "tests/data/test_data.py (a corpus line; pipes are read on purpose)",
    "piece_map:from_bytes": "test_a_piece_map_that_is_not_one_is_a_checkpoint_error, below",
}


def call_sites() -> set[str]:
    """``module:function`` of every call of the reader's functions in ``attnmt/`` (the reader itself
    aside)."""
    found = set()
    for path in (REPO / "attnmt").rglob("*.py"):
        if path.name == "jsonfile.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in READERS):
                    found.add(f"{path.stem}:{function.name}")
    return found


def test_every_reader_of_json_has_a_place_here():
    sites = call_sites()
    covered = {r for place in PLACES for r in place.readers} | set(TEXT_READERS)
    assert sites <= covered, f"readers without a hostile-file place: {sorted(sites - covered)}"
    assert covered <= sites, f"places of readers that are gone: {sorted(covered - sites)}"
    # and no JSON is read past the reader
    raw = [str(p.relative_to(REPO)) for p in (REPO / "attnmt").rglob("*.py")
           if "json.load" in p.read_text(encoding="utf-8") and p.name != "jsonfile.py"
           and p.parent.name not in ("cli", "serve")]
    assert raw == [], raw


# ----------------------------------------------------------------------------------------- worlds

@pytest.fixture(scope="module")
def worlds(tmp_path_factory, tiny) -> dict[str, Path]:
    """One copy of each world, planted and restored case by case: a Marian folder, a trained tiny run
    folder, and its CTranslate2 export."""
    root = tmp_path_factory.mktemp("hostile")
    run = root / "run"
    shutil.copytree(tiny.reference("transformer"), run, ignore=shutil.ignore_patterns(".lock"))
    for name in ("study.json", "results.json", "growth.json", "alignment.json"):
        (run / name).write_text('{"variants": {}, "layer": null, "heads": null}', encoding="utf-8")
    (run / "reverse.json").write_text('{"model": "gone"}', encoding="utf-8")  # one way, with a warning
    (run / "distilled").mkdir()  # attnmt distill's record goes in it
    (root / "src.txt").write_text("a b c\n", encoding="utf-8")
    export = root / "export"
    result = CliRunner().invoke(app, ["export", str(run), str(export)])
    assert result.exit_code == 0, result.output
    return {"marian": make_marian(root / "marian"), "run": run, "export": export}


@contextlib.contextmanager
def released(path: Path):
    """While the body runs: after LIMIT seconds, open ``path``'s writing end now and then, so that a reader
    blocked on the pipe gets its end of file (and the test fails on the time, not hangs)."""
    done = threading.Event()

    def release() -> None:
        while not done.wait(LIMIT):
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    watcher = threading.Thread(target=release, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


@contextlib.contextmanager
def planted(path: Path, variant: Callable[[Path, type], None], top: type):
    """``path`` replaced by the variant for the body, then put back as it was."""
    kept = path.read_bytes() if path.is_file() else None
    path.unlink(missing_ok=True)
    try:
        variant(path, top)
        yield
    finally:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        if kept is not None:
            path.write_bytes(kept)


CASES = [(place, variant) for place in PLACES for variant in VARIANTS]


@pytest.mark.parametrize(("place", "variant"), CASES,
                         ids=[f"{p.file}-{p.readers[0]}-{v}" for p, v in CASES])
def test_a_hostile_json_file_is_one_line_at_once_and_changes_nothing(worlds, place, variant):
    world = worlds[place.world]
    path = world / place.file
    with planted(path, VARIANTS[variant], place.top):
        before = hash_tree(world.parent)
        started = time.monotonic()
        with released(path):
            code, stderr = place.run(world)
        took = time.monotonic() - started
        after = hash_tree(world.parent)
    assert took < LIMIT, f"{place.file} as {variant}: waited {took:.1f} s"
    if place.writes:
        name = str(path.relative_to(world.parent))
        before.pop(name, None), after.pop(name, None)
    for output in ("out.pt", "c.png"):  # what a success writes
        after.pop(output, None)
        (world.parent / output).unlink(missing_ok=True)
    assert after == before, f"{place.file} as {variant}: files changed"
    content = variant not in ("fifo", "folder")
    if code == 0:
        assert place.tolerant and content, f"{place.file} as {variant}: taken ({stderr!r})"
        return
    assert code in CONTRACT, (code, stderr)
    line = assert_one_error_line(stderr)
    assert place.file.split("/")[-1] in line, line


@pytest.mark.parametrize("record", ['{"model": "a\\u0000b"}', '{"model": "../src.txt"}', '{"model": "."}',
                                    '{"model": "/dev/null"}', '{"model": ["x"]}', '{"model": ""}', "null"])
def test_a_reverse_json_naming_no_model_is_one_line(worlds, record):
    """The model ``reverse.json`` names: a NUL byte, a file that is no checkpoint, the run itself, a device,
    not a path: one line, exit 3, before any model is loaded (was a note and an error, or exit 1)."""
    path = worlds["run"] / "reverse.json"
    kept = path.read_bytes()
    try:
        path.write_text(record, encoding="utf-8")
        code, stderr = cli(*ALIGN)(worlds["run"])
    finally:
        path.write_bytes(kept)
    assert code == 3, stderr
    assert "reverse.json" in assert_one_error_line(stderr)


def test_a_reverse_model_not_there_aligns_one_way_with_one_warning(worlds):
    code, stderr = cli(*ALIGN)(worlds["run"])
    assert code == 0, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == [
        f"warning: reverse.json names {worlds['run'] / 'gone'}, which is not there: aligning one way"]


# ------------------------------------------------------------------------------- the reader itself

@pytest.mark.parametrize("kind", [DataError, CheckpointError])
def test_the_reader_names_the_file_and_keeps_the_callers_kind(tmp_path, kind):
    for variant, plant in VARIANTS.items():
        path = tmp_path / f"{variant}.json"
        plant(path, dict)
        with pytest.raises(kind) as raised:
            read_json(path, kind)
        assert str(raised.value).startswith(f"{path}: "), raised.value
    with pytest.raises(kind, match="NUL"):
        read_json(tmp_path / "a\0b.json", kind)
    with pytest.raises(kind, match="not a regular file"):
        read_json("/dev/zero", kind)
    assert read_json(tmp_path / "gone.json", kind, missing=None) is None
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH  # as deep as is taken, and one deeper
    assert parse_json(nested, "x", kind, list) is not None
    with pytest.raises(kind, match="nested more than"):
        parse_json("[" + nested + "]", "x", kind, list)


def test_a_piece_map_that_is_not_one_is_a_checkpoint_error():
    from attnmt.data.piece_map import PieceMap

    for data in (b"[" * 100_000, b'{"source": 1e400}', b"\xff", b"[]", b'{"source": []}'):
        with pytest.raises(CheckpointError, match="pieces.json"):
            PieceMap.from_bytes(data)


# ------------------------------------------------------------------------ import's config.json fields

HOSTILE_VALUES = st.one_of(
    st.none(), st.booleans(), st.text(max_size=8), st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30, 1.5, 2.0, -0.5, 0.999999, 1.0, 1e300]),
    st.integers(-10, 10**6))


@pytest.fixture(scope="module")
def marian_copy(tmp_path_factory) -> Path:
    return make_marian(tmp_path_factory.mktemp("marian-fields") / "opus-mt-tiny")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(MarianConfig.model_fields)), value=HOSTILE_VALUES)
def test_any_value_of_any_imported_field_is_taken_or_one_line_exit_4(marian_copy, tmp_path, key, value):
    """Each field ``import`` reads from ``config.json``, given a hostile JSON value: exit 0, or one line
    with exit 4 (never 1, never the wrong advice of memory): a value of the wrong type or out of its bounds
    names ``config.json`` and the key."""
    config = marian_copy / "config.json"
    kept = config.read_bytes()
    out = tmp_path / f"out-{time.monotonic_ns()}.pt"
    try:
        config.write_text(json.dumps({**json.loads(kept), key: value}), encoding="utf-8")
        result = CliRunner().invoke(app, ["import", str(marian_copy), str(out)])
    finally:
        config.write_bytes(kept)
    if result.exit_code == 0:
        assert out.is_file()
        return
    assert result.exit_code == 4, result.output
    line = assert_one_error_line(result.stderr)
    assert not out.exists()
    try:
        MarianConfig.model_validate({**json.loads(kept), key: value})
    except ValueError:
        assert "config.json" in line and key in line, line


def test_a_reverse_model_that_fails_to_load_is_one_line(worlds, tmp_path):
    """A reverse run that passes the checks made before loading (its config.yaml translates the other way)
    but whose checkpoint does not: the error alone, not the note that it aligns both ways before it."""
    back = tmp_path / "back"
    shutil.copytree(worlds["run"], back)
    config = (back / "config.yaml").read_text(encoding="utf-8")
    swapped = config.replace("src_lang: en", "src_lang: @").replace("tgt_lang: de", "tgt_lang: en")
    (back / "config.yaml").write_text(swapped.replace("src_lang: @", "src_lang: de"), encoding="utf-8")
    path = worlds["run"] / "reverse.json"
    kept = path.read_bytes()
    try:
        path.write_text(json.dumps({"model": str(back)}), encoding="utf-8")
        code, stderr = cli(*ALIGN)(worlds["run"])
    finally:
        path.write_bytes(kept)
    assert code == 2, stderr
    assert "it translates en->de" in assert_one_error_line(stderr)
