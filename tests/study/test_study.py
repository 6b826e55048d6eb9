"""``attnmt study``: variants parsed and refused, the folder claimed, two variants trained end to end through
the command line on a tiny toy task, resumed, interrupted and resumed again, and the report read in
headless Chromium. The kernels' growth: the exponent fit, the resume, one real measurement in a child."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import OFFLINE_ENV, REPO, assert_one_error_line, hash_tree, severe, tiny_study_config
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.errors import ConfigError
from attnmt.study.growth import claimed_within, fit_lengths, growth_exponent, run_child
from attnmt.study.run import VARIANTS, model_section, parse_variants


def study_command(config: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "attnmt", "study", str(config), "--out", str(out), "--minutes", "5",
            "--no-growth", *extra]


@dataclass
class Ran:
    returncode: int
    stderr: str


def run_study(config: Path, out: Path, *extra: str, cwd: Path = REPO) -> Ran:
    """``attnmt study`` through the Typer app in this process (its variants still train in children): the
    runs that are not signalled need no process of their own, which costs seconds of start-up."""
    before = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, study_command(config, out, *extra)[3:])
    finally:
        os.chdir(before)
    return Ran(result.exit_code, result.stderr)


# ------------------------------------------------------------------------------------------ variants


def test_variants_are_parsed_and_unknown_ones_refused():
    assert parse_variants("additive, sdpa") == ["additive", "sdpa"]
    assert parse_variants("all") == list(VARIANTS)
    with pytest.raises(ConfigError, match=r"--variants: unknown variant 'flash'; valid: additive, dot"):
        parse_variants("additive,flash")
    with pytest.raises(ConfigError, match="names a variant twice"):
        parse_variants("dot,dot")


def test_a_variant_keeps_the_configs_width_across_architectures():
    transformer = {"arch": "transformer", "d_model": 64, "n_heads": 4, "dropout": 0.2, "enc_kernel": "linear"}
    lstm = model_section(transformer, VARIANTS["dot"])
    assert lstm == {"arch": "lstm", "emb_dim": 64, "hidden_size": 32, "attn_dim": 64, "dropout": 0.2,
                    "attention": "dot"}
    assert model_section(transformer, VARIANTS["sdpa"])["enc_kernel"] == "sdpa"
    assert model_section(transformer, VARIANTS["scaled_dot"])["n_heads"] == 1
    back = model_section({"arch": "lstm", "emb_dim": 32, "dropout": 0.1}, VARIANTS["performer"])
    assert back == {"arch": "transformer", "d_model": 32, "dropout": 0.1, "enc_kernel": "performer",
                    "dec_kernel": "performer"}


def test_an_unknown_or_inapplicable_variant_is_one_line_and_writes_nothing(tmp_path):
    config = tiny_study_config(tmp_path / "tiny.yaml")
    out = tmp_path / "study"
    result = run_study(config, out, "--variants", "sdpa,flash")
    assert result.returncode == 2
    assert "--variants: unknown variant 'flash'" in assert_one_error_line(result.stderr)
    # gradient checkpointing is the Transformer's alone: the LSTM variant cannot apply
    result = run_study(config, out, "--variants", "sdpa,additive",
                       "--set", "train.gradient_checkpointing=true")
    assert result.returncode == 2
    line = assert_one_error_line(result.stderr)
    assert "--variants additive: cannot apply to this config: train.gradient_checkpointing" in line
    assert not out.exists()


def test_the_study_folder_must_be_new_empty_or_a_study(tmp_path):
    config = tiny_study_config(tmp_path / "tiny.yaml")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    before = hash_tree(busy)
    result = run_study(config, busy, "--variants", "sdpa")
    assert result.returncode == 2
    assert "not an attnmt study folder and not empty" in assert_one_error_line(result.stderr)
    assert hash_tree(busy) == before


# ------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """A study of two variants (an LSTM and a Transformer), trained to the end; --out relative to the
    working folder, as a user types it."""
    root = tmp_path_factory.mktemp("study")
    config = tiny_study_config(root / "tiny.yaml")
    result = run_study(config, Path("study"), "--variants", "dot,sdpa", cwd=root)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (root / "study" / "runs").iterdir()) == ["dot", "sdpa"]
    assert not (root / "study" / "configs" / "study").exists()
    return config, root / "study"


def test_the_study_writes_results_and_a_report(finished):
    _, out = finished
    results = json.loads((out / "results.json").read_text())
    assert list(results["variants"]) == ["dot", "sdpa"]
    for name, arch in (("dot", "lstm"), ("sdpa", "transformer")):
        record = results["variants"][name]
        assert record["arch"] == arch and record["steps"] == 8
        assert record["curve"] and [p[2] for p in record["curve"]] == [4, 8]
        for split in ("dev", "test"):
            assert record[split]["sentences"] == 12 and 0 <= record[split]["bleu"] <= 100
        assert record["peak_rss_mib"] > 50 and record["train_tokens_per_s"] > 0
        assert record["parameters"] > 0 and record["decode_sentences_per_s"] > 0
        attention = record["attention"]
        cross = attention["cross"]
        assert len(cross) == len(attention["tgt"]) and len(cross[0]) == len(attention["src"])
        assert all(math.isclose(sum(row), 1.0, abs_tol=0.01) for row in cross)
    assert "enc_self" in results["variants"]["sdpa"]["attention"]
    assert "enc_self" not in results["variants"]["dot"]["attention"]
    # each run trained with its own variant's model on the same prepared data
    for name, arch in (("dot", "lstm"), ("sdpa", "transformer")):
        config = json.loads((out / "configs" / f"{name}.yaml").read_text())
        assert config["model"]["arch"] == arch and config["train"]["max_minutes"] == 5
    tokenizers = {(out / "runs" / n / "tokenizer" / "spm.model").read_bytes() for n in ("dot", "sdpa")}
    assert len(tokenizers) == 1
    report = (out / "report.md").read_text()
    assert "| dot | LSTM, dot score" in report and "| sdpa | Transformer" in report
    assert {p.name for p in (out / "figures").iterdir()} == {
        "bleu_over_minutes.png", "attention_cross.png", "attention_enc_self.png"}


def test_a_second_run_keeps_finished_variants_and_adds_new_ones(finished, tmp_path):
    config, out = finished
    checkpoints = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*.pt")}
    result = run_study(config, out, "--variants", "dot,sdpa")
    assert result.returncode == 0, result.stderr
    assert "dot: done before, kept" in result.stderr and "sdpa: done before, kept" in result.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*.pt")} == checkpoints
    # another budget is another study
    result = run_study(config, out, "--variants", "dot", "--minutes", "6")
    assert result.returncode == 2
    assert "a study made with --minutes 5.0; give a new --out" in assert_one_error_line(result.stderr)


def test_an_interrupted_study_loses_no_finished_variant(tmp_path):
    config = tiny_study_config(tmp_path / "tiny.yaml")
    out = tmp_path / "study"
    env = {**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(study_command(config, out, "--variants", "general,sdpa"), cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not (out / "runs" / "sdpa").exists():  # the first variant is done, the second has begun
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 143, stderr
    assert "stopped by SIGTERM while training sdpa" in stderr
    results = out / "results.json"
    assert list(json.loads(results.read_text())["variants"]) == ["general"]
    first = json.loads(results.read_text())["variants"]["general"]
    result = run_study(config, out, "--variants", "general,sdpa")
    assert result.returncode == 0, result.stderr
    assert "general: done before, kept" in result.stderr
    finished = json.loads(results.read_text())["variants"]
    assert list(finished) == ["general", "sdpa"] and finished["general"] == first
    assert finished["sdpa"]["steps"] == 8


# ------------------------------------------------------------------------------------ the page


def test_the_report_opens_offline_without_errors(browser, finished):
    _, out = finished
    url = (out / "report.html").as_uri()
    browser.get_log("browser"), browser.get_log("performance")
    browser.get(url)
    assert severe(browser) == []
    requested = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in requested if m["method"] == "Network.requestWillBeSent"]
    assert [u for u in urls if u != url and not u.startswith("data:")] == []
    rows = browser.execute_script("return [...document.querySelectorAll('#quality tbody tr')]"
                                  ".map((r) => r.cells[0].textContent)")
    assert rows == ["dot", "sdpa"]
    loaded = browser.execute_script(
        "return [...document.images].map((i) => i.complete && i.naturalWidth > 0)")
    assert loaded and all(loaded)


# ------------------------------------------------------------------------------------ growth


def test_the_growth_exponent_is_the_slope_over_the_long_lengths():
    lengths = [64, 128, 256, 512, 1024, 2048, 4096]
    assert fit_lengths(lengths) == [1024, 2048, 4096]
    quadratic = [3e-4 * n**2 + (50 if n < 1024 else 0) for n in lengths]  # overhead at short lengths only
    assert growth_exponent(lengths, quadratic) == pytest.approx(2.0)
    assert growth_exponent(lengths, [n * math.sqrt(n) for n in lengths]) == pytest.approx(1.5)
    assert growth_exponent(lengths, [None] * 6 + [1.0]) is None
    assert fit_lengths([64, 128, 256]) == [128, 256]
    assert claimed_within("linear", 1.2) and not claimed_within("linear", 1.3)
    assert claimed_within("math", 1.8) and not claimed_within("sparse", 1.2)


def test_a_real_measurement_in_a_child():
    assert run_child("math", 64, "ms", "backward", repeats=1) > 0
    assert run_child("performer", 64, "mib", "forward", repeats=1) >= 0
    assert run_child("no-such-kernel", 64, "ms", "forward") is None


def test_growth_resumes_kernel_by_kernel(tmp_path, monkeypatch):
    from attnmt.study import growth
    from attnmt.study import measure as study_measure

    calls = []

    def fake_child(kernel, n, what, mode, repeats=3, threads=1):
        calls.append(kernel)
        return float(n) ** (2 if kernel == "math" else 1)

    monkeypatch.setattr(growth, "run_child", fake_child)
    path = tmp_path / "growth.json"
    first = study_measure.update_growth(path, ["math"], [256, 512, 1024, 2048], say=lambda _: None)
    assert first["exponents"]["math"]["forward"]["ms"] == pytest.approx(2.0)
    calls.clear()
    second = study_measure.update_growth(path, ["math", "linear"], [256, 512, 1024, 2048], say=lambda _: None)
    assert set(calls) == {"linear"}
    assert second["exponents"]["linear"]["backward"]["mib"] == pytest.approx(1.0)
    assert json.loads(path.read_text())["values"].keys() == {"math", "linear"}
