"""``plot --html --flow`` keeps the time bound it promises (docs/RELIABILITY.md): a page whose attention
flow would take longer than ``--flow-budget`` (by ``rollout.flow_seconds``) is refused with one ``error:``
line, exit 2, stating the estimate and the budget that would let it through, before the model translates
or reads any attention; a page under the budget is drawn.

The oracle is the estimate recomputed here from the run's own tokenizer and layers: for sentences of
several lengths, a budget just under it is refused and one just over it is drawn. The slow case is never
run: the refusals are made before any work, and the drawn pages are short.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from helpers import assert_one_error_line
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.insight import rollout

PHRASE = "monday , 3 june 2001 at 7:05 pm"


@pytest.fixture(scope="module")
def run(tiny):
    """The tiny Transformer, trained; its tokenizer and layer counts."""
    from attnmt.models import attention_layout
    from attnmt.models.checkpoint import load_model

    folder = tiny.reference("transformer")
    _, tokenizer, cfg, _ = load_model(folder)
    layers, _ = attention_layout(cfg.model)
    return folder, tokenizer, layers["enc_self"], layers["dec_self"]


@pytest.fixture
def no_model_work(monkeypatch):
    """Translating or reading attention fails the test: a refusal must come before either."""
    from attnmt.decoding.translator import Translator
    from attnmt.insight import exploring

    def refuse(*args, **kwargs):
        raise AssertionError("model work before the --flow time check")

    monkeypatch.setattr(Translator, "best", refuse)
    monkeypatch.setattr(exploring, "teacher_forced_attention", refuse)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def estimate(run, sources: list[str], targets: list[str]) -> float:
    """The oracle: ``flow_seconds`` summed over the pairs, pieces counted by the run's tokenizer (with EOS
    on the source, BOS on the target)."""
    _, tokenizer, enc_layers, dec_layers = run
    return sum(rollout.flow_seconds(len(s) + 1, len(t) + 1, enc_layers, dec_layers)
               for s, t in zip(tokenizer.encode_src(sources), tokenizer.encode_tgt(targets)))


def stated_seconds(message: str) -> float:
    return float(re.search(r"would take about ([\d.]+) s by estimate", message).group(1))


@pytest.mark.parametrize("repeats", [1, 3, 8])
def test_a_budget_just_under_the_estimate_is_refused_before_any_model_work(run, tmp_path, no_model_work,
                                                                           repeats):
    sources = [" ".join([PHRASE] * repeats), PHRASE]
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("\n".join(sources) + "\n")
    tgt.write_text("\n".join(sources) + "\n")  # the targets' lengths are known: one estimate, exact
    seconds = estimate(run, sources, sources)
    page = tmp_path / "page.html"
    result = invoke("plot", run[0], "--input", src, "--tgt", tgt, "--html", page, "--flow",
                    "--flow-budget", seconds * 0.99)
    assert result.exit_code == 2, result.output
    line = assert_one_error_line(result.stderr)
    assert line.startswith("error: --flow: attention flow on 2 sentence(s)")
    assert stated_seconds(line) == pytest.approx(seconds, abs=0.051)
    assert f"pass --flow-budget {math.ceil(seconds)} to draw it anyway" in line
    assert not page.exists()


def test_a_budget_just_over_the_estimate_is_drawn(run, tmp_path):
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text(PHRASE + "\n")
    tgt.write_text(PHRASE + "\n")
    page = tmp_path / "page.html"
    result = invoke("plot", run[0], "--input", src, "--tgt", tgt, "--html", page, "--flow",
                    "--flow-budget", estimate(run, [PHRASE], [PHRASE]) * 1.01)
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    marker = '<script id="explorer-data" type="application/json">'  # explorer.py's page data
    start = text.index(marker) + len(marker)
    sentences = json.loads(text[start: text.index("</script>", start)])["sentences"]
    assert {"flow", "flow_prefix"} <= set(sentences[0]["maps"])


def test_without_targets_a_translation_is_taken_as_long_as_its_source(run, tmp_path, no_model_work):
    """The default budget (30 s) refuses a long sentence before translating, its target taken to be as long
    as its source."""
    long = " ".join([PHRASE] * 40)
    result = invoke("plot", run[0], long, "--html", tmp_path / "page.html", "--flow")
    assert result.exit_code == 2, result.output
    line = assert_one_error_line(result.stderr)
    assert "past --flow-budget 30 " in line and "a translation taken to be as long" in line
    assert stated_seconds(line) == pytest.approx(estimate(run, [long], [long]), abs=0.051)


def test_the_translations_lengths_are_checked_again_before_any_attention(run, tmp_path, monkeypatch):
    """A translation far longer than its source (here made so) passes the first estimate and is refused by
    the second, before any attention is read."""
    from attnmt.decoding.translator import Translator
    from attnmt.insight import exploring

    babble = " ".join([PHRASE] * 12)
    monkeypatch.setattr(Translator, "best", lambda self, sources, *a, **k: [babble for _ in sources])
    monkeypatch.setattr(exploring, "teacher_forced_attention", lambda *a, **k: pytest.fail("attention read"))
    budget = estimate(run, [PHRASE], [PHRASE]) * 2
    page = tmp_path / "page.html"
    result = invoke("plot", run[0], PHRASE, "--html", page, "--flow", "--flow-budget", budget)
    assert result.exit_code == 2, result.output
    line = assert_one_error_line(result.stderr)
    assert stated_seconds(line) == pytest.approx(estimate(run, [PHRASE], [babble]), abs=0.051)


@pytest.mark.parametrize("args", [["--flow-budget", "5"], ["--flow", "--flow-budget", "nan"],
                                  ["--flow", "--flow-budget", "-1"]])
def test_a_budget_that_bounds_nothing_is_refused(run, tmp_path, args):
    result = invoke("plot", run[0], PHRASE, "--html", tmp_path / "page.html", *args)
    assert result.exit_code == 2, result.output
    assert "--flow-budget" in assert_one_error_line(result.stderr)
