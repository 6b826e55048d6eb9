"""``POST /translate`` with ``"markup": true`` through a real server process (one for the file): every
output, of every n-best list, with a prefix, constraints, word scores or sampling, is the plain request's
output with the source's tags put back, exactly where ``insight.reading.carry_markup`` puts them in this
process (the oracle: the same library call on the same outputs); a text that is not well-formed is a 422
naming it, answered before anything is decoded (the batchers' counts do not move); the alignment pass is
counted in the request's cost (it moves a request to the bulk lane); a CTranslate2 export refuses markup
(409)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import trained_for_decoding
from test_serve import Server

from attnmt.data.markup import parse_markup

TAGGED = ["<b>monday</b> , 3 june 2001",
          "saturday the <i>4th</i> of <a href=\"https://x.org/?a=1&amp;b=2\" title='t'>april</a> 2004",
          "3/6/2001<br/>", "the 12th of <b>may <i>1999</i></b>", "sunday , <em>21</em> october 1987 &amp; so"]
# One sentence whose source pieces (EOS included) are the server's --bulk-above: greedy, it stays in the
# interactive lane (cost = pieces), but with markup (one teacher-forced reading more: 2 x pieces) it is
# decoded in the bulk lane.
EDGE = "<b>4 july</b> 1776"


@pytest.fixture(scope="module")
def model(tiny, tmp_path_factory) -> Path:
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("markup") / "run")


@pytest.fixture(scope="module")
def opened(model):
    """The model opened in this process, as the server's decoder opens it: (translator, config, path)."""
    from attnmt.cli.common import open_translator

    return open_translator(model, "cpu")


@pytest.fixture(scope="module")
def server(model, opened, tmp_path_factory):
    translator = opened[0]
    pieces = sum(len(ids) + 1 for ids in translator.encode([parse_markup(EDGE).text]).ids)
    started = Server(model, tmp_path_factory.mktemp("log") / "server.log", "--max-wait-ms", "5",
                     "--bulk-above", str(pieces))
    yield started
    assert started.stop() == 0


def translate(server, **body) -> list[list[dict]]:
    answer = server.client.post("/translate", json=body)
    assert answer.status_code == 200, answer.text
    return [t["outputs"] for t in answer.json()["translations"]]


def carried(opened, sources: list[str], outputs: list[list[dict]]) -> list[list[str]]:
    """The oracle: ``carry_markup`` in this process on the plain request's outputs, all in one call (the
    server reads them in one batch too), read as ``attnmt align`` reads the model."""
    from attnmt.insight.reading import carry_markup, default_align_options

    translator, cfg, path = opened
    marked = [parse_markup(source) for source in sources]
    pairs = [(m, output["text"]) for m, found in zip(marked, outputs) for output in found]
    tagged = iter(carry_markup(translator, [m for m, _ in pairs], [text for _, text in pairs],
                               default_align_options(cfg, path)))
    return [[next(tagged) for _ in found] for found in outputs]


def assert_carries(sources: list[str], tagged: list[list[dict]], plain: list[list[dict]]) -> None:
    """Each tagged output is well-formed, holds each of its source's tags once (start tags verbatim), and
    without its tags is the plain output, with the same score (and word scores, if any)."""
    assert len(tagged) == len(plain) == len(sources)
    for source, outputs, plain_outputs in zip(sources, tagged, plain):
        expected = sorted((t.open_text, t.close_text) for t in parse_markup(source).tags)
        assert len(outputs) == len(plain_outputs)
        for output, plain_output in zip(outputs, plain_outputs):
            read = parse_markup(output["text"])  # well-formed, or MarkupError
            assert sorted((t.open_text, t.close_text) for t in read.tags) == expected, (source, output)
            assert {**output, "text": read.text} == plain_output


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 3, "nbest": 3}])
def test_every_output_gets_its_tags_where_carry_markup_puts_them(server, opened, options):
    plain = translate(server, text=[parse_markup(s).text for s in TAGGED], **options)
    tagged = translate(server, text=TAGGED, markup=True, **options)
    assert_carries(TAGGED, tagged, plain)
    assert [[o["text"] for o in found] for found in tagged] == carried(opened, TAGGED, plain)
    assert all(len(found) == options.get("nbest", 1) for found in tagged)


