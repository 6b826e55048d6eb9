"""The scripts keep the command line's contract (``docs/RELIABILITY.md``; ``scripts/scriptargs.py``): every
expected failure is one ``error:`` line on stderr and a contract exit code, never a traceback, and every
input is checked before the first expensive step.

A property test walks every script in ``scripts/`` and ``scripts/bench/`` (found by globbing: a file with a
``__main__`` block), so a script added later is covered without touching this file. Each must expose
``build_parser()``, a ``ScriptParser`` whose options name what they take with ``scriptargs``'s checks, and a
``@guarded`` ``main`` whose first statement is ``args = build_parser().parse_args(argv)``: the parse-and-check
phase, which is all this test runs in-process, so no training, model load or download can start here. From a
valid invocation built from the parser itself (``baseline``: the checks' kinds say what to give each option,
in a scratch world of a corpus, a config, a run folder and a corpus folder), each option in turn is given the
command line fuzz's hostile values (``tests/cli/test_cli_fuzz.py``: inf, -inf, nan, -1, 0, 2**70, "", a
folder, a missing path, a named pipe with no writer, an unreadable file when not root, the invocation's own
inputs). Every outcome is acceptance or exactly one ``error:`` line with 2, 3, 4 or 5, no traceback, no file
written or changed, within a time limit (a hang fails); and what an option's kind must refuse (a number that
is not finite or past 64 bits, a missing input, a folder where a file goes, an output onto an input) is
refused in a line that names the option. Subprocess runs then prove the real ``main`` path, one per kind of
script.
"""

from __future__ import annotations

import ast
import contextlib
import gzip
import io
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import (
    OFFLINE_ENV,
    REPO,
    SCRIPT_FOLDERS,
    TINY_MODELS,
    TINY_TRAIN,
    assert_one_error_line,
    hostile_place,
    load_script,
    script_path,
)

from attnmt.errors import CheckpointError, ConfigError, DataError, ResourceError
from attnmt.runfiles import RunDir, write_marker

scriptargs = load_script("scriptargs")

CONTRACT_CODES = {2, 3, 4, 5}
ROOT = os.geteuid() == 0
NUMBERS = ["inf", "-inf", "nan", "-1", "0", str(2**70), ""]
PLACES = ["<folder>", "<missing>", "<fifo>"] + ([] if ROOT else ["<unreadable>"])
CALL_LIMIT_S = 20.0  # one parse-and-check call: names and stat, and a config's load


