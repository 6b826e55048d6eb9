"""A property test of the whole command line (docs/RELIABILITY.md, "nothing lost"): it walks the Typer app
itself, so an option added later is covered without touching this file.

For every command and every option of it, the command runs on a valid invocation (``BASELINES``) with that
option given a hostile value: ``inf``, ``-inf``, ``nan``, ``-1``, ``0``, ``2**70``, an empty string, a
folder, a missing path, a named pipe with no writer, a file without read permission (when not root: root
reads it anyway), a plain ``pickle.dump`` file, and each file the invocation reads (its own input as its
output). A flag is switched on instead. Then hypothesis draws several such options at once. Every run
either succeeds, with no library's warning on stderr, or prints exactly one ``error:`` line with a
contract exit code (2 usage, 3 data, 4 model, 5 resources), never a traceback, and every file that
existed before is byte for byte the same after (the whole world is hashed). A run that waits on the
named pipe is stopped after a second: waiting for a writer is what a reader of a pipe does, and nothing
may have changed by then.

Every command that writes (its declared outputs) also runs with its outputs replaced: a file the user set
to 0600 (and another owner) stays so, and a new one gets the umask's mode; and on a full filesystem (a
tmpfs, filled: this needs root, as CI has, or ``unshare --map-root-user --mount``; never skipped) and under
a file-size limit: exit 5, one line naming a path, nothing changed.

Runs are in-process (Typer's runner), in a scratch working folder that holds a user's project (a config
and a corpus), so an empty path is that folder.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import itertools
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import typer.main
from helpers import assert_one_error_line, hash_tree, hostile_place
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marian_fixture import make_marian
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
    # the tiny teacher's translations are empty lines (dropped by prepare): the original pairs train
    "distill": (["<run>", "<config>"], {"--run-dir": ["<new>"], "--keep-original": [],
                                        "--set": ["train.max_steps=1", "data.max_dropped_fraction=1"]}),
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
    "shortlist": (["<run>"], {"--out": ["<new>.pt"], "--per-piece": ["3"], "--frequent": ["2"]}),
    "export": (["<ckpt>", "<new>"], {}),
    "import": (["<marian>", "<new>.pt"], {}),
    "heads": (["<run>"], {"--src": ["<src>"], "--tgt": ["<tgt>"], "--limit": ["2"], "--random-draws": ["1"]}),
    # --check: the model loaded, the port bound, and no server left running
    "serve": (["<run>"], {"--check": [], "--port": ["0"]}),
    # a flag's other spelling, given with no values, is written as it is: no growth unless the fuzz asks
    "study": (["<config>"], {"--out": ["<new>"], "--variants": ["sdpa"], "--minutes": ["0.01"],
                             "--no-growth": [], "--max-len": ["64"],
                             "--set": ["train.max_steps=1", "decode.max_len_b=2",
                                       "data.test={format: toy, split: test, size: 2}"]}),
}
READ = ["<run>", "<ckpt>", "<member>", "<src>", "<tgt>", "<config>", "<corpus>", "<marian>"]


@dataclass
class World:
    root: Path
    project: Path  # the working folder: a user's config and corpus
    paths: dict[str, Path]
    counter: itertools.count

    def fresh(self, kind: str) -> Path:
        """A new path in the scratch folder: missing, an empty folder, a pipe, an unreadable file, a
        pickle."""
        return hostile_place(self.root / "scratch", kind, next(self.counter))

    def resolve(self, value: str) -> str:
        """A world value (<run>, <folder>, <new>.png, ...) as a path; anything else as it is."""
        if value.startswith("<new>"):
            return str(self.fresh("new")) + value[len("<new>"):]
        if value in ("<folder>", "<missing>", "<fifo>", "<unreadable>", "<pickle>"):
            return str(self.fresh(value.strip("<>")))
        return str(self.paths[value]) if value in self.paths else value

    def hashes(self) -> dict[str, str]:
        """Every file of the world but the scratch folder, by its sha256."""
        return {f"{top}/{name}": digest for top in ("run", "project") for name, digest in
                hash_tree(self.root / top).items()}


@pytest.fixture(scope="module")
def world(tiny, tmp_path_factory) -> World:
    return make_world(tiny, tmp_path_factory.mktemp("fuzz"))


def make_world(tiny, root: Path, marian: bool = True) -> World:
    """The baselines' world in ``root``: the tiny run, two of its checkpoints, a project with a config and a
    corpus, and (``marian``) an OPUS-MT folder to import."""
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
    if marian:
        paths["<marian>"] = make_marian(project / "opus-mt-tiny")
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


def baseline(command: str) -> dict[str, list[str] | str]:
    """The baseline of ``command`` by Click name: each parameter's values in the world's terms (a flag: as
    the baseline spells it)."""
    positional, options = BASELINES[command]
    params = {p.name: p for p in commands()[command].params}
    arguments = [p for p in params.values() if not p.opts[0].startswith("-")]
    given = {arguments[i].name: [value] for i, value in enumerate(positional[:len(arguments)])}
    if len(positional) > len(arguments) or (arguments and arguments[-1].nargs == -1):
        given[arguments[-1].name] = positional[len(arguments) - 1:]
    given.update({next(p.name for p in params.values() if flag in (*p.opts, *p.secondary_opts)):
                  values or flag for flag, values in options.items()})
    return given


def argv(world: World, command: str, changes: dict[str, list[str] | None]) -> Invocation:
    """The baseline of ``command`` with each changed parameter (by Click name) given its values (None: a
    flag switched on); positional arguments go after ``--`` so that a value such as ``-1`` stays one."""
    params = {p.name: p for p in commands()[command].params}
    arguments = [p for p in params.values() if not p.opts[0].startswith("-")]
    given = baseline(command)
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


@contextlib.contextmanager
def warnings_on_stderr():
    """Warnings shown as a process shows them (a line on stderr: what pytest replaces with its own record),
    each time (Python's default shows one once per place), unless the command routes them elsewhere."""

    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        yield


def invoke_in(world: World, words: list[str], limit: float, fifo: bool):
    """``attnmt WORDS`` in the project folder within ``limit`` seconds; None when it was still waiting (only
    allowed with a pipe)."""
    cwd = os.getcwd()
    deterministic = torch.are_deterministic_algorithms_enabled()
    os.chdir(world.project)
    try:
        with time_limit(limit), warnings_on_stderr():
            return CliRunner().invoke(app, words)
    except Waited:
        assert fifo, f"attnmt {' '.join(words)} ran past its time"
        return None
    finally:
        os.chdir(cwd)
        torch.use_deterministic_algorithms(deterministic)
        release_fifos(world)


def assert_no_warning_lines(stderr: str) -> None:
    """No library's warning on stderr (``--debug`` shows them, through the log)."""
    assert not re.search(r"^\S.*\b\w*Warning: ", stderr, re.MULTILINE), stderr


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
    else:
        assert_no_warning_lines(result.stderr)


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
        values = ["", "-1", "<pickle>"] + PLACES + own_inputs(command)
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


# ------------------------------------------------------------------- outputs: modes, full disks, size limits
#
# Every command that writes (its ``@command(outputs=...)`` declaration) runs once with its outputs given new
# paths: each file and folder it makes has the umask's mode. Then they are set to 0600 (folders 0700) and,
# as root, given another owner, and the same command replaces them: they keep what the user set. Then it
# writes again over a copy of that first run's outputs on a full filesystem (a tmpfs, filled), and under a
# file-size limit of 0 bytes (RLIMIT_FSIZE; SIGXFSZ is ignored, so a write fails with EFBIG): exit 5, one
# line naming a path there, and every file that was there, or anywhere in the world, is the same after.

UMASK = 0o027  # not the usual 0o022: a mode written into the code shows
FILE_MODE, FOLDER_MODE = 0o666 & ~UMASK, 0o777 & ~UMASK
OTHER_OWNER = (4321, 4322)
SUFFIXES = {"html": ".html", "json_path": ".json"}
# Commands whose second run writes new paths, not the first run's again: export's folder must be new or
# empty; toy-data writing the same toy data and a study with every variant done have nothing to do.
WRITES_NEW = {"export", "toy-data", "study"}
# What makes a second run write something (train: one step more than the first run).
AGAIN = {"train": {"set_": ["train.max_steps=2"]},
         "distill": {"set_": ["train.max_steps=2", "data.max_dropped_fraction=1"]}}
# Outputs that one run cannot write together, each group with what its run changes besides (by Click
# name; []: the baseline's option left out). plot --html reads --tgt: the tiny model's own translation
# may be empty.
SEPARATE = {"plot": [("out",), ("html", {"out": [], "layer": [], "head": [], "sentences": [],
                                         "input_": ["<src>"], "tgt": ["<tgt>"]})],
            "align": [("output",), ("hyp_out", {"tgt": []})]}
# Files that a second run does not give what the user set, and why: each must still be so (else it leaves
# this list), and nothing else may be.
NOT_KEPT_YET: dict[str, dict[str, str]] = {}


@dataclass(frozen=True)
class Case:
    """A command run with some of its outputs, and what that run changes in the baseline besides."""

    command: str
    outputs: tuple[str, ...]
    changes: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def id(self) -> str:
        together = len(self.outputs) == len(DECLARED[self.command].outputs)
        return self.command if together else f"{self.command}-{'-'.join(self.outputs)}"


def writing_cases() -> list[Case]:
    cases = []
    for command in sorted(c for c, declared in DECLARED.items() if declared.outputs):
        for group in SEPARATE.get(command, [tuple(DECLARED[command].outputs)]):
            extra = next((item for item in group if isinstance(item, dict)), {})
            cases.append(Case(command, tuple(item for item in group if isinstance(item, str)),
                              tuple((name, tuple(values)) for name, values in extra.items())))
    return cases


@dataclass
class Written:
    case: Case
    folder: Path  # the first run's outputs, each at ``folder/<parameter name><suffix>``
    changes: dict[str, list[str]]  # the first run's changes to the baseline, by Click name

    def again(self, folder: Path | None = None) -> dict[str, list[str]]:
        """The changes of a second run, its outputs moved into ``folder`` when given."""
        changes = {**self.changes, **AGAIN.get(self.case.command, {})}
        old, new = str(self.folder), str(folder or self.folder)
        return {name: [value.replace(old, new) for value in values] for name, values in changes.items()}


def output_changes(case: Case, folder: Path) -> dict[str, list[str]]:
    """The outputs of ``case`` given paths in ``folder`` (with the suffixes the baseline gives them), and the
    case's other changes."""
    given = baseline(case.command)
    changes = {name: list(values) for name, values in case.changes}
    for name in case.outputs:
        value = (given.get(name) or [""])[0]
        suffix = value[len("<new>"):] if value.startswith("<new>") else SUFFIXES.get(name, "")
        file = not DECLARED[case.command].outputs[name].folder
        changes[name] = [str(folder / f"{name}{suffix or ('.txt' if file else '')}")]
    return changes


def invoke_limited(world: World, words: list[str], file_size: int | None = None):
    """``attnmt WORDS`` in the project folder under ``UMASK`` and, when given, a file-size limit (for this
    call only: the test process writes too)."""
    cwd, deterministic = os.getcwd(), torch.are_deterministic_algorithms_enabled()
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    # Not SIG_IGN, as Python starts with (nor the default, which would kill pytest): the command line ignores
    # SIGXFSZ itself, checked after the run.
    xfsz = signal.signal(signal.SIGXFSZ, lambda signum, frame: None)
    umask = os.umask(UMASK)
    os.chdir(world.project)
    try:
        if file_size is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, limit[1]))
        with warnings_on_stderr():
            result = CliRunner().invoke(app, words)
        assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN, "attnmt must ignore SIGXFSZ"
        return result
    finally:
        signal.signal(signal.SIGXFSZ, xfsz)
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        os.umask(umask)
        os.chdir(cwd)
        torch.use_deterministic_algorithms(deterministic)


