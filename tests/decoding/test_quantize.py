"""int8 in attnmt's own search (``decoding/quantize.py``, ``--int8``, ``decode.quantize: int8``).

The oracles: the float model (every ``nn.Linear``, and no other module, becomes torch's dynamically
quantized linear layer, and teacher-forced log-probabilities stay close to the float ones) and the model
quantized in this process (``translate --int8`` prints its translations). Every search mode of
``translate`` runs on it, and so do ``eval``, ``score``, ``plot``, ``align`` and a config's
``decode.quantize: int8``. A CTranslate2 export and a GPU are refused with one line.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import assert_one_error_line, trained_for_decoding
from torch import nn
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.data.batching import collate
from attnmt.decoding.quantize import quantize_int8
from attnmt.decoding.translator import DecodeOverrides
from attnmt.errors import ConfigError
from attnmt.models.checkpoint import load_model

LINES = ["march 14th 2019", "tuesday , march 14th , 2019 at 7:05 pm", "november 19th 1982",
         "friday the 1st of may 2001", "7:05 pm", "the 3rd of june 1999"]


def invoke(*args, input: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("int8") / "run")


def test_every_linear_layer_and_nothing_else_is_quantized_and_the_scores_stay_close(run):
    model, tokenizer, _, _ = load_model(run, "cpu")
    model.eval()
    linear = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    others = {name: type(m) for name, m in model.named_modules() if type(m) is not nn.Linear}
    quantized, _, _, _ = load_model(run, "cpu")
    quantized.eval()
    assert quantize_int8(quantized) == len(linear) > 0
    found = dict(quantized.named_modules())
    assert all(type(found[name]).__module__.startswith("torch.ao.nn.quantized.dynamic") for name in linear)
    assert all(type(found[name]) is kind for name, kind in others.items())
    src = [tokenizer.encode_src(line) for line in LINES]
    batch = collate(src, [ids[:4] for ids in src])
    with torch.no_grad():
        exact = model(batch).logits.log_softmax(-1)
        close = quantized(batch).logits.log_softmax(-1)
    mask = batch.tgt_out != 0
    gap = (exact - close).abs().amax(-1)[mask]
    assert float(gap.max()) < 0.5 and float(gap.mean()) < 0.1, (gap.max(), gap.mean())


def test_int8_translations_are_the_quantized_models_own_and_every_search_mode_runs(run, tmp_path):
    """The oracle: ``translate --int8`` prints what the model quantized in this process finds (the CLI
    quantizes, and nothing else changes); then each search mode runs on it."""
    from attnmt.cli.common import open_translator
    from attnmt.decoding.quantize import quantized
    from attnmt.decoding.translator import DecodeOverrides

    translator, _, _ = open_translator(run, "cpu", DecodeOverrides(beam_size=1, int8=True))
    assert quantized(translator.model)
    int8 = invoke("translate", run, *LINES, "--beam-size", 1, "--int8")
    assert int8.exit_code == 0, int8.output
    assert int8.stdout.splitlines() == translator.best(LINES)
    beam = invoke("translate", run, *LINES, "--beam-size", 3, "--int8")
    assert beam.stdout.splitlines() == translator.with_overrides(DecodeOverrides(beam_size=3)).best(LINES)
    prefixes, constraints = tmp_path / "prefixes", tmp_path / "constraints"
    prefixes.write_text("14\n" + "\n" * (len(LINES) - 1), encoding="utf-8")
    constraints.write_text("märz\n" + "\n" * (len(LINES) - 1), encoding="utf-8")
    inputs = tmp_path / "in.en"
    inputs.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    modes = {
        "beam, n-best": ["--beam-size", 4, "--nbest", 2],
        "sampling": ["--sampling", "--nbest", 2, "--seed", 3],
        "prefixes": ["-i", inputs, "--prefix", prefixes],
        "constraints": ["-i", inputs, "--constraints", constraints, "--beam-size", 4],
        "word scores": ["--scores", "words"],
        "ensemble": ["--ensemble", run],
    }
    for mode, options in modes.items():
        words = [] if "-i" in options else LINES
        result = invoke("translate", run, *words, *options, "--int8")
        assert result.exit_code == 0, (mode, result.output)
        assert result.stdout.strip(), mode
    scored = invoke("translate", run, LINES[0], "--scores", "words", "--int8")
    assert json.loads(scored.stdout.splitlines()[0])
    marked = invoke("translate", run, "-i", "-", "--markup", "--int8", input="<b>march 14th</b> 2019\n")
    assert marked.exit_code == 0 and marked.stdout.count("<b>") == 1, marked.output


def test_eval_and_score_take_int8(run, tmp_path):
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    translated = invoke("translate", run, *LINES, "--beam-size", 1)
    ref.write_text(translated.stdout, encoding="utf-8")
    evaluated = invoke("eval", run, "--src", src, "--ref", ref, "--beam-size", 1, "--int8")
    assert evaluated.exit_code == 0, evaluated.output
    scored = invoke("score", run, "--src", src, "--tgt", ref, "--int8")
    assert scored.exit_code == 0, scored.output
    assert len(scored.stdout.splitlines()) == len(LINES)


def test_a_gpu_and_an_export_are_refused_in_one_line(run, monkeypatch, tmp_path):
    from attnmt.cli import common

    cfg = load_model(run, "cpu")[2]
    with pytest.raises(ConfigError) as raised:
        common._preparer(True, cfg, torch.device("cuda"), run)
    assert "runs on the CPU" in assert_one_error_line(f"error: {raised.value}")
    monkeypatch.setattr("attnmt.decoding.ctranslate.is_export", lambda path: True)
    with pytest.raises(ConfigError) as raised:
        common.open_translator(run, "cpu", DecodeOverrides(int8=True))
    assert "CTranslate2 export" in assert_one_error_line(f"error: {raised.value}")


def test_a_configs_decode_quantize_chooses_int8_and_the_option_can_say_otherwise(run, tmp_path):
    """``decode.quantize: int8`` in a checkpoint's config quantizes every decoding command's model; the
    commands that take gradients (attribute, heads) and ``DecodeOverrides(int8=False)`` keep it float."""
    from attnmt.cli.common import open_for_attention, open_translator
    from attnmt.decoding.quantize import quantized

    payload = torch.load(next((run / "checkpoints").glob("step_*.pt")), weights_only=False)
    payload["config"]["decode"]["quantize"] = "int8"
    torch.save(payload, tmp_path / "int8.pt")
    assert quantized(open_translator(tmp_path / "int8.pt", "cpu")[0].model)
    assert quantized(open_for_attention(tmp_path / "int8.pt", "cpu", None)[0].model)
    assert not quantized(open_for_attention(tmp_path / "int8.pt", "cpu", None, int8=False)[0].model)
    assert not quantized(open_translator(run, "cpu")[0].model)
    plotted = invoke("plot", run, LINES[0], "--int8", "--out", tmp_path / "figures")
    assert plotted.exit_code == 0, plotted.output
    assert list((tmp_path / "figures").glob("*.png"))
    src, tgt = tmp_path / "src.en", tmp_path / "tgt.de"
    src.write_text(LINES[0] + "\n", encoding="utf-8")
    tgt.write_text("14 . märz 2019\n", encoding="utf-8")
    aligned = invoke("align", run, "--src", src, "--tgt", tgt, "--int8")
    assert aligned.exit_code == 0 and aligned.stdout.strip(), aligned.output