def is_script(path: Path) -> bool:
    """A file with a top-level ``if __name__ == "__main__":`` (benchlib and scriptargs are libraries)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


SCRIPTS = sorted(p.stem for folder in SCRIPT_FOLDERS for p in folder.glob("*.py") if is_script(p))


# ------------------------------------------------------------------------------------------ the world


@dataclass
class World:
    root: Path
    project: Path  # the working folder
    paths: dict[str, Path]  # the world's inputs by kind: file, folder, config, model
    counter: itertools.count
    places: dict[str, Path] = None  # the hostile places: <folder>, <missing>, <fifo>, <unreadable>

    def fresh(self, kind: str) -> Path:
        """A new path in the scratch folder: missing, an empty folder, a pipe or an unreadable file."""
        return hostile_place(self.root / "scratch", kind, next(self.counter))

    def snapshot(self) -> dict[str, tuple[int, int, int]]:
        """Every path under the root: its mode, size and modification time (a pipe is never opened)."""
        found = {}
        for folder, names, files in os.walk(self.root):
            for name in names + files:
                st = os.lstat(Path(folder) / name)
                where = str(Path(folder, name).relative_to(self.root))
                found[where] = (st.st_mode, st.st_size, st.st_mtime_ns)
        return found


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("scripts")
    project = root / "project"
    (project / "data").mkdir(parents=True)
    (root / "scratch").mkdir()
    src, tgt = project / "data" / "train.en", project / "data" / "train.de"
    src.write_text("monday , 3 june 2001\nsaturday the 4th of april 2004\n", encoding="utf-8")
    tgt.write_text("montag , 3. juni 2001\nsamstag , 4. april 2004\n", encoding="utf-8")
    pair = {"src": str(src), "tgt": str(tgt)}
    config = project / "config.yaml"
    config.write_text(json.dumps({"data": {"src_lang": "en", "tgt_lang": "de", "train": pair, "dev": pair,
                                           "test": pair},
                                  "tokenizer": {"vocab_size": 64}, "model": TINY_MODELS["transformer"],
                                  "train": TINY_TRAIN}), encoding="utf-8")
    corpus = project / "multi30k"  # the corpus folder the benchmarks read, by Multi30k's file names
    corpus.mkdir()
    for split, lang in itertools.product(("train", "val", "test_2016_flickr"), ("de", "en", "fr")):
        with gzip.open(corpus / f"{split}.{lang}.gz", "wt", encoding="utf-8") as handle:
            handle.write(f"a {lang} sentence\nanother one\n")
    run = project / "run"
    run.mkdir()
    write_marker(RunDir(run))
    found = World(root, project, {"file": src, "folder": corpus, "config": config, "model": run},
                  itertools.count())
    found.places = {token: found.fresh(token.strip("<>")) for token in PLACES}
    return found


# ---------------------------------------------------------------------------- the parse-and-check phase


class Hung(BaseException):
    """The call still ran after its time (not an Exception: the guard must not catch it)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise ``Hung`` in the main thread once ``seconds`` have passed (a blocking open of a pipe too: the
    signal interrupts it)."""
    assert threading.current_thread() is threading.main_thread()

    def expire(signum, frame):
        raise Hung()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Outcome:
    code: int
    stderr: str
    words: list[str]


def parse_phase(world: World, name: str, words: list[str]) -> Outcome:
    """``build_parser().parse_args(words)`` of script ``name`` under the guard ``main`` runs it in, in the
    project folder; the exit code (0: accepted) and what went to stderr."""
    module = load_script(name)
    stderr, cwd = io.StringIO(), os.getcwd()
    os.chdir(world.project)
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            with time_limit(CALL_LIMIT_S), scriptargs.error_guard():
                module.build_parser().parse_args(words)
        code = 0
    except SystemExit as e:
        code = e.code
    except Hung:
        pytest.fail(f"{name} {' '.join(words)}: the checks ran past {CALL_LIMIT_S} s")
    finally:
        os.chdir(cwd)
    return Outcome(code, stderr.getvalue(), words)


# ------------------------------------------------------------------------------ invocations, by kind


def options(parser) -> list:
    """Every argument and option of the parser but --help."""
    return [a for a in parser.arguments if a.dest != "help"]


def valid_number(check) -> str:
    """A number the check takes: the lowest it allows (1 when it allows any)."""
    low = check.above + 1 if check.above is not None else check.low
    return str(1 if low == scriptargs.INT_RANGE[0] else low)


def valid_value(world: World, action) -> str:
    check = action.type
    if action.choices:
        return str(next(iter(action.choices)))
    if isinstance(check, scriptargs.Number):
        return valid_number(check)
    if check is not None and check.kind in world.paths:
        return str(world.paths[check.kind])
    if check is not None and check.kind.startswith("output"):
        return str(world.fresh("new"))
    raise AssertionError(f"{action.dest}: the test has no valid value for {check!r}; teach valid_value")


def count(action) -> int:
    return action.nargs if isinstance(action.nargs, int) else 1


def is_path(action) -> bool:
    return isinstance(action.type, scriptargs.Check) and action.type.kind not in ("number", "text")


def baseline(world: World, parser) -> dict[str, list[str]]:
    """A valid invocation (dest -> values): every required argument and option, and every path option with
    a default (so that no default on this machine decides the outcome)."""
    given = {}
    for action in options(parser):
        positional = not action.option_strings and action.nargs not in ("?", "*")
        if action.required or positional or (is_path(action) and action.default not in (None, [])):
            given[action.dest] = [valid_value(world, action)] * count(action)
    return given


def argv(parser, given: dict[str, list[str] | None]) -> list[str]:
    """Options first (``--opt=VALUE`` for one value, so that ``-inf`` stays a value), then ``--`` and the
    arguments in order; None: a flag switched on."""
    words, arguments = [], []
    for action in options(parser):
        if action.dest not in given:
            continue
        values = given[action.dest]
        if not action.option_strings:
            arguments += values
        elif values is None:
            words.append(action.option_strings[-1])
        elif len(values) == 1:
            words.append(f"{action.option_strings[-1]}={values[0]}")
        else:
            words += [action.option_strings[-1], *values]
    return words + ["--", *arguments] if arguments else words


def own_inputs(parser, given: dict[str, list[str]]) -> set[str]:
    return {value for action in options(parser) if getattr(action.type, "reads", False)
            for value in given.get(action.dest) or []}


def hostile_values(world: World, inputs: set[str]) -> list[tuple[str, str]]:
    """(token, word) pairs: the numbers, the places (made once: the checks write nothing) and the
    invocation's own inputs."""
    places = [(token, str(world.places[token])) for token in PLACES]
    return [(v, v) for v in NUMBERS] + places + [("<input>", path) for path in sorted(inputs)]


