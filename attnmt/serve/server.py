"""``attnmt serve``'s HTTP application (FastAPI on Starlette): the routes ``serve_api`` describes, each
request checked against the server's limits (``serve_limits``) and handed to a lane's batcher
(``batcher.Lanes``), a JSON access line per request, every error as one JSON line.

Status codes: 200; 413 a request over the limits; 422 a body that is not JSON (or not UTF-8, nested too
deep, a number of too many digits), a missing, unknown or ill-typed field, text that is not valid Unicode,
a value past a limit, or fields that do not go together; 404 a path and 405 a method the API lacks; 409
``/attention`` on a model without attention maps (a CTranslate2 export); 411 a POST without a length; 503
a request refused because its lane's queue is full (with ``Retry-After``), a batch cut at its CPU-time
budget, or the server stopping; 400 a request that is not HTTP (a bad request line, headers past h11's
size: ``JsonErrorH11``); 500 a bug (its one line, and the traceback in the server's log, never in the
answer). Every one of them is ``{"error": "one line"}``, framework and protocol errors included.

When the process runs out of file descriptors, asyncio cannot accept connections and reports each try
with a traceback, thousands a second; ``quiet_accept_errors`` makes that one line every 10 s: the clients
wait in the listening socket's backlog until others leave.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from ..errors import AttnmtError, ConfigError, DataError
from .api import (
    PAGE_POLICY,
    AttentionRequest,
    ErrorBody,
    Served,
    TranslateRequest,
    access_line,
    one_line,
    settings_for,
    variant_maker,
)
from .batcher import Closed, Lane, Lanes, Overloaded, Settings
from .limits import OverBudget, Refused, TooLarge, check_pieces, check_rows, check_sizes


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def body_error(cause: BaseException | None) -> str:
    """Why a body that FastAPI could not read as JSON is not JSON, in words (it answers a bare 400)."""
    if isinstance(cause, UnicodeDecodeError):
        return (f"the body is not UTF-8 (byte 0x{cause.object[cause.start]:02x} at offset {cause.start}): "
                "send the JSON in UTF-8")
    if isinstance(cause, RecursionError):
        return "the body nests arrays or objects too deeply to read"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "the body holds a number with too many digits (at most 4300)"
    return f"the body could not be read as JSON ({type(cause).__name__})"


def _add_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return _error(422, one_line(list(e.errors())))

    @app.exception_handler(HTTPException)
    async def framework(request: Request, e: HTTPException) -> JSONResponse:
        if e.status_code == 400 and e.__cause__ is not None:  # FastAPI's "error parsing the body"
            return _error(422, body_error(e.__cause__))
        if e.status_code == 404:
            return _error(404, f"{request.url.path}: no such path (the API: POST /translate, /attention; "
                               "GET /health, /info, /docs)")
        if e.status_code == 405:
            return _error(405, f"{request.method} {request.url.path}: method not allowed", e.headers)
        return _error(e.status_code, str(e.detail).replace("\n", " "), e.headers)

    for kind, status in {TooLarge: 413, Refused: 422, Closed: 503, OverBudget: 503}.items():
        app.add_exception_handler(kind, _answers(status))

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, e: Overloaded) -> JSONResponse:
        return _error(503, str(e), {"Retry-After": str(e.retry_after)})

    @app.exception_handler(AttnmtError)
    async def attnmt_error(request: Request, e: AttnmtError) -> JSONResponse:
        return _error(422 if isinstance(e, (ConfigError, DataError)) else 500, str(e))


def _answers(status: int):
    """An exception handler that answers ``status`` with the exception's message."""

    async def handle(request: Request, e: Exception) -> JSONResponse:
        return _error(status, str(e))

    return handle


