"""A property test of the whole command line (docs/RELIABILITY.md, "nothing lost"): it walks the Typer app
itself, so an option added later is covered without touching this file.

For every command and every option of it, the command runs on a valid invocation (``BASELINES``) with that
option given a hostile value: ``inf``, ``-inf``, ``nan``, ``-1``, ``0``, ``2**70``, an empty string, a
folder, a missing path, a named pipe with no writer, a file without read permission (when not root: root
reads it anyway), and each file the invocation reads (its own input as its output). A flag is switched
on instead. Then hypothesis draws several such options at once. Every run either succeeds or prints
exactly one ``error:`` line with a contract exit code (2 usage, 3 data, 4 model, 5 resources), never a
traceback, and every file that existed before is byte for byte the same after (the whole world is
hashed). A run that waits on the named pipe is stopped after a second: waiting for a writer is what a
reader of a pipe does, and nothing may have changed by then.

Runs are in-process (Typer's runner), in a scratch working folder that holds a user's project (a config
and a corpus), so an empty path is that folder.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import signal
import threading
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import typer.main
from helpers import assert_one_error_line, hash_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.cli.contract import DECLARED

CONTRACT_CODES = {0, 2, 3, 4, 5}
ROOT = os.geteuid() == 0
# Values for any option, named so that a failure says which; the path-like ones are made per run.
NUMBERS = ["inf", "-inf", "nan", "-1", "0", str(2**70), ""]
PLACES = ["<folder>", "<missing>", "<fifo>"] + ([] if ROOT else ["<unreadable>"])

# A valid invocation of every command: positional arguments, then options (name -> values), in the world's
# terms (<run>, <src>, ...; <new> is a fresh path per run). A command added to the app needs one here.
BASELINES: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    "prepare": (["<config>"], {"--run-dir": ["<new>"]}),
    "train": (["<config>"], {"--run-dir": ["<new>"], "--set": ["train.max_steps=1"]}),
    "toy-data": (["<new>"], {"--train-size": ["3"], "--dev-size": ["2"], "--test-size": ["2"]}),
    "translate": (["<run>", "monday , 3 june 2001"], {}),
    "eval": (["<run>"], {"--src": ["<src>"], "--ref": ["<tgt>"]}),
    "score": (["<run>"], {"--src": ["<src>"], "--tgt": ["<tgt>"]}),
    "plot": (["<run>", "monday , 3 june 2001"], {"--out": ["<new>"], "--layer": ["1"], "--head": ["1"]}),
    "align": (["<run>"], {"--src": ["<src>"], "--tgt": ["<tgt>"]}),
    "attribute": (["<run>"], {"--src": ["<src>"], "--tgt": ["<tgt>"], "--method": ["saliency"]}),
    "plot-curves": (["<run>"], {"--out": ["<new>.png"]}),
    "average": (["<ckpt>", "<member>"], {"--out": ["<new>.pt"]}),
    "info": (["<run>"], {}),
    "export": (["<ckpt>", "<new>"], {}),
    "heads": (["<run>"], {"--src": ["<src>"], "--tgt": ["<tgt>"], "--limit": ["2"], "--random-draws": ["1"]}),
    # --check: the model loaded, the port bound, and no server left running
    "serve": (["<run>"], {"--check": [], "--port": ["0"]}),
    # a flag's other spelling, given with no values, is written as it is: no growth unless the fuzz asks
    "study": (["<config>"], {"--out": ["<new>"], "--variants": ["sdpa"], "--minutes": ["0.01"],
                             "--no-growth": [], "--max-len": ["64"],
                             "--set": ["train.max_steps=1", "decode.max_len_b=2",
                                       "data.test={format: toy, split: test, size: 2}"]}),
}
READ = ["<run>", "<ckpt>", "<member>", "<src>", "<tgt>", "<config>", "<corpus>"]


@dataclass
class World:
    root: Path
    project: Path  # the working folder: a user's config and corpus
    paths: dict[str, Path]
    counter: itertools.count

    def fresh(self, kind: str) -> Path:
        """A new path in the scratch folder: missing, an empty folder, a pipe or an unreadable file."""
        path = self.root / "scratch" / f"{kind}-{next(self.counter)}"
        if kind == "folder":
            path.mkdir(parents=True)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "unreadable":
            path.write_text("secret\n")
            path.chmod(0)
        return path

    def resolve(self, value: str) -> str:
        """A world value (<run>, <folder>, <new>.png, ...) as a path; anything else as it is."""
        if value.startswith("<new>"):
            return str(self.fresh("new")) + value[len("<new>"):]
        if value in ("<folder>", "<missing>", "<fifo>", "<unreadable>"):
            return str(self.fresh(value.strip("<>")))
        return str(self.paths[value]) if value in self.paths else value

    def hashes(self) -> dict[str, str]:
        """Every file of the world but the scratch folder, by its sha256."""
        return {f"{top}/{name}": digest for top in ("run", "project") for name, digest in
                hash_tree(self.root / top).items()}


@pytest.fixture(scope="module")
def world(tiny, tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("fuzz")
    run = root / "run"
    shutil.copytree(tiny.reference("transformer"), run, ignore=shutil.ignore_patterns(".lock"))
    checkpoints = sorted(run.glob("checkpoints/step_*.pt"))
    project = root / "project"
    (project / "data").mkdir(parents=True)
    shutil.copy(tiny.config["transformer"], project / "config.yaml")
    src, tgt = project / "data" / "train.en", project / "data" / "train.de"
    src.write_text("monday , 3 june 2001\nsaturday the 4th of april 2004\n", encoding="utf-8")
    tgt.write_text("montag , 3. juni 2001\nsamstag , 4. april 2004\n", encoding="utf-8")
    paths = {"<run>": run, "<ckpt>": checkpoints[-1], "<member>": checkpoints[-2], "<src>": src, "<tgt>": tgt,
             "<config>": project / "config.yaml", "<corpus>": project / "data"}
    return World(root, project, paths, itertools.count())


@functools.cache
def commands() -> dict[str, object]:
    return typer.main.get_command(app).commands


def every_option() -> list[tuple[str, str]]:
    return [(name, param.name) for name, command in commands().items() for param in command.params]


class Waited(BaseException):
    """The run still waited after its time (not an Exception: the command's error guard must not catch it)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise ``Waited`` in the main thread once ``seconds`` have passed (and again every 0.2 s until the block
    is left). The signal goes to the main thread itself (``pthread_kill``): a process-wide timer may land on
    another thread, and then a blocking ``open`` of a pipe in the main thread would wait on for ever."""

    def expire(signum, frame):
        raise Waited()

    signal.signal(signal.SIGALRM, expire)
    done, main = threading.Event(), threading.main_thread().ident

    def watch() -> None:
        if done.wait(seconds):
            return
        while True:
            signal.pthread_kill(main, signal.SIGALRM)
            if done.wait(0.2):
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGALRM, lambda signum, frame: None)  # a signal still on its way does nothing


def release_fifos(world: World) -> None:
    """Open every pipe of the world for writing and close it: a thread still blocked opening one to read
    (translate's input reader) gets its end of file and leaves."""
    for fifo in (world.root / "scratch").glob("fifo-*"):
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@dataclass
class Invocation:
    words: list[str]
    written: list[Path]  # what the declared outputs name, where it is no input's (the command may write it)


def argv(world: World, command: str, changes: dict[str, list[str] | None]) -> Invocation:
    """The baseline of ``command`` with each changed parameter (by Click name) given its values (None: a
    flag switched on); positional arguments go after ``--`` so that a value such as ``-1`` stays one."""
    positional, options = BASELINES[command]
    params = {p.name: p for p in commands()[command].params}
    arguments = [p for p in params.values() if not p.opts[0].startswith("-")]
    given = {arguments[i].name: [value] for i, value in enumerate(positional[:len(arguments)])}
    if len(positional) > len(arguments) or (arguments and arguments[-1].nargs == -1):
        given[arguments[-1].name] = positional[len(arguments) - 1:]
    given.update({next(p.name for p in params.values() if flag in (*p.opts, *p.secondary_opts)):
                  values or flag for flag, values in options.items()})
    given.update(changes)
    given = {name: values if values is None or isinstance(values, str)
             else [world.resolve(v) if v.startswith("<") else v for v in values]
             for name, values in given.items()}
    words = [command]
    for name, values in given.items():
        param = params[name]
        if isinstance(values, str):  # a flag as the baseline spells it
            words.append(values)
        elif param.opts[0].startswith("-"):
            words += [param.opts[0]] if values is None else [w for v in values for w in (param.opts[0], v)]
    words.append("--")
    for param in arguments:
        words += given.get(param.name) or []
    declared = DECLARED[command]
    read = [(world.project / v).resolve() for name in declared.inputs for v in given.get(name) or []]
    # A file output may replace a file, a run folder's files are its command's; any other folder output
    # only adds files.
    written = [(world.project / v).resolve() for name, output in declared.outputs.items()
               for v in given.get(name) or [] if output.run or not output.folder]
    return Invocation(words, [w for w in written if not any(w == r or w.is_relative_to(r) for r in read)])


def invoke_in(world: World, words: list[str], limit: float, fifo: bool):
    """``attnmt WORDS`` in the project folder within ``limit`` seconds; None when it was still waiting (only
    allowed with a pipe)."""
    cwd = os.getcwd()
    deterministic = torch.are_deterministic_algorithms_enabled()
    os.chdir(world.project)
    try:
        with time_limit(limit):
            return CliRunner().invoke(app, words)
    except Waited:
        assert fifo, f"attnmt {' '.join(words)} ran past its time"
        return None
    finally:
        os.chdir(cwd)
        torch.use_deterministic_algorithms(deterministic)
        release_fifos(world)


def check_run(world: World, invocation: Invocation) -> None:
    """Run ``attnmt WORDS`` in the project folder; assert the contract, and that no file changed but what
    the command was asked to write."""
    words = invocation.words
    before = world.hashes()
    fifo = any("fifo-" in w for w in words)
    # With a pipe, the command works (draws, decodes) before it opens it, and on a loaded machine the alarm
    # may land inside a library that turns it into an error of its own (matplotlib: "Invalid bounding
    # box"): a run with a pipe that ends in an internal error is run once more with 10 seconds.
    for limit in (0.5, 10.0) if fifo else (60.0,):
        result = invoke_in(world, words, limit, fifo)
        if result is None or result.exit_code != 1:
            break
    after = world.hashes()
    kept = {name: digest for name, digest in before.items()
            if not any((world.root / name).resolve().is_relative_to(w) for w in invocation.written)}
    assert {name: after.get(name) for name in kept} == kept, f"attnmt {' '.join(words)} changed files"
    if result is None:
        return
    assert result.exit_code in CONTRACT_CODES, (words, result.output, result.exception)
    if result.exit_code != 0:
        assert_one_error_line(result.stderr)


def own_inputs(command: str) -> list[str]:
    """The world's files and folders that the baseline of ``command`` reads (a run folder: its checkpoint
    too)."""
    positional, options = BASELINES[command]
    used = {v for v in positional + [v for values in options.values() for v in values] if v in READ}
    return [value for value in READ if value in used or (value == "<ckpt>" and "<run>" in used)]


def hostile_values(command: str, name: str) -> list[list[str] | None]:
    """A flag: switched on. A path: an empty string, a name that looks like an option, a folder, a missing
    path, a pipe, an unreadable file, and each input of the command. Anything else: the numbers, a folder, a
    missing path and an input file (all of which a number or a choice must refuse in one line)."""
    param = next(p for p in commands()[command].params if p.name == name)
    if getattr(param, "is_flag", False):
        return [None]
    annotation = param.type_descriptor.annotation  # Typer's own record of the parameter's type
    if annotation is Path or typing.get_args(annotation) == (Path,):
        values = ["", "-1"] + PLACES + own_inputs(command)
    else:
        values = NUMBERS + ["<folder>", "<missing>"] + own_inputs(command)[-1:]
    return [[value] for value in values]


@pytest.mark.parametrize(("command", "name"), every_option())
def test_every_option_takes_every_hostile_value(world, command, name):
    for values in hostile_values(command, name):
        check_run(world, argv(world, command, {name: values}))


def test_every_command_has_a_baseline_and_a_declaration():
    assert set(commands()) == set(BASELINES) == set(DECLARED)


@st.composite
def hostile_invocations(draw):
    command = draw(st.sampled_from(sorted(BASELINES)))
    params = [p.name for p in commands()[command].params]
    names = draw(st.lists(st.sampled_from(params), min_size=2, max_size=4, unique=True))
    changes = {}
    for name in names:
        param = next(p for p in commands()[command].params if p.name == name)
        if getattr(param, "is_flag", False):
            changes[name] = None
        else:
            changes[name] = [draw(st.sampled_from(NUMBERS + PLACES + READ))]
    return command, changes


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(hostile_invocations())
def test_several_hostile_options_at_once(world, invocation):
    command, changes = invocation
    check_run(world, argv(world, command, changes))
