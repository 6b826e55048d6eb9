"""The command line under a hostile environment (round 5): text arguments that are not UTF-8, or UTF-8
that the C locale hands over as lone surrogates; a working folder that was deleted; a home that does not
exist or is a file. Every command keeps the contract: success with nothing on stderr, or one ``error:`` line
with a documented code; nothing written in the home.

The text arguments are found by walking the Typer app (every parameter typed ``str``), so one added later
is covered; the environments run ``translate``, ``plot``, ``eval``, ``info`` and ``--help`` as a user runs
them, in processes of their own (the environment is the process's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from helpers import OFFLINE_ENV, assert_one_error_line
from test_cli_fuzz import World, argv, invoke_in, make_world
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.cli.contract import parameters

ATTNMT = Path(sys.executable).with_name("attnmt")
SENTENCE = "monday , 3 june 2001"
NOT_UTF8 = b"caf\xe9 , 3 june 2001"  # Latin-1: what a terminal in another encoding sends
UTF8 = "café , 3 june 2001"


def as_argument(raw: bytes) -> str:
    """``raw`` as Python hands a command-line argument to the program (``surrogateescape``)."""
    return os.fsdecode(raw)


def text_parameters() -> list[tuple[str, str, str]]:
    """(command, Click name, spelling) of every parameter typed ``str`` (or a list of them) in the app."""
    found = []
    for info in app.registered_commands:
        function = info.callback.__wrapped__
        spelled = parameters(function)
        for name, hint in typing.get_type_hints(function, include_extras=True).items():
            base = typing.get_args(hint)[0] if hasattr(hint, "__metadata__") else hint
            flat = [inner for arg in (typing.get_args(base) or (base,))
                    for inner in (typing.get_args(arg) if typing.get_origin(arg) is list else (arg,))]
            if str in flat:
                found.append((info.name or function.__name__, name, spelled[name].spelling))
    return found


TEXT = text_parameters()


@pytest.fixture(scope="module")
def world(tiny, tmp_path_factory) -> World:
    """The fuzz's world (its baselines' run, checkpoints, project and corpus) without an imported model."""
    return make_world(tiny, tmp_path_factory.mktemp("environment"), marian=False)


def test_the_walk_finds_the_text_arguments():
    assert {("translate", "SENTENCES"), ("plot", "SENTENCES"), ("translate", "--tgt-lang"),
            ("train", "--set")} <= {(command, spelling) for command, _, spelling in TEXT}


@pytest.mark.parametrize("command, name, spelling", TEXT, ids=[f"{c}-{s}" for c, _, s in TEXT])
def test_every_text_argument_refuses_bytes_that_are_not_utf8(world, command, name, spelling):
    """Exit 3 before any work, one line naming the argument, the offset and the byte; nothing changes."""
    invocation = argv(world, command, {name: [as_argument(NOT_UTF8)]})
    before = world.hashes()
    result = invoke_in(world, invocation.words, 60.0, False)
    assert result.exit_code == 3, (invocation.words, result.output)
    line = assert_one_error_line(result.stderr)
    assert line.startswith(f"error: {spelling} ") and "byte offset 3 (0xe9)" in line, line
    assert world.hashes() == before


@pytest.mark.parametrize("command, name", [("translate", "sentences"), ("plot", "sentences"),
                                           ("translate", "tgt_lang"), ("eval", "tgt_lang")])
def test_utf8_that_the_c_locale_decoded_byte_by_byte_means_what_was_typed(world, command, name):
    """Under ``LC_ALL=C PYTHONUTF8=0`` Python hands ``café`` over as ``caf\\udcc3\\udca9``: the command does
    what it does with ``café`` (the same exit code and output)."""
    as_typed = argv(world, command, {name: [UTF8]}).words
    escaped = [word.encode("utf-8").decode("ascii", "surrogateescape") for word in as_typed]  # as C decodes
    assert escaped != as_typed
    expected, found = (invoke_in(world, words, 60.0, False) for words in (as_typed, escaped))
    assert found.exit_code == expected.exit_code, (found.output, expected.output)
    clean = [line for line in found.stdout.splitlines() if " in " not in line]  # plot's timing
    assert clean == [line for line in expected.stdout.splitlines() if " in " not in line]
    assert found.stderr == expected.stderr


# ------------------------------------------------------------------------------------ environments


def commands(world, tmp: Path, sentence: bytes) -> dict[str, list[bytes | str]]:
    """The commands each environment runs, their text argument ``sentence``."""
    paths = world.paths
    return {
        "translate": ["translate", paths["<run>"], sentence],
        "plot": ["plot", paths["<run>"], sentence, "--out", tmp / "figures"],
        "eval": ["eval", paths["<run>"], "--src", paths["<src>"], "--ref", paths["<tgt>"], "--json"],
        "info": ["info", paths["<run>"]],
        "--help": ["--help"],
    }


def run_all(argvs: dict[str, list], cwd: Path, env: dict[str, str]) -> dict[str, subprocess.CompletedProcess]:
    """Each command in a process of its own, all at once (each loads torch: seconds)."""
    started = {name: subprocess.Popen([ATTNMT, *map(os.fsencode, args)], cwd=cwd, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for name, args in argvs.items()}
    done = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=180)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


def environment(**changes: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if name not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    return {**env, **OFFLINE_ENV, **changes}


def assert_ok(name: str, result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, (name, result.stderr.decode(errors="replace"))
    assert result.stderr == b"", (name, result.stderr.decode(errors="replace"))


def test_a_deleted_working_folder_is_one_line_before_torch_loads(world, tmp_path):
    """Was oneMKL's "FATAL ERROR: Cannot load libtorch_cpu.so" and exit 2 with no ``error:`` line."""
    gone = tmp_path / "gone"
    # The shell enters the folder and removes it, then becomes attnmt (Popen's cwd must exist).
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    for name, args in commands(world, tmp_path, SENTENCE.encode()).items():
        gone.mkdir()
        result = subprocess.run(["bash", "-c", script, "_", str(gone), str(ATTNMT), *map(str, args)],
                                env=environment(), capture_output=True, timeout=180)
        assert not gone.exists()
        if name == "--help":
            assert_ok(name, result)
            continue
        assert result.returncode == 2, (name, result.stderr)
        line = assert_one_error_line(result.stderr.decode())
        assert "working folder was deleted" in line, line