def assert_succeeded(words: list[str], result) -> None:
    assert result.exit_code == 0, (words, result.output, result.exception)
    assert_no_warning_lines(result.stderr)


def modes(folder: Path) -> dict[str, tuple[int, int, int, int]]:
    """Relative path -> (permission bits, owner, group, inode) of everything under ``folder``."""
    found = {}
    for path in folder.rglob("*"):
        info = path.lstat()
        found[str(path.relative_to(folder))] = (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid,
                                                info.st_ino)
    return found


def umask_modes(folder: Path, names) -> dict[str, str]:
    """Those of ``names`` under ``folder`` whose mode is not the umask's, with their mode."""
    return {name: oct(stat.S_IMODE((folder / name).lstat().st_mode)) for name in names
            if stat.S_IMODE((folder / name).lstat().st_mode) != (FOLDER_MODE if (folder / name).is_dir()
                                                                 else FILE_MODE)}


@pytest.fixture(scope="module")
def first_runs(world):
    """``first_run(case)``: the case run once (per module) with its outputs new, asserted to succeed and to
    make every file and folder with the umask's mode."""
    done: dict[Case, Written] = {}

    def first_run(case: Case) -> Written:
        if case not in done:
            folder = world.root / "outputs" / case.id
            folder.mkdir(parents=True)
            written = Written(case, folder, output_changes(case, folder))
            words = argv(world, case.command, written.changes).words
            assert_succeeded(words, invoke_limited(world, words))
            made = modes(folder)
            assert made and not umask_modes(folder, made), (words, umask_modes(folder, made))
            done[case] = written
        return done[case]

    return first_run