def must_refuse(world: World, action, token: str, word: str, inputs: set[str]) -> bool:
    """What the option's kind refuses whatever the rest of the invocation: the oracle is the contract's
    words (a finite number in its range; an input that is there and of its kind; an output that is no
    input and no folder where a file goes), not the checks' code."""
    check = action.type
    if action.choices:
        return True  # no hostile value is one of an option's choices
    if not isinstance(check, scriptargs.Check) or check.kind == "text":
        return False
    if isinstance(check, scriptargs.Number):
        try:
            value = float(word)
        except ValueError:
            return True
        if value != value or abs(value) > 2**63 - 1 or value > check.high:
            return True
        below = check.above is not None and value <= check.above
        return below or (check.low is not None and value < check.low)
    place = world.project / word  # what the word names, from the working folder
    if word == "":
        return True
    if check.kind == "output-file":
        return token == "<unreadable>" or place.is_dir() or word in inputs
    if check.kind == "output-folder":
        return token == "<fifo>" or place.is_file() or word in inputs
    if check.kind == "folder":
        return not place.is_dir()
    if check.kind == "model":
        return not (place.is_file() and check.checkpoints) and word != str(world.paths["model"])
    if check.kind == "file":
        return not place.is_file() and not (token == "<fifo>" and check.pipes)
    if check.kind == "config":
        return word != str(world.paths["config"])
    raise AssertionError(f"{action.dest}: the test knows no kind {check.kind!r}; teach must_refuse")


def assert_contract(outcome: Outcome, before: dict, after: dict) -> None:
    where = " ".join(outcome.words)
    assert after == before, f"{where}: the checks wrote or changed files"
    assert "Traceback" not in outcome.stderr, f"{where}:\n{outcome.stderr}"
    if outcome.code == 0:
        assert outcome.stderr == "", f"{where}: accepted, but said {outcome.stderr!r}"
    else:
        assert outcome.code in CONTRACT_CODES, f"{where}: exit {outcome.code}: {outcome.stderr}"
        assert_one_error_line(outcome.stderr)


# ------------------------------------------------------------------------------------------ the tests


