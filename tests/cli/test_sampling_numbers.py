"""Sampling's numbers at and past float32's range (subnormals, 1e-46, 5e-324, 1e38, 3.5e38, 1e308), through
the ``Sampling`` object and the search, and through ``attnmt translate``: every one is refused naming its
option, or the samples keep the output length limit (round 5: ``--temperature 1e308`` drew 398 pieces where
the limit was 19, ``--temperature 1e-46`` and ``--top-p 1e-46`` were exit 1).

The oracle of what float32 holds is numpy's ``finfo``; the oracle of the length limit is
``floor(max_len_a * source pieces + max_len_b)`` with the pieces counted by the model's tokenizer, and the
limit of a tiny temperature or top_p is greedy search itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import assert_one_error_line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnmt.cli import app
from attnmt.config.schema import TransformerConfig
from attnmt.data.batching import collate
from attnmt.data.tokenizer import BOS_ID, PAD_ID
from attnmt.decoding.search import Sampling, greedy_search, max_output_lengths, output_limit
from attnmt.models import build_model

F32 = np.finfo(np.float32)
# At and past float32's range, both ends, as a user (or a client) may type them.
EDGES = [5e-324, 1e-320, 1e-46, 1.4e-45, 1e-40, float(F32.smallest_normal) / 2, float(F32.smallest_normal),
         1.2e-38, 1e-30, 1e-7, 0.3, 1.0, 7.0, 1e10, 1e38, float(F32.max), 3.5e38, 1e39, 1e308,
         1.7976931348623157e308]
NUMBERS = st.one_of(st.sampled_from(EDGES), st.floats(min_value=5e-324, max_value=1e308))
SOURCES = ["monday , 3 june 2001", "the 2nd of may 2010"]


def float32_holds(value: float) -> bool:
    """The oracle: a positive number float32 holds at full precision (a normal number, not rounded to 0,
    a subnormal or inf)."""
    return float(F32.smallest_normal) <= value <= float(F32.max)


def allowed(temperature: float, top_p: float) -> bool:
    return float32_holds(temperature) and float32_holds(top_p) and top_p <= 1


V = 12


@pytest.fixture(scope="module")
def model():
    """A random float32 Transformer (the dtype decoding runs in) whose distributions are far from uniform."""
    torch.manual_seed(0)
    built = build_model(TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1,
                                          dec_layers=1, d_ff=32, dropout=0.0), V, V, PAD_ID).eval()
    with torch.no_grad():
        for p in built.parameters():
            p.normal_(0, 0.6)
    return built


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=NUMBERS, top_p=NUMBERS, top_k=st.sampled_from([0, 1, 3, 2**63 - 1]))
def test_a_sampling_is_refused_naming_its_number_or_keeps_the_length_limit(model, temperature, top_p, top_k):
    if not allowed(temperature, top_p):
        with pytest.raises(ValueError) as refused:
            Sampling(temperature, top_k, top_p)
        named = str(refused.value).split()[0]
        assert named in ({"temperature"} if not float32_holds(temperature) else set()) | (
            {"top_p"} if not (float32_holds(top_p) and top_p <= 1) else set())
        return
    sampling = Sampling(temperature, top_k, top_p)
    src = collate([[5, 6, 7], [4, 9, 10, 11, 6, 5, 4], [8]]).src
    mask = src != PAD_ID
    limits = max_output_lengths(mask, 1.5, 2).tolist()
    found = greedy_search(model, src, mask, max_len_a=1.5, max_len_b=2, sampling=sampling,
                          generator=torch.Generator().manual_seed(3))
    for hyp, limit in zip(found, limits):
        assert len(hyp.tokens) <= limit, (hyp.tokens, limit)
        assert PAD_ID not in hyp.tokens and BOS_ID not in hyp.tokens
        assert math.isfinite(hyp.score)
    # The limit of a tiny temperature, or of a tiny top_p (at a temperature that leaves float32 the pieces'
    # differences: at 1e10 they round to ties): greedy search.
    if temperature <= 1e-30 or (top_p <= 1e-30 and temperature <= 10):
        greedy = greedy_search(model, src, mask, max_len_a=1.5, max_len_b=2)
        assert [h.tokens for h in found] == [h.tokens for h in greedy]


@pytest.fixture(scope="module")
def run(tiny):
    return tiny.reference("transformer")


@pytest.fixture(scope="module")
def limits(run) -> list[int]:
    """Each source's output limit in pieces, from the model's own tokenizer and decode settings."""
    from attnmt.cli.common import open_translator

    translator, _, _ = open_translator(run, "cpu")
    d = translator.decode
    return [output_limit(len(ids), d.max_len_a, d.max_len_b) for ids in translator.encode(SOURCES).ids]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=NUMBERS, top_p=NUMBERS)
def test_translate_refuses_a_number_float32_cannot_hold_or_keeps_the_limit(run, limits, temperature, top_p):
    """Exit 2 naming an option float32 cannot hold, or exit 0 with every sample within its limit (each word
    holds a piece at least, so its words are at most the limit)."""
    args = ["translate", str(run), *SOURCES, "--sampling", "--nbest", "2", "--temperature", repr(temperature),
            "--top-p", repr(top_p)]
    result = CliRunner().invoke(app, args)
    if not allowed(temperature, top_p):
        assert result.exit_code == 2, result.output
        line = assert_one_error_line(result.stderr)
        bad = [f"--temperature {temperature}"] if not float32_holds(temperature) else []
        bad += [f"--top-p {top_p}"] if not (float32_holds(top_p) and top_p <= 1) else []
        assert any(line.startswith(f"error: {option}") for option in bad), (line, bad)
        return
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [int(row[0]) for row in rows] == [0, 0, 1, 1]
    for index, _, text in rows:
        assert len(text.split()) <= limits[int(index)], (text, limits)