CASES = writing_cases()


def test_every_output_of_every_command_has_a_case():
    covered = {(case.command, name) for case in CASES for name in case.outputs}
    assert covered == {(command, name) for command, declared in DECLARED.items() for name in declared.outputs}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_replaced_output_keeps_its_mode_and_owner(world, first_runs, case):
    written = first_runs(case)
    folder, owner = written.folder, OTHER_OWNER if ROOT else (os.getuid(), os.getgid())
    for path in folder.rglob("*"):
        os.chown(path, *owner)
        path.chmod(0o700 if path.is_dir() else 0o600)
    before = modes(folder)
    if case.command not in WRITES_NEW:
        words = argv(world, case.command, written.again()).words
        assert_succeeded(words, invoke_limited(world, words))
    after = modes(folder)
    lost = {name for name in before if name in after
            and after[name][:3] != (0o700 if (folder / name).is_dir() else 0o600, *owner)}
    assert lost == set(NOT_KEPT_YET.get(case.command, {})), {name: after[name][:3] for name in lost}
    assert not umask_modes(folder, set(after) - set(before))  # what the second run made anew
    # The check has teeth: the second run replaced every file output (and something in each folder output).
    replaced = {name for name in before if name in after and after[name][3] != before[name][3]}
    if case.command not in WRITES_NEW:
        assert all(any(name == output or name.startswith(f"{output}/") for name in replaced)
                   for output in (Path(v).name for name in case.outputs for v in written.changes[name]))