def test_one_text_not_a_list(server, opened):
    (tagged,) = translate(server, text=TAGGED[1], markup=True, beam_size=2)
    (plain,) = translate(server, text=parse_markup(TAGGED[1]).text, beam_size=2)
    assert_carries(TAGGED[1:2], [tagged], [plain])
    assert [o["text"] for o in tagged] == carried(opened, TAGGED[1:2], [plain])[0]


@pytest.mark.parametrize("options", [
    {"prefix": ["", "22", "", "", "1"]},
    {"constraints": [["2041"], [], ["07"], [], []]},
    {"scores": "words", "beam_size": 2, "nbest": 2},
    {"sampling": True, "nbest": 2, "seed": 7},
])  # fmt: skip
def test_prefixes_constraints_word_scores_and_sampling_keep_their_outputs(server, opened, options):
    plain = translate(server, text=[parse_markup(s).text for s in TAGGED], **options)
    tagged = translate(server, text=TAGGED, markup=True, **options)
    assert_carries(TAGGED, tagged, plain)
    assert [[o["text"] for o in found] for found in tagged] == carried(opened, TAGGED, plain)
    if "prefix" in options:
        assert parse_markup(tagged[1][0]["text"]).text.startswith("22")


def test_texts_of_tags_alone_or_empty(server):
    """Nothing to translate: the tags alone come back (an empty text stays empty)."""
    tagged = translate(server, text=["<br/>", "", "<b></b>", "<p>3/6/2001</p>"], markup=True, beam_size=1)
    assert [found[0]["text"] for found in tagged[:3]] == ["<br/>", "", "<b></b>"]
    plain = translate(server, text="3/6/2001", beam_size=1)
    assert_carries(["<p>3/6/2001</p>"], tagged[3:], plain)


def batches(server) -> tuple[int, int]:
    lanes = server.client.get("/info").json()["batching"]
    return lanes["batches"], lanes["sentences"]


@pytest.mark.parametrize("text, where", [
    (["monday , 3 june 2001", "<b>monday , 3 june 2001", "4 july 1776"], "text[1]: "),
    (["a </i> b"], "text[0]: "),
    ("x <b><i>y</b></i>", "text: "),
    (["ok", "1 & 2"], "text[1]: "),
])  # fmt: skip
def test_a_text_that_is_not_well_formed_is_a_422_naming_it_before_any_decoding(server, text, where):
    before = batches(server)
    answer = server.client.post("/translate", json={"text": text, "markup": True})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error.startswith(where) and "column " in error and "\n" not in error, error
    assert batches(server) == before
    assert server.client.post("/translate", json={"text": text}).status_code == 200  # plain text: no check


def test_markup_must_be_a_boolean_and_info_says_it_is_supported(server):
    answer = server.client.post("/translate", json={"text": "x", "markup": "yes"})
    assert answer.status_code == 422 and answer.json()["error"].startswith("markup: "), answer.text
    assert server.client.get("/info").json()["markup"] is True


def test_the_alignment_pass_counts_in_the_cost(server):
    """``EDGE`` greedy costs its source pieces, the server's ``--bulk-above``: the interactive lane; with
    markup each output is read once more, twice the pieces: the bulk lane."""
    def lanes() -> list[str]:
        return [line["lane"] for line in server.access() if line["path"] == "/translate"]

    before = len(lanes())
    translate(server, text=parse_markup(EDGE).text, beam_size=1)
    translate(server, text=EDGE, beam_size=1, markup=True)
    deadline = time.monotonic() + 30
    while len(lanes()) < before + 2 and time.monotonic() < deadline:  # written by a thread of its own
        time.sleep(0.05)
    assert lanes()[before:] == ["interactive", "bulk"]


def test_a_ctranslate2_export_refuses_markup():
    """In process, the app alone: a model without attention (``info["attention"]`` False, as an export's)
    answers ``"markup": true`` with 409 before it reaches a lane."""
    from starlette.testclient import TestClient

    from attnmt.serve.api import Served
    from attnmt.serve.server import create_app

    logged: list[str] = []
    served = Served(None, Path("export"), {"attention": False}, logged.append)
    with TestClient(create_app(served, None, "")) as client:
        answer = client.post("/translate", json={"text": ["<b>a</b>"], "markup": True})
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"].startswith("markup: ") and "\n" not in answer.json()["error"]
    assert len(logged) == 1