def test_the_scripts_are_found():
    assert {"bench_prefix", "bench_constraints", "bootstrap_guided", "eflomal_align", "check_growth",
            "check_prepare"} <= set(SCRIPTS)
    assert "benchlib" not in SCRIPTS and "scriptargs" not in SCRIPTS
    # the benchmarks in scripts/bench/, the tools users run in scripts/
    assert {p.parent.name for name in SCRIPTS for p in [script_path(name)]} == {"scripts", "bench"}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_checks_its_arguments_first(name):
    """``build_parser()`` gives a ScriptParser; every option that takes a value takes it through a check or
    a list of choices (text options aside); ``main`` is guarded and parses first; ``__main__`` calls it."""
    module = load_script(name)
    assert hasattr(module, "build_parser"), f"{script_path(name)} has no build_parser()"
    parser = module.build_parser()
    assert isinstance(parser, scriptargs.ScriptParser)
    for action in options(parser):
        assert action.type is None or isinstance(action.type, scriptargs.Check), \
            f"{name} {action.dest}: type {action.type!r} is no scriptargs check (Number, InputFile, ...)"
    assert getattr(module.main, "error_guard", False), f"{name}: main is not @scriptargs.guarded"
    tree = ast.parse(script_path(name).read_text(encoding="utf-8"))
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    assert ast.unparse(main.body[0]) == "args = build_parser().parse_args(argv)", \
        f"{name}: main's first statement must parse and check: {ast.unparse(main.body[0])}"
    block = next(node for node in tree.body
                 if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    assert "main" in {n.id for n in ast.walk(block) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_option_takes_every_hostile_value(world, name):
    parser = load_script(name).build_parser()
    given = baseline(world, parser)
    before = world.snapshot()
    outcome = parse_phase(world, name, argv(parser, given))
    assert (outcome.code, outcome.stderr) == (0, ""), f"the baseline {outcome.words} is refused"
    inputs = own_inputs(parser, given)
    for action in options(parser):
        if action.nargs == 0:  # a flag: switched on
            changes = [("<on>", None)]
        else:
            changes = hostile_values(world, inputs)
        for token, word in changes:
            before = world.snapshot()
            values = None if word is None else [word] * count(action)
            outcome = parse_phase(world, name, argv(parser, {**given, action.dest: values}))
            assert_contract(outcome, before, world.snapshot())
            if word is not None and must_refuse(world, action, token, word, inputs):
                assert outcome.code in CONTRACT_CODES, f"{name} {outcome.words}: {token} accepted"
                line = outcome.stderr.strip()
                named = scriptargs.spelling(action)
                assert any(part in line for part in named.split("/")), f"{line!r} does not name {named}"


@pytest.mark.parametrize(("raised", "code"), [
    (ConfigError("a.yaml: model.x: unknown key"), 2), (DataError("src.txt: no such file"), 3),
    (CheckpointError("ckpt.pt: corrupt"), 4), (ResourceError("out: no space left on device"), 5),
    (FileNotFoundError(2, "No such file or directory", "gone.txt"), 3),
    (PermissionError(13, "Permission denied", "locked.txt"), 5), (MemoryError(), 5),
    (KeyboardInterrupt(), 130), (RuntimeError("a bug\nsecond line"), 1),
])  # fmt: skip
@pytest.mark.parametrize("debug", [False, True])
def test_the_guard_turns_what_main_raises_into_one_line(raised, code, debug):
    @scriptargs.guarded
    def main(argv=None):
        raise raised

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as stopped:
        main(["--debug"] if debug else [])
    assert stopped.value.code == code
    lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
    assert lines[-1].startswith("error: ")
    if debug:
        assert "Traceback" in stderr.getvalue()  # before the line, and the exit code kept
    else:
        assert_one_error_line(stderr.getvalue())
    if isinstance(raised, OSError):
        assert raised.filename in lines[-1]


# ------------------------------------------------------------------------ the real main, in a process


def write_config(path: Path, train: dict) -> Path:
    path.write_text(json.dumps({"data": {"src_lang": "en", "tgt_lang": "de", "train": train},
                                "tokenizer": {"vocab_size": 64}, "model": TINY_MODELS["transformer"],
                                "train": TINY_TRAIN}), encoding="utf-8")
    return path


def test_each_kind_of_script_refuses_in_one_line_from_its_real_main(tmp_path):
    """In processes of their own, at once: a model reader (bench_prefix: a missing --src is exit 3; lines
    that differ, found after the checks, exit 3 too), its sibling without --src (argparse's usage error, one
    line), a training driver (bootstrap_guided: a TSV corpus, refused before any training, naming
    data.train, with nothing written), a tool (eflomal_align: its output onto its input) and a checker
    (check_growth: --steps below its floor)."""
    run = tmp_path / "run"
    run.mkdir()
    write_marker(RunDir(run))
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    one.write_text("a\n", encoding="utf-8")
    two.write_text("a\nb\n", encoding="utf-8")
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("a\tb\n", encoding="utf-8")
    config = write_config(tmp_path / "tsv.yaml", {"format": "tsv", "path": str(tsv)})
    out = tmp_path / "boot"
    cases = {
        "missing --src": (["bench_prefix.py", str(run), "--src", str(tmp_path / "none.txt"), "--ref",
                           str(one)], 3, "--src"),
        "lines differ": (["bench_prefix.py", str(run), "--src", str(one), "--ref", str(two)], 3, "lines"),
        "no --src": (["bench_constraints.py", str(run)], 2, "--src"),
        "a TSV corpus": (["bootstrap_guided.py", str(config), "--guided", str(config), "--out", str(out)], 2,
                         "data.train"),
        "output onto input": (["eflomal_align.py", "--src", str(one), "--tgt", str(one), "-o", str(one)], 2,
                              "--output"),
        "too few steps": (["check_growth.py", "--steps", "10"], 2, "--steps"),
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    children = {what: subprocess.Popen([sys.executable, str(script_path(Path(words[0]).stem)), *words[1:]],
                                       cwd=REPO, env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
                for what, (words, _, _) in cases.items()}
    for what, child in children.items():
        _, stderr = child.communicate(timeout=300)
        _, code, named = cases[what]
        assert child.returncode == code, (what, stderr)
        assert named in assert_one_error_line(stderr), (what, stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no --out made, nothing written
    assert one.read_text(encoding="utf-8") == "a\n"