class FullDisk:
    """A tmpfs of its own: ``fill`` takes every byte left (a file of zeros), ``empty`` gives them back."""

    def __init__(self, mount: Path) -> None:
        self.mount, self.filler = mount, mount / "filler"

    def fill(self) -> None:
        gc.collect()  # a run's memory maps of files removed since (a copied run's splits) hold their pages
        fd, size = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND), 1 << 20
        try:
            while size:
                try:
                    os.write(fd, bytes(size))
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    size //= 2
        finally:
            os.close(fd)
        self.assert_full()

    def assert_full(self) -> None:
        """Not one byte more fits: the test tests what it says."""
        with pytest.raises(OSError, match="No space left"):
            (self.mount / "probe").write_bytes(b"x")
        (self.mount / "probe").unlink()

    def empty(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def full_disk(world):
    """A 32 MiB tmpfs mounted for this module: as root (CI runs as root), or under ``unshare --map-root-user
    --mount`` where user namespaces are allowed. Never skipped: a test that cannot fill a disk fails."""
    mount = world.root / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs to fill ({done.stderr.strip()}): run as root, or where user "
                    "namespaces are allowed: unshare --map-root-user --mount .venv/bin/python -m pytest "
                    "tests/cli/test_cli_fuzz.py")
    try:
        yield FullDisk(mount)
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def place(written: Written, folder: Path) -> None:
    """A copy of the first run's outputs in ``folder``, for the next run to replace (none for
    ``WRITES_NEW``)."""
    folder.mkdir(parents=True)
    if written.case.command not in WRITES_NEW:
        shutil.copytree(written.folder, folder, dirs_exist_ok=True, symlinks=True)