class Guard:
    """The outermost layer of every request: a POST's size read from its headers (411, 413 before the
    body is read), one JSON access line, and whatever escapes as one JSON line: a bug is a 500 (the
    traceback to the server's log), a request cancelled by the shutdown (its grace ran out) a 503. A plain
    ASGI middleware: Starlette's ``BaseHTTPMiddleware`` raises a cancellation again from its task group,
    which the server would print as a traceback."""

    def __init__(self, app, served: Served) -> None:
        self.app, self.served = app, served

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request, started, status = Request(scope), time.perf_counter(), [0]

        async def sent(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(request)
            await (refusal or self.app)(scope, receive, sent)
        except asyncio.CancelledError:
            self.served.cut = True
            await self._answer(scope, receive, sent, status, 503,
                               "the server stopped before answering (its --grace ran out)")
        except Exception as e:  # a bug: one line to the client, the traceback to the log
            traceback.print_exc(file=sys.stderr)
            first = str(e).splitlines()[0] if str(e) else ""
            await self._answer(scope, receive, sent, status, 500,
                               f"internal error: {type(e).__name__}: {first}")
        finally:
            self.served.log(access_line(request, status[0] or 500, started))

    @staticmethod
    async def _answer(scope, receive, send, status: list[int], code: int, message: str) -> None:
        if not status[0]:  # nothing sent yet
            try:
                await _error(code, message)(scope, receive, send)
            except OSError:  # the client is gone
                pass

    def _refusal(self, request: Request) -> JSONResponse | None:
        limits = self.served.limits
        length = request.headers.get("content-length")
        if length is None and request.method == "POST":  # a chunked body: its size is unknown ahead
            return _error(411, "a POST needs a Content-Length header")
        if length is not None and (not length.isdigit() or int(length) > limits.max_body):
            return _error(413, f"the body is over {limits.max_body} bytes ({limits.max_sentences} sentences "
                               f"of {limits.max_chars} characters, with their prefixes and phrases)")
        return None


def json_error_h11():
    """uvicorn's h11 protocol, but a request it cannot read as HTTP (a bad request line, more header bytes
    than h11 holds) is answered ``{"error": ...}`` as every other error, not uvicorn's plain text."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonErrorH11(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"error": f"not a valid HTTP request ({msg}): send a request line, headers "
                                        "under 16 KiB and a body of the length stated"})
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body.encode("ascii")), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return JsonErrorH11


def quiet_accept_errors(loop, log, every: float = 10.0) -> None:
    """``loop``'s exception handler: asyncio's "socket.accept() out of system resource" (too many open files)
    becomes one line through ``log`` at most every ``every`` seconds; anything else is asyncio's default."""
    last = [-every]

    def handle(loop, context: dict) -> None:
        if context.get("message") != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            cause = context.get("exception")
            log(f"attnmt serve: cannot accept new connections ({cause}): they wait until others close; "
                "raise the limit of open files (ulimit -n) for more clients at once")

    loop.set_exception_handler(handle)


# What each error status means, for the routes' ``responses`` (the OpenAPI document, ``/docs``); the body is
# always ``ErrorBody``, which replaces FastAPI's default validation error in the document as in the answers.
ERROR_MEANINGS = {
    409: "attention maps or markup asked of a CTranslate2 export, which translates only",
    411: "a POST without a Content-Length header",
    413: "a request over the server's sizes: the body's bytes, sentences, characters, phrases (GET /info "
         "states them)",
    422: "a body that is not JSON, a missing, unknown or ill-typed field, text that is not valid Unicode, a "
         "value past a limit, or fields that do not go together",
    500: "a bug: its one line (the traceback is in the server's log)",
    503: "the queue is full (--max-queue-seconds; Retry-After says when to try again), a batch cut at its "
         "CPU-time budget (--max-request-seconds), or the server stopping",
}


def error_answers(*statuses: int) -> dict[int | str, dict]:
    """The ``responses`` of a route that may answer these error statuses, each with ``ErrorBody``."""
    return {status: {"model": ErrorBody, "description": ERROR_MEANINGS[status]} for status in statuses}


def _admit(served: Served, variant, lines: list[str], prefixes: list[str] | None,
           constraints: list[list[str]] | None, settings: Settings, beam_given: bool, lanes: Lanes,
           drawn: bool = False) -> tuple[Lane, int]:
    """Check a request against every limit, before it reaches a queue; the lane its cost picks, and the
    cost. ``drawn``: its attention maps are drawn too, which read the source whole where the search reads
    it cut to ``decode.max_src_len``, so the whole source's pieces count. With ``settings.markup``,
    ``lines`` are the texts without their tags (what is decoded), and each output is read once more under
    teacher forcing to place the tags: the source's pieces x outputs more."""
    sampling = settings.sampling is not None
    rows = settings.nbest if sampling else settings.beam_size
    check_rows(served.limits, rows, beam_given, sampling)
    exported = not served.info["attention"]
    cost = check_pieces(variant(settings), lines, prefixes, constraints, exported)
    if drawn:
        cost = max(cost, lanes.interactive.batcher.measure(lines) * rows)
    if settings.markup:
        cost += lanes.interactive.batcher.measure(lines) * settings.nbest
    return lanes.lane(cost), cost


def _add_routes(app: FastAPI, served: Served, lanes: Lanes, page: str) -> None:
    translator, variant = served.translator, variant_maker(served.translator)

    @app.post("/translate", summary="Translate sentences (attnmt translate's options).",
              responses=error_answers(409, 411, 413, 422, 500, 503))
    async def translate(body: TranslateRequest, request: Request) -> dict:
        lines, prefixes = body.lines(), body.prefixes()
        check_sizes(served.limits, lines, prefixes, body.constraints)
        if body.markup and not served.info["attention"]:
            return _error(409, "markup: placing tags reads the model's attention, which a CTranslate2 export "
                               "does not give: serve the checkpoint")
        settings = settings_for(translator, body.beam_size, body.nbest, body.length_penalty,
                                body.sampling_settings(), body.scores == "words", body.tgt_lang, served.data,
                                body.markup)
        given = body.beam_size is not None
        marked = body.marked()  # the decoder parses the lines again: the tags travel as the text sent
        texts = lines if marked is None else [m.text for m in marked]
        lane, _ = _admit(served, variant, texts, prefixes, body.constraints, settings, given, lanes)
        _note(request, lane, lines)
        found = await asyncio.wrap_future(lane.batcher.submit(lines, settings, prefixes, body.constraints))
        return {"translations": [result.as_json() for result in found]}

    @app.post("/attention", summary="Translate one sentence; its attention and word alignment.",
              responses=error_answers(409, 411, 413, 422, 500, 503))
    async def attention(body: AttentionRequest, request: Request) -> JSONResponse:
        prefixes = [body.prefix] if body.prefix is not None else None
        constraints = [body.constraints] if body.constraints else None
        check_sizes(served.limits, [body.text], prefixes, constraints)
        if not served.info["attention"]:
            return _error(409, "attention maps need the checkpoint: a CTranslate2 export translates only")
        if not body.text.strip():
            raise Refused("text: expected a sentence, got an empty one")
        settings = settings_for(translator, body.beam_size, 1, body.length_penalty, None,
                                tgt_lang=body.tgt_lang, data=served.data)
        given = body.beam_size is not None
        lane, cost = _admit(served, variant, [body.text], prefixes, constraints, settings, given, lanes,
                            drawn=True)
        _note(request, lane, [body.text])
        asked = lane.batcher.submit([body.text], settings, prefixes, constraints)
        (found,) = await asyncio.wrap_future(asked)
        text, score = found.outputs[0]
        packed = await asyncio.wrap_future(lane.batcher.call(
            lambda: lane.draw(body.text, text, settings.source_prefix), cost))
        links = packed.data["sentences"][0]["links"] if packed.data["sentences"] else []
        return JSONResponse({"translation": text, "score": score, "truncated": found.truncated,
                             "alignment": links, "data": packed.data, "weights": packed.weights,
                             "bytes": packed.bytes})

    _add_status(app, served, lanes)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def home() -> HTMLResponse:
        return HTMLResponse(page, headers={"Content-Security-Policy": PAGE_POLICY})

    _add_docs(app)


def _note(request: Request, lane: Lane, lines: list[str]) -> None:
    """What the access line says of a request: its sentences, source pieces and lane."""
    request.state.sentences, request.state.tokens = len(lines), lane.batcher.measure(lines)
    request.state.lane = lane.name


def _add_status(app: FastAPI, served: Served, lanes: Lanes) -> None:
    @app.get("/health", summary="Whether the server answers, and the requests waiting.",
             responses=error_answers(500))
    async def health() -> dict:
        return {"status": "ok", "pending": lanes.pending()}

    @app.get("/info", summary="The model, its languages, parameters, decode defaults, limits and lanes.",
             responses=error_answers(500))
    async def info() -> dict:
        first = lanes.interactive.batcher
        described = lanes.describe()
        return {**served.info, "markup": served.info["attention"],  # tags are placed by the attention
                "limits": served.limits.describe(served.translator),
                "batching": {"max_batch_tokens": first.max_batch_tokens,
                             "max_wait_ms": first.max_wait_s * 1000,
                             "batches": sum(lane["batches"] for lane in described.values()),
                             "sentences": sum(lane["sentences"] for lane in described.values()),
                             "largest": max(lane["largest"] for lane in described.values()),
                             "lanes": described}}


def _add_docs(app: FastAPI) -> None:
    """``/docs`` with Swagger UI's files from the ``swagger-ui-bundle`` package (FastAPI's default page
    loads them from a CDN)."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/docs-assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title="attnmt API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon-32x32.png")


def create_app(served: Served, lanes: Lanes, page: str, lifespan=None) -> FastAPI:
    """The application; ``page`` is the HTML of ``/`` (``serve_api.page_html``)."""
    app = FastAPI(title="attnmt", summary="Attention-based neural machine translation", docs_url=None,
                  redoc_url=None, lifespan=lifespan)
    _add_errors(app)
    app.add_middleware(Guard, served=served)
    _add_routes(app, served, lanes, page)
    return app
