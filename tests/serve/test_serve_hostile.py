"""``attnmt serve`` against hostile and careless clients: every field that costs decoding refused over
its limit before it is queued (and the limits stated in ``/info``), a batch cut at the time budget while
the others go on, the bulk lane that keeps one-line requests answered beside the largest ones, every
error one JSON shape (framework errors, bodies that are not UTF-8 or not Unicode), and a property test
that throws random bodies at the server: whatever comes, a documented status and ``{"error": one line}``,
never a 500."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import trained_for_decoding
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serve import LINES, Server, best

LIMITS = ("--max-sentences", "16", "--max-chars", "300", "--max-beam", "6", "--max-phrases", "3",
          "--max-request-seconds", "3", "--bulk-above", "200")


@pytest.fixture(scope="module")
def model(tiny, tmp_path_factory):
    return trained_for_decoding(tiny, tmp_path_factory.mktemp("hostile") / "run")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    started = Server(model, tmp_path_factory.mktemp("log") / "server.log", *LIMITS)
    yield started
    assert started.stop() == 0


def batches(server) -> int:
    return server.client.get("/info").json()["batching"]["batches"]


# Every limit at its top, the translations forced through a 300-piece prefix: hundreds of steps of 96 rows.
HEAVY = {"text": ["monday , 3 june 2001 , " * 13] * 16, "prefix": ["1" * 300] * 16, "beam_size": 6}

OVER = [  # (body, status, what the one line starts with)
    ({"text": ["a"] * 17}, 413, "text: 17 sentences, at most 16"),
    ({"text": ["a", "b" * 301]}, 413, "text[1]: 301 characters"),
    ({"text": "a", "prefix": "1" * 301}, 413, "prefix[0]: 301 characters"),
    ({"text": ["a", "b"], "prefix": ["", "2 " * 60]}, 422, "prefix[1]: *more than the sentence's length"),
    ({"text": "a", "constraints": [["1", "2", "3", "4"]]}, 413, "constraints[0]: 4 phrases, at most 3"),
    ({"text": "a", "constraints": [["1" * 150, "2" * 151]]}, 413, "constraints[0]: 301 characters in all"),
    ({"text": "a", "beam_size": 7}, 422, "beam_size: 7 beam rows per sentence, at most 6"),
    ({"text": "a", "beam_size": 5, "nbest": 7}, 422, "nbest 7 must not exceed the beam size 5"),
    ({"text": "a", "nbest": 7}, 422, "nbest: 7 beam rows per sentence, at most 6"),
    ({"text": "a", "sampling": True, "nbest": 7}, 422, "nbest: 7 beam rows"),
]


@pytest.mark.parametrize("body, status, start", OVER, ids=[str(k) for k in range(len(OVER))])
def test_every_costly_field_is_refused_over_its_limit_before_the_queue(server, body, status, start):
    before = batches(server)
    answer = server.client.post("/translate", json=body)
    assert answer.status_code == status, answer.text
    first, _, rest = start.partition("*")  # what the line starts with, and what it holds after that
    message = answer.json()["error"]
    assert message.startswith(first) and rest in message, message
    assert batches(server) == before  # never decoded
    assert server.client.post("/translate", json={"text": LINES[0]}).status_code == 200


def test_the_limits_are_stated_and_attention_keeps_them(server):
    limits = server.client.get("/info").json()["limits"]
    assert (limits["max_sentences"], limits["max_chars"], limits["max_beam"], limits["max_phrases"],
            limits["max_request_seconds"], limits["bulk_above"]) == (16, 300, 6, 3, 3.0, 200)
    for body, status in (({"text": "a", "prefix": "1" * 301}, 413), ({"text": "a", "beam_size": 7}, 422),
                         ({"text": "a", "constraints": ["1", "2", "3", "4"]}, 413)):
        assert server.client.post("/attention", json=body).status_code == status


def test_small_requests_go_on_beside_the_largest_ones(server):
    """The largest request the limits allow goes to the bulk lane; one-line requests sent while it runs are
    answered first, by the interactive lane, and as they are alone."""
    alone = [best(server.client.post("/translate", json={"text": line}).json())[0] for line in LINES[:3]]
    with ThreadPoolExecutor(2) as pool:
        heavy = pool.submit(server.client.post, "/translate", json=HEAVY)
        time.sleep(0.1)
        light = [server.client.post("/translate", json={"text": line}) for line in LINES[:3]]
        assert not heavy.done()
        assert heavy.result().status_code in (200, 503)  # 503: it ran past the budget
    assert [best(answer.json())[0] for answer in light] == alone
    assert lanes_logged(server, until="bulk")[-4:] == ["interactive"] * 3 + ["bulk"]


def lanes_logged(server, until: str) -> list[str]:
    """The lanes of the translations in the access log, once its last is ``until``'s (the log is written
    by a thread of the server's, a moment after the answer), or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        lanes = [line["lane"] for line in server.access() if line["path"] == "/translate" and line["lane"]]
        if lanes[-1:] == [until] or time.monotonic() > deadline:
            return lanes
        time.sleep(0.05)