def assert_fails_keeping(world: World, written: Written, folder: Path, file_size: int | None = None,
                         full: FullDisk | None = None) -> None:
    """The case run again with its outputs in ``folder`` (on the ``full`` disk, or under the ``file_size``
    limit): exit 5, one line naming a path in ``folder``, and nothing changed there or in the world."""
    words = argv(world, written.case.command, written.again(folder)).words
    before, world_before = hash_tree(folder), world.hashes()
    result = invoke_limited(world, words, file_size)
    if full is not None:
        full.assert_full()  # still: nothing freed space while it ran
    assert result.exit_code == 5, (words, result.output, result.exception)
    line = assert_one_error_line(result.stderr)
    assert str(folder) in line, line
    assert hash_tree(folder) == before, f"attnmt {' '.join(words)} changed files"
    assert world.hashes() == world_before


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_full_disk_is_exit_5_and_loses_nothing(world, first_runs, full_disk, case):
    written, folder = first_runs(case), full_disk.mount / case.id
    try:
        place(written, folder)
        full_disk.fill()
        assert_fails_keeping(world, written, folder, full=full_disk)
    finally:
        full_disk.empty()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_file_size_limit_is_exit_5_and_loses_nothing(world, first_runs, case):
    written, folder = first_runs(case), world.root / "limited" / case.id
    place(written, folder)
    assert_fails_keeping(world, written, folder, file_size=0)


ESCAPED = {
    "full-disk": (OSError(errno.ENOSPC, "No space left on device"), 5,
                  "OUT_DIR {out}: cannot write: no space left on device"),
    "read-only": (OSError(errno.EROFS, "Read-only file system", "/media/x"), 5,
                  "/media/x: read-only file system"),
    "no-memory": (OSError(errno.ENOMEM, "Cannot allocate memory"), 5, "out of memory"),
    "a-bug": (OSError(errno.EIO, "Input/output error"), 1,
              "internal error: OSError: [Errno 5] Input/output error (run with --debug for a traceback)"),
}


@pytest.mark.parametrize(("error", "code", "line"), ESCAPED.values(), ids=ESCAPED.keys())
def test_an_os_error_that_escapes_the_library_is_one_line(world, monkeypatch, error, code, line):
    """The guard's net for a place that does not map its errors yet: a resource's errno is exit 5 naming its
    file, or the outputs being written; any other stays a bug (exit 1)."""
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("attnmt.data.toy.write_toy", fail)
    out = world.fresh("new")
    result = invoke_limited(world, ["toy-data", str(out)])
    assert result.exit_code == code
    assert assert_one_error_line(result.stderr) == "error: " + line.format(out=out)
