"""Little memory (round 5): under ``ulimit -v`` between 500 and 700 MB the commands were exit 1 with an empty
ImportError (numpy's, the loader's words at its end), SystemErrors out of imports, a checkpoint "corrupt"
because torch.load could not allocate. What Python can catch is one line, exit 5, wherever it is raised:
inside a command, inside the libraries' imports, and before any command's guard (importing the command
line itself). Native aborts (std::bad_alloc, OpenBLAS, libgomp, a segfault) cannot be caught:
docs/RELIABILITY.md gives the thresholds measured."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from helpers import OFFLINE_ENV, REPO, assert_one_error_line
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.errors import CheckpointError, ConfigError, is_out_of_memory

ATTNMT = [sys.executable, "-m", "attnmt"]
GUARD = sys.modules["attnmt.cli.app"]  # the module (``attnmt.cli.app`` the attribute is the Typer app)


def numpy_import_error() -> None:
    """numpy's ImportError when its BLAS cannot be mapped: the first line empty, the cause at the end."""
    raise ImportError("\n\nIMPORTANT: PLEASE READ THIS FOR ADVICE ON HOW TO SOLVE THIS ISSUE!\n\n...\n"
                      "Original error was: libopenblas.so: failed to map segment from shared object\n")


def loader_error() -> None:
    raise ImportError("libtorch_cpu.so: failed to map segment from shared object")


def system_error_in_an_import() -> None:
    raise SystemError("<function _find_and_load at 0x7f> returned NULL without setting an exception")


def thread_error() -> None:
    raise RuntimeError("Resource temporarily unavailable")  # sentencepiece's std::system_error


def corrupt_checkpoint() -> None:
    """``load_model``'s error for a checkpoint torch.load could not allocate memory for (``from None``)."""
    try:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")
    except RuntimeError as e:
        raise CheckpointError(f"corrupt or unsafe checkpoint x.pt: {e}") from None


def memory_error() -> None:
    raise MemoryError


# Each shape memory running out took under ulimit -v, and what its line must say.
SHAPES = {
    "numpy": (numpy_import_error, "while loading the libraries"),
    "loader": (loader_error, "while loading the libraries"),
    "system-error": (system_error_in_an_import, "while loading the libraries"),
    "thread": (thread_error, "starting threads"),
    "checkpoint": (corrupt_checkpoint, "reduce the batch"),
    "memory-error": (memory_error, "reduce the batch"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("command", [["info", "x"], ["translate", "x", "y"], ["plot", "x", "y"],
                                     ["eval", "--hyp", "x", "--ref", "x"]])
def test_memory_that_runs_out_in_a_command_is_one_line_exit_5(monkeypatch, tmp_path, command, shape):
    run_out, words = SHAPES[shape]
    with pytest.raises(BaseException) as raised:
        run_out()
    assert is_out_of_memory(raised.value.__context__ or raised.value)
    monkeypatch.setattr(GUARD, "settle_process", run_out)  # the first thing a command does
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 5, result.output
    line = assert_one_error_line(result.stderr)
    assert line.startswith("error: out of memory") and words in line, line


def test_errors_that_are_not_memory_are_not_taken_for_it():
    """A library error whose own words quote a memory message (a user's text) stays its own; an OSError with
    an errno is the OS mapping's; an ImportError of a missing module is not memory."""
    assert not is_out_of_memory(CheckpointError("x.pt: no such checkpoint"))
    assert not is_out_of_memory(ModuleNotFoundError("No module named 'ctranslate2'"))
    assert not is_out_of_memory(OSError(11, "Resource temporarily unavailable"))
    assert not is_out_of_memory(SystemError("error return without exception set"))  # not out of an import


def test_a_library_error_quoting_memory_words_keeps_its_code(monkeypatch, tmp_path):
    def refuse() -> None:
        raise ConfigError("--tgt-lang cannot allocate memory: not a language of this model")

    monkeypatch.setattr(GUARD, "settle_process", refuse)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["info", "x"])
    assert result.exit_code == 2, result.output
    assert "not a language" in assert_one_error_line(result.stderr)


def test_memory_that_runs_out_importing_the_command_line_is_one_line_exit_5():
    """Before any command's guard: importing typer fails as it does under a tiny ``ulimit -v``."""
    script = ("import sys\n"
              "class Short:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'typer': raise MemoryError\n"
              "sys.meta_path.insert(0, Short())\n"
              "sys.argv = ['attnmt', '--help']\n"
              "import attnmt.__main__\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**OFFLINE_ENV, "PATH": "/usr/bin"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 5, result.stderr
    assert "while loading the libraries" in assert_one_error_line(result.stderr)


def test_a_memory_limit_too_low_for_torch_is_one_line_exit_5(tiny):
    """The real thing: 300 MB of address space maps Python and the command line but not libtorch_cpu.so
    (434 MB): exit 5, one line (was exit 1 with an ImportError)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (300 << 20, 300 << 20))

    result = subprocess.run([*ATTNMT, "info", str(tiny.reference("transformer"))], cwd=REPO,
                            env={**OFFLINE_ENV, "PATH": "/usr/bin"}, capture_output=True, text=True,
                            timeout=120, preexec_fn=limit)
    assert result.returncode == 5, result.stderr
    assert "out of memory while loading the libraries" in assert_one_error_line(result.stderr)