@pytest.mark.parametrize("home", ["a-file", "missing-at-the-root"])
def test_an_unusable_home_prints_nothing_and_writes_nothing_there(world, tmp_path, home):
    """HOME a file, or a folder that does not exist (as root, matplotlib would make it): every command
    succeeds with nothing on stderr (matplotlib warned twice), and the home stays as it was. Only matplotlib
    looks at the home, so the second case runs what draws (and ``--help``) alone. (A read-only home is the
    first case for matplotlib's test, ``os.access``; root may write anywhere, so it is not made here.)"""
    if home == "a-file":
        place = tmp_path / "home"
        place.write_text("not a folder\n", encoding="utf-8")
    else:
        place = Path("/") / f"attnmt-no-home-{os.getpid()}"
        assert not place.exists()
    before = place.read_bytes() if place.is_file() else None
    try:
        argvs = commands(world, tmp_path, SENTENCE.encode())
        argvs = argvs if home == "a-file" else {name: argvs[name] for name in ("plot", "--help")}
        results = run_all(argvs, tmp_path, environment(HOME=str(place)))
        assert place.exists() == (home == "a-file")
    finally:
        if home != "a-file" and place.is_dir():  # made by a failing run: not left at the root
            shutil.rmtree(place)
    for name, result in results.items():
        assert_ok(name, result)
    assert (place.read_bytes() if place.is_file() else None) == before
    assert sorted(p.name for p in (tmp_path / "figures").iterdir())


def test_the_c_locale_takes_utf8_arguments_and_refuses_other_bytes(world, tmp_path):
    """``LC_ALL=C PYTHONUTF8=0``: a Latin-1 sentence is exit 3 naming SENTENCES and the byte (was exit 1 in
    translate and plot); a path of any bytes is a path (info of a run through a link named ``run\\xe9``);
    UTF-8 text is read and translated as in a UTF-8 locale, the output written in UTF-8."""
    link = tmp_path / os.fsdecode(b"run\xe9")
    link.symlink_to(world.paths["<run>"])
    argvs = commands(world, tmp_path, NOT_UTF8)
    argvs["info"] = ["info", link]
    argvs["eval"] += ["--tgt-lang", NOT_UTF8]
    argvs["utf-8"] = ["translate", world.paths["<run>"], UTF8.encode()]
    results = run_all(argvs, tmp_path, environment(LC_ALL="C", PYTHONUTF8="0", LANG="C"))
    for name, spelling in (("translate", "SENTENCES"), ("plot", "SENTENCES"), ("eval", "--tgt-lang")):
        assert results[name].returncode == 3, (name, results[name].stderr)
        line = assert_one_error_line(results[name].stderr.decode())
        assert line.startswith(f"error: {spelling} ") and "(0xe9)" in line, line
    for name in ("info", "--help", "utf-8"):
        assert_ok(name, results[name])
    expected = CliRunner().invoke(app, ["translate", str(world.paths["<run>"]), UTF8])
    assert expected.exit_code == 0 and results["utf-8"].stdout.decode("utf-8") == expected.stdout
