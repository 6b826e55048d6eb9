"""Fixtures: a socket guard, one prepared toy run folder reused by every test that only reads it, and the
tiny runs of ``helpers.TinyRuns``. Plain helpers live in ``helpers.py`` (imported first: it sets the
offline environment before any Hugging Face library is imported)."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from helpers import TINY_MODELS, TINY_TRAIN, TOY_CONFIG, TOY_SET, TinyRuns, train_cli

# The files that take longest, handed out first: `make test` gives each of its two processes whole files
# (--dist loadfile) in collection order, so a long file collected last would run alone at the end.
LONGEST_FIRST = (  # seconds of a full run on 2026-12-05, 2-core AMD EPYC, in brackets
    "cli/test_cli_fuzz.py",  # (145)
    "scripts/test_scripts_smoke.py",  # (110)
    "docs/test_getting_started.py",  # (105)
    "training/test_alignment_layer.py",  # (about 100, 2026-12-06, Intel Xeon)
    "training/test_torchrun.py",  # (75)
    "serve/test_serve.py",  # (64)
    "training/test_train.py",  # (51)
    "training/test_settings.py",  # (51)
    "docs/test_figures.py",  # (32)
    "cli/test_cli_looking.py",  # (32)
    "test_properties.py",  # (30)
    "test_orphans.py",  # (29)
    "study/test_study.py",  # (24)
    "decoding/test_ctranslate.py",  # (23)
    "serve/test_serve_hostile.py",  # (22)
)
_GONE = [name for name in LONGEST_FIRST if not (Path(__file__).parent / name).is_file()]
assert not _GONE, f"tests/conftest.py: LONGEST_FIRST names files that are not there: {_GONE}"


def pytest_collection_modifyitems(items):
    """Collection order, except that the files of ``LONGEST_FIRST`` come first, in its order."""
    def rank(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: each file's tests keep their order


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails loudly."""

    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"network access attempted: connect{args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
    """One toy run folder prepared in-process with ``attnmt prepare``; tests must not modify it."""
    from typer.testing import CliRunner

    from attnmt.cli import app

    run_dir = tmp_path_factory.mktemp("toy") / "run"
    result = CliRunner().invoke(app, ["prepare", str(TOY_CONFIG), "--run-dir", str(run_dir), *TOY_SET])
    return run_dir, result


@pytest.fixture
def toy_run_copy(toy_run, tmp_path):
    """A private copy of the prepared toy run folder, for tests that run prepare on it again."""
    run_dir, result = toy_run
    assert result.exit_code == 0, result.output
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyRuns:
    return TinyRuns(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def restore_torch_state():
    """In-process ``attnmt train`` switches on deterministic algorithms; leave the process as it was (the
    modules that train in process use it for every test: ``pytestmark``)."""
    import torch

    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(deterministic)


# ------------------------------------------------------- fixtures that several folders' tests share

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # Debian's chromium, chromium-driver
HINT = "run `make test`, which installs chromium and chromium-driver"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through chromedriver; a failure to start fails the tests (never skips them)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).is_file()]
    if missing:  # checked first: Selenium would otherwise try to download a driver
        pytest.fail(f"headless Chromium cannot start: {', '.join(missing)} missing\n{HINT}", pytrace=False)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1100", "--force-device-scale-factor=1"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    except Exception as e:  # any reason at all: reported, with the hint
        pytest.fail(f"headless Chromium did not start: {type(e).__name__}: {e}\n{HINT}", pytrace=False)
    yield driver
    driver.quit()


TOY_SPLIT = {"format": "toy", "split": "train"}


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    """A tiny model trained 20 steps on two toy corpora, English to German and to Chinese, and a tagged
    third; its run folder."""
    root = tmp_path_factory.mktemp("multilingual")
    config = {
        "data": {"src_lang": "en", "tgt_lang": "de",
                 "train": [{**TOY_SPLIT, "size": 120, "tgt_lang": "de"},
                           {**TOY_SPLIT, "size": 120, "lang": "zh", "seed": 2, "tgt_lang": "zh", "weight": 2},
                           {**TOY_SPLIT, "size": 40, "seed": 3, "tag": "<bt>"}],
                 "dev": {"format": "toy", "split": "dev", "size": 10, "lang": "zh", "tgt_lang": "zh"}},
        "tokenizer": {"vocab_size": 400},
        "model": TINY_MODELS["transformer"],
        "train": {**TINY_TRAIN, "max_steps": 20, "eval_every": 20, "save_every": 20},
        "decode": {"max_len_b": 5},
    }  # fmt: skip
    path = root / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    result = train_cli(path, root / "run")
    assert result.returncode == 0, result.stderr
    return root / "run"
