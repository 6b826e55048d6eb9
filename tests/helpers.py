"""Helpers the test modules share: the offline environment, the one-error-line contract, file hashes, the
tiny training config and ways to run ``attnmt train`` on it, in a subprocess or with injected faults.

The Hugging Face variables are set here, at import, because ``huggingface_hub`` and ``datasets`` read
them once when they are first imported; ``conftest.py`` imports this module first.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
TOY_CONFIG = CONFIGS / "toy_transformer.yaml"
FAULT_RUNNER = Path(__file__).with_name("fault_run.py")

# Small enough that prepare takes about a second; the sizes every toy run in these tests uses.
TOY_SIZES = {"train": 500, "dev": 50, "test": 50}
TOY_VOCAB = 100
TOY_SET = [
    "--set", f"data.train.size={TOY_SIZES['train']}",
    "--set", f"data.dev.size={TOY_SIZES['dev']}",
    "--set", f"data.test.size={TOY_SIZES['test']}",
    "--set", f"tokenizer.vocab_size={TOY_VOCAB}",
]  # fmt: skip

_HF_HOME = tempfile.mkdtemp(prefix="attnmt-test-hf-")
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HOME": _HF_HOME,
    "OMP_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}
os.environ.update(OFFLINE_ENV)


# The tools users run (and scriptargs, which every script imports) in scripts/, the benchmarks (and their
# benchlib) in scripts/bench/.
SCRIPT_FOLDERS = (REPO / "scripts", REPO / "scripts" / "bench")


# The toy task, a 100-piece tokenizer, 200 steps at a constant rate: the settings the tests that align a small
# model (tests/cli/test_cli_looking.py, test_cli_markup.py) train with; each adds its "model".
TOY_ALIGN_BASE = {
    "data": {"src_lang": "en", "tgt_lang": "de", "train": {"format": "toy", "split": "train", "size": 2000},
             "dev": {"format": "toy", "split": "dev", "size": 20}},
    "tokenizer": {"vocab_size": 100},
    "train": {"device": "cpu", "lr": 1.0e-2, "schedule": "constant", "warmup_steps": 0, "max_tokens": 1024,
              "max_steps": 200, "eval_every": 200, "save_every": 200, "log_every": 100, "precision": "fp32"},
    "decode": {"beam_size": 1},
}  # fmt: skip


def script_path(name: str) -> Path:
    """The file of script (or script library) ``name``: ``scripts/NAME.py`` or ``scripts/bench/NAME.py``."""
    found = [folder / f"{name}.py" for folder in SCRIPT_FOLDERS if (folder / f"{name}.py").is_file()]
    assert len(found) == 1, f"{name}: {found or 'no such script'} in {[str(f) for f in SCRIPT_FOLDERS]}"
    return found[0]


def load_script(name: str):
    """``scripts/NAME.py`` or ``scripts/bench/NAME.py`` as a module, registered in ``sys.modules`` first
    (its dataclasses look themselves up there) and loaded once."""
    for folder in SCRIPT_FOLDERS:  # a script imports its neighbours (scriptargs, benchlib, the tools)
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, script_path(name))
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def script_in_process(name: str, monkeypatch, capsys):
    """``call(*args)``: script ``name``'s ``main(args)`` in this process, from the repository as its
    children run, its ``python -m attnmt`` commands (``script.ATTNMT`` through ``script.run``) through the
    Typer app here, other commands as children: (exit code, stdout, stderr). End-to-end tests of a script
    check what it makes, not how a child process starts (each would cost seconds of start-up)."""
    from typer.testing import CliRunner

    from attnmt.cli import app

    script = load_script(name)
    spawn = script.run

    def run(command: list) -> str:
        command = [str(c) for c in command]
        if command[:len(script.ATTNMT)] != script.ATTNMT:
            return spawn(command)
        result = CliRunner().invoke(app, command[len(script.ATTNMT):])
        if result.exit_code != 0:  # as ``run`` does with a child's failure
            sys.stderr.write(result.stderr)
            sys.exit(result.exit_code)
        return result.stdout

    monkeypatch.setattr(script, "run", run)
    monkeypatch.chdir(REPO)

    def call(*args) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            script.main([str(a) for a in args])
            code = 0
        except SystemExit as stop:
            code = stop.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return call


def hostile_place(folder: Path, kind: str, number: int) -> Path:
    """A new path in ``folder`` (made if need be) of a kind an option should refuse or survive:
    ``missing``, an empty ``folder``, a ``fifo`` with no writer, an ``unreadable`` file, a ``pickle``
    (a plain ``pickle.dump``, as a model: torch's loader warns about it)."""
    import pickle

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{number}"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "unreadable":
        path.write_text("secret\n")
        path.chmod(0)
    elif kind == "pickle":
        path.write_bytes(pickle.dumps({"model": [1.0, 2.0]}))
    return path


def hash_tree(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (to prove a failed command changed nothing)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(root).rglob("*"))
        if p.is_file()
    }


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def assert_one_error_line(stderr: str) -> str:
    """The contract for every expected failure: exactly one stderr line, ``error: ...``, no traceback."""
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def expect_error(result, code: int, *fragments: str) -> str:
    """A Typer runner's result: exit ``code`` and one ``error:`` line holding every fragment; returns the
    line."""
    assert result.exit_code == code, result.output
    line = assert_one_error_line(result.stderr)
    assert all(f in line for f in fragments), line
    return line


