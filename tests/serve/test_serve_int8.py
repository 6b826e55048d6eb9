"""``attnmt serve --int8`` through a real server process: ``/info`` says the model is int8, ``/translate``
answers what the model quantized in this process finds (the oracle: the same ``open_translator`` call the
server's decoders make, in this process, on the same lines), and ``/attention`` reads the quantized model's
attention."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import trained_for_decoding
from test_serve import Server

LINES = ["march 14th 2019", "tuesday , march 14th , 2019 at 7:05 pm", "the 3rd of june 1999"]


@pytest.fixture(scope="module")
def model(tiny, tmp_path_factory) -> Path:
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("int8") / "run")


def test_an_int8_server_answers_as_the_quantized_model(model, tmp_path):
    from attnmt.cli.common import open_translator
    from attnmt.decoding.quantize import quantized
    from attnmt.decoding.translator import DecodeOverrides

    translator = open_translator(model, "cpu", DecodeOverrides(int8=True))[0]
    assert quantized(translator.model)
    server = Server(model, tmp_path / "server.log", "--int8", "--max-wait-ms", "5")
    try:
        info = server.client.get("/info").json()
        assert info["quantize"] == "int8" and info["parameters"] > 0, info
        for beam in (1, 3):
            answer = server.client.post("/translate", json={"text": LINES, "beam_size": beam})
            assert answer.status_code == 200, answer.text
            found = [t["outputs"][0]["text"] for t in answer.json()["translations"]]
            assert found == translator.with_overrides(DecodeOverrides(beam_size=beam)).best(LINES)
        attention = server.client.post("/attention", json={"text": LINES[1]})
        assert attention.status_code == 200, attention.text
    finally:
        assert server.stop() == 0
