"""``attnmt serve``'s sampling numbers at and past float32's range: ``"temperature": 5e-324`` or ``"top_p":
1e-46`` were an HTTP 500 (NaN probabilities in the decoder), ``"temperature": 1e308`` drew past the length
limit. Now each is a 422 naming the field (``search.check_sampling``, through the request's validation), or
an answer whose samples keep their limit. The oracle of what float32 holds is numpy's ``finfo``; of the
limit, ``floor(max_len_a * source pieces + max_len_b)`` with the pieces counted by the model's tokenizer
(each word of an output holds a piece at least)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import trained_for_decoding
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serve import Server

F32 = np.finfo(np.float32)
EDGES = [5e-324, 1e-320, 1e-46, 1.4e-45, 1e-40, float(F32.smallest_normal), 1e-30, 0.5, 1.0, 1e10, 1e38,
         float(F32.max), 3.5e38, 1e39, 1e308]
NUMBERS = st.one_of(st.sampled_from(EDGES), st.floats(min_value=5e-324, max_value=1e308))
TEXT = ["monday , 3 june 2001", "the 2nd of may 2010"]


def float32_holds(value: float) -> bool:
    return float(F32.smallest_normal) <= value <= float(F32.max)


@pytest.fixture(scope="module")
def model(tiny, tmp_path_factory):
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("numbers") / "run")


@pytest.fixture(scope="module")
def limits(model) -> list[int]:
    from attnmt.cli.common import open_translator
    from attnmt.decoding.search import output_limit

    translator, _, _ = open_translator(model, "cpu")
    d = translator.decode
    return [output_limit(len(ids), d.max_len_a, d.max_len_b) for ids in translator.encode(TEXT).ids]


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    started = Server(model, tmp_path_factory.mktemp("log") / "server.log")
    yield started
    assert started.stop() == 0


@pytest.mark.parametrize("field, value", [("temperature", 5e-324), ("top_p", 1e-46), ("temperature", 1e308),
                                          ("temperature", 1e-46), ("top_p", 5e-324)])
def test_the_cases_found_are_422_naming_the_field(server, field, value):
    answer = server.client.post("/translate", json={"text": TEXT, "sampling": True, field: value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith(f"{field} {value}: "), answer.json()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=NUMBERS, top_p=NUMBERS)
def test_a_sampling_number_is_refused_naming_it_or_keeps_the_limit(server, limits, temperature, top_p):
    body = {"text": TEXT, "sampling": True, "nbest": 2, "temperature": temperature, "top_p": top_p}
    answer = server.client.post("/translate", content=json.dumps(body),
                                headers={"content-type": "application/json"})
    bad = ["temperature"] if not float32_holds(temperature) else []
    bad += ["top_p"] if not (float32_holds(top_p) and top_p <= 1) else []
    if bad:
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        # pydantic's own bounds say "top_p: ...", the search's rule "top_p 1e-46: ..."
        assert "\n" not in error and any(error.startswith((f"{field} ", f"{field}:")) for field in bad), error
        return
    assert answer.status_code == 200, answer.text
    for sentence, limit in zip(answer.json()["translations"], limits):
        assert len(sentence["outputs"]) == 2
        for output in sentence["outputs"]:
            assert len(output["text"].split()) <= limit, (output, limit)