def run_attnmt(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m attnmt ARGS`` as a user would, offline, with a timeout."""
    return subprocess.run(
        [sys.executable, "-m", "attnmt", *map(str, args)],
        cwd=cwd, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


# ------------------------------------------------------------------------------------- tiny training

# The smallest config that still trains like the real ones (docs/RELIABILITY.md, "How it is tested"): the
# toy task, a joint 64-piece tokenizer, one layer each side, dropout 0.3 so that the step RNG matters.
TINY_MODELS = {
    "transformer": {"arch": "transformer", "d_model": 16, "n_heads": 2, "enc_layers": 1, "dec_layers": 1,
                    "d_ff": 32, "dropout": 0.3},
    "lstm": {"arch": "lstm", "emb_dim": 16, "hidden_size": 16, "attn_dim": 16, "enc_layers": 1,
             "dec_layers": 1, "dropout": 0.3},
}
TINY_TRAIN = {
    "device": "cpu", "deterministic": True, "lr": 1.0e-2, "warmup_steps": 5, "max_tokens": 200,
    "max_steps": 30, "log_every": 1, "eval_every": 10, "save_every": 7, "keep_last": 2, "keep_best": 1,
    "precision": "fp32",  # the same on every CPU (auto is bf16 where the CPU has it natively)
}  # fmt: skip
# Fields of a "train" record that depend on the clock, not on the computation.
TIMING_KEYS = {"tokens_per_s", "elapsed_s"}


def write_tiny_config(path: Path, arch: str = "transformer") -> Path:
    """The tiny config as a YAML (JSON) file; tests vary it with ``--set``."""
    config = {
        "data": {"src_lang": "en", "tgt_lang": "de",
                 "train": {"format": "toy", "split": "train", "size": 200},
                 "dev": {"format": "toy", "split": "dev", "size": 20}},
        "tokenizer": {"vocab_size": 64},
        "model": TINY_MODELS[arch],
        "train": TINY_TRAIN,
        "decode": {"max_len_b": 5},
    }  # fmt: skip
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path


def train_args(config: Path, run_dir: Path, *sets: str) -> list[str]:
    """``attnmt train CONFIG --run-dir RUN --set ...`` for ``python -m`` (or for torchrun's ``-m``)."""
    args = ["attnmt", "train", str(config), "--run-dir", str(run_dir)]
    for item in sets:
        args += ["--set", item]
    return args


def train_env() -> dict[str, str]:
    """Offline, one thread."""
    return {**os.environ, **OFFLINE_ENV}


def train_command(config: Path, run_dir: Path, *sets: str, fault: str | None = None) -> list[str]:
    """The command line of a training subprocess; with ``fault`` (``faults.Faults.parse``) through
    ``fault_run.py``, which hands the fault to the command line."""
    args = train_args(config, run_dir, *sets)
    if fault:
        return [sys.executable, str(FAULT_RUNNER), fault, *args[1:]]
    return [sys.executable, "-m", *args]


def train_cli(config: Path, run_dir: Path, *sets: str, fault: str | None = None, timeout: float = 120,
              **popen):
    """Run ``attnmt train`` in a subprocess and wait for it."""
    return subprocess.run(
        train_command(config, run_dir, *sets, fault=fault),
        cwd=REPO, env=train_env(), capture_output=True, text=True, timeout=timeout, **popen,
    )  # fmt: skip


def read_records(run_dir: Path, event: str = "train") -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def curve(run_dir: Path, event: str = "train") -> list[dict]:
    """The records of ``event`` without their timing fields: what an exact resume must reproduce."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in read_records(run_dir, event)]


def trained_for_decoding(tiny: TinyRuns, run_dir: Path, save_every: int = 150) -> Path:
    """A private copy of the tiny run trained to step 150 without dropout: outputs that end on their own
    (the conftest reference, at step 30, still outputs empty lines). Trained once per test process and
    ``save_every`` (training is deterministic, so a copy is what another training would give), then
    copied."""
    trained = tiny.root / f"for_decoding_{save_every}"
    if not (trained / "checkpoints" / "latest.json").exists():
        shutil.rmtree(trained, ignore_errors=True)
        tiny.copy_prepared(trained)
        sets = ["train.max_steps=150", f"train.save_every={save_every}", "train.eval_every=1000",
                "train.log_every=50", "model.dropout=0.0"]
        result = train_cli(tiny.config["transformer"], trained, *sets)
        assert result.returncode == 0, result.stderr
    shutil.copytree(trained, run_dir)  # .lock too, as the run that trained there has one
    return run_dir


class TinyRuns:
    """A prepared run folder of the tiny config and, made on first use, one uninterrupted reference run per
    architecture. Nothing here is modified by tests: ``copy_prepared`` gives a private run folder."""

    def __init__(self, root: Path) -> None:
        import torch

        from attnmt.config.schema import load_config
        from attnmt.data.prepare import prepare
        from attnmt.runfiles import RunDir

        torch.set_num_threads(1)
        self.root = root
        self.config = {arch: write_tiny_config(root / f"tiny_{arch}.yaml", arch) for arch in TINY_MODELS}
        self.prepared = root / "prepared"
        prepare(load_config(self.config["transformer"]), RunDir(self.prepared))
        self._references: dict[str, Path] = {}

    def copy_prepared(self, dest: Path) -> Path:
        """A run folder with the data and tokenizer prepared but no training yet."""
        shutil.copytree(self.prepared, dest, ignore=shutil.ignore_patterns(".lock"))
        return dest

    def reference(self, arch: str = "transformer") -> Path:
        """Run A: the tiny config trained to max_steps without interruption."""
        if arch not in self._references:
            run = self.copy_prepared(self.root / f"reference_{arch}")
            result = train_cli(self.config[arch], run)
            assert result.returncode == 0, result.stderr
            self._references[arch] = run
        return self._references[arch]


def severe(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def tiny_study_config(path: Path, **train: int) -> Path:
    """A study config of the toy task and the tiny model; ``train``: settings over its 8 steps."""
    config = {
        "data": {"src_lang": "en", "tgt_lang": "de",
                 "train": {"format": "toy", "split": "train", "size": 200},
                 "dev": {"format": "toy", "split": "dev", "size": 12},
                 "test": {"format": "toy", "split": "test", "size": 12}},
        "tokenizer": {"vocab_size": 64},
        "model": TINY_MODELS["transformer"],
        "train": {**TINY_TRAIN, "max_steps": 8, "eval_every": 4, "save_every": 4, "log_every": 2, **train},
        "decode": {"max_len_b": 5},
    }  # fmt: skip
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path