def test_a_batch_past_the_budget_is_cut_and_the_server_goes_on(model, tmp_path):
    """A budget of 10 ms: the heavy batch is cut at it, answered 503 naming the budget; the decoder goes
    on (a one-line request after it is answered, or cut at the budget in turn) and the server too."""
    server = Server(model, tmp_path / "server.log", *LIMITS[:-4], "--max-request-seconds", "0.01",
                    "--bulk-above", "0")
    try:
        cut = server.client.post("/translate", json=HEAVY)
        assert cut.status_code == 503, cut.text
        assert cut.json()["error"].startswith("the batch ran over the server's time budget of 0.01 s "
                                              "(--max-request-seconds)")
        after = server.client.post("/translate", json={"text": LINES[0]})
        assert after.status_code == 200 or after.json() == cut.json()
        assert server.client.get("/health").json() == {"status": "ok", "pending": 0}
    finally:
        assert server.stop() == 0


FRAMEWORK = [  # raw bodies FastAPI answered 400 {"detail": ...} or the tokenizer a 500
    (b'{"text": "\\ud83d"}', "text: not valid Unicode: a lone surrogate"),
    (b'{"text": ["ok", "\\udc00x"]}', "text[1]: not valid Unicode"),
    (b'{"text": "a", "prefix": "\\ud83d"}', "prefix: not valid Unicode"),
    (b'{"text": ["a"], "constraints": [["\\ud83d"]]}', "constraints[0][0]: not valid Unicode"),
    (b'{"text": "a", "tgt_lang": "\\ud83d"}', "tgt_lang: not valid Unicode"),
    ('{"text": "m\xe4rz"}'.encode("latin-1"), "the body is not UTF-8 (byte 0xe4 at offset 11)"),
    (b"[" * 100_000, "the body nests arrays or objects too deeply"),
    (b'{"text": "a", "seed": ' + b"9" * 5000 + b"}", "the body holds a number with too many digits"),
]


@pytest.mark.parametrize("body, start", FRAMEWORK, ids=[str(k) for k in range(len(FRAMEWORK))])
def test_framework_errors_are_one_json_line_too(server, body, start):
    for path in ("/translate", "/attention"):  # /attention takes one sentence: a list there is a wrong type
        answer = server.client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 422, answer.text
        message = answer.json()["error"]
        assert message.startswith(start) or (path == "/attention" and "[" in start), message


def test_unknown_paths_and_methods_answer_the_same_shape(server):
    missing = server.client.post("/nothere", json={"text": "a"})
    assert missing.status_code == 404 and missing.json()["error"].startswith("/nothere: no such path")
    wrong = server.client.get("/translate")
    assert wrong.status_code == 405 and wrong.json() == {"error": "GET /translate: method not allowed"}
    assert wrong.headers["allow"] == "POST"


# Any JSON value, strings with lone surrogates and control characters included, and numbers of any size.
characters = st.characters(codec=None, exclude_categories=())
values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) |
                      st.text(characters, max_size=40),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4), max_leaves=12)
fields = st.fixed_dictionaries({}, optional={
    "text": st.one_of(values, st.text(characters, max_size=60), st.lists(st.text(characters, max_size=40),
                                                                         max_size=4)),
    "beam_size": st.one_of(values, st.integers(-2, 9)), "nbest": st.one_of(values, st.integers(-2, 9)),
    "prefix": st.one_of(values, st.text(characters, max_size=40)), "sampling": values,
    "constraints": st.one_of(values, st.lists(st.lists(st.text(characters, max_size=10), max_size=4),
                                              max_size=2)),
    "length_penalty": values, "temperature": values, "top_k": values, "top_p": values, "seed": values,
    "scores": st.one_of(values, st.just("words")), "tgt_lang": values})
bodies = st.one_of(fields.map(lambda body: json.dumps(body).encode()), st.binary(max_size=60),
                   values.map(lambda value: json.dumps(value).encode()))
STATUSES = {200, 413, 422}


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=bodies, path=st.sampled_from(["/translate", "/attention"]))
def test_whatever_a_client_sends_the_answer_is_documented(server, body, path):
    answer = server.client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code in STATUSES, (body, answer.text)
    if answer.status_code != 200:
        error = answer.json()
        assert list(error) == ["error"] and "\n" not in error["error"] and error["error"], (body, error)


def test_the_openapi_document_states_the_error_body_the_server_sends(server):
    """``/docs`` and the generated API reference read the document: every error a route declares is
    ``ErrorBody``, FastAPI's default validation error is gone, and a real 422 has ErrorBody's one field."""
    document = server.client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and list(schemas["ErrorBody"]["properties"]) == ["error"]
    declared = {path: {status: answer["content"]["application/json"]["schema"]
                       for op in methods.values() for status, answer in op["responses"].items()
                       if status != "200"}
                for path, methods in document["paths"].items()}
    assert set(declared["/translate"]) >= {"413", "422", "503"} and "409" in declared["/attention"]
    assert {ref["$ref"] for errors in declared.values() for ref in errors.values()} == {
        "#/components/schemas/ErrorBody"}
    answer = server.client.post("/translate", json={"text": "a", "beam_size": 0})
    assert answer.status_code == 422 and list(answer.json()) == list(schemas["ErrorBody"]["properties"])
