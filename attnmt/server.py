"""``attnmt serve``'s HTTP application (FastAPI on Starlette): the routes ``serve_api`` describes, one
``Batcher`` behind them, a JSON access line per request, errors as one JSON line.

Status codes: 200; 413 a request over the limits; 422 a body that is not JSON, a missing, unknown or
ill-typed field, or fields that do not go together; 409 ``/attention`` on a model without attention maps
(a CTranslate2 export); 503 while the server is stopping; 500 a bug (its one line, and the traceback in
the server's log, never in the answer).
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from .batcher import Batcher, Closed
from .errors import AttnmtError, ConfigError, DataError
from .serve_api import (
    PAGE_POLICY,
    AttentionRequest,
    Refused,
    Served,
    TooLarge,
    TranslateRequest,
    access_line,
    check_constraints,
    one_line,
    settings_for,
)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _add_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return _error(422, one_line(list(e.errors())))

    @app.exception_handler(TooLarge)
    async def too_large(request: Request, e: TooLarge) -> JSONResponse:
        return _error(413, str(e))

    @app.exception_handler(Refused)
    async def refused(request: Request, e: Refused) -> JSONResponse:
        return _error(422, str(e))

    @app.exception_handler(Closed)
    async def closed(request: Request, e: Closed) -> JSONResponse:
        return _error(503, str(e))

    @app.exception_handler(AttnmtError)
    async def attnmt_error(request: Request, e: AttnmtError) -> JSONResponse:
        return _error(422 if isinstance(e, (ConfigError, DataError)) else 500, str(e))


def _add_middleware(app: FastAPI, served: Served) -> None:
    @app.middleware("http")
    async def limit_and_log(request: Request, call_next):
        started = time.perf_counter()
        status = 500
        try:
            length = request.headers.get("content-length")
            if length is None and request.method == "POST":  # a chunked body: its size is unknown ahead
                status = 411
                response = _error(411, "a POST needs a Content-Length header")
            elif length is not None and (not length.isdigit() or int(length) > served.limits.max_body):
                status = 413
                response = _error(413, f"the body is over {served.limits.max_body} bytes "
                                       f"({served.limits.max_sentences} sentences of "
                                       f"{served.limits.max_chars} characters)")
            else:
                response = await call_next(request)
                status = response.status_code
            return response
        except asyncio.CancelledError:  # the shutdown's grace ran out with this request unanswered
            served.cut = True
            status = 503
            return _error(503, "the server stopped before answering (its --grace ran out)")
        except Exception as e:  # a bug: one line to the client, the traceback to the log
            traceback.print_exc(file=sys.stderr)
            first = str(e).splitlines()[0] if str(e) else ""
            return _error(500, f"internal error: {type(e).__name__}: {first}")
        finally:
            served.log(access_line(request, status, started))


def _check_size(served: Served, lines: list[str]) -> None:
    limits = served.limits
    if not lines:
        raise Refused("text: expected at least one sentence")
    if len(lines) > limits.max_sentences:
        raise TooLarge(f"text: {len(lines)} sentences, at most {limits.max_sentences} per request")
    for k, line in enumerate(lines):
        if len(line) > limits.max_chars:
            raise TooLarge(f"text[{k}]: {len(line)} characters, at most {limits.max_chars} per sentence")


def _add_routes(app: FastAPI, served: Served, batcher: Batcher, page: str) -> None:
    translator = served.translator

    @app.post("/translate", summary="Translate sentences (attnmt translate's options).")
    async def translate(body: TranslateRequest, request: Request) -> dict:
        lines = body.lines()
        _check_size(served, lines)
        draw = body.sampling_settings()
        settings = settings_for(translator, body.beam_size, body.nbest, body.length_penalty, draw,
                                body.scores == "words", body.tgt_lang, served.data)
        check_constraints(served, lines, body.constraints, settings)
        request.state.sentences, request.state.tokens = len(lines), batcher.measure(lines)
        found = await asyncio.wrap_future(batcher.submit(lines, settings, body.prefixes(), body.constraints))
        return {"translations": [result.as_json() for result in found]}

    @app.post("/attention", summary="Translate one sentence; its attention and word alignment.")
    async def attention(body: AttentionRequest, request: Request) -> JSONResponse:
        _check_size(served, [body.text])
        if not served.info["attention"]:
            return _error(409, "attention maps need the checkpoint: a CTranslate2 export translates only")
        if not body.text.strip():
            raise Refused("text: expected a sentence, got an empty one")
        settings = settings_for(translator, body.beam_size, 1, body.length_penalty, None,
                                tgt_lang=body.tgt_lang, data=served.data)
        constraints = [body.constraints] if body.constraints else None
        check_constraints(served, [body.text], constraints, settings)
        request.state.sentences, request.state.tokens = 1, batcher.measure([body.text])
        prefixes = [body.prefix] if body.prefix is not None else None
        (found,) = await asyncio.wrap_future(batcher.submit([body.text], settings, prefixes, constraints))
        text, score = found.outputs[0]
        packed = await asyncio.wrap_future(batcher.call(
            lambda: served.draw(body.text, text, settings.source_prefix)))
        links = packed.data["sentences"][0]["links"] if packed.data["sentences"] else []
        return JSONResponse({"translation": text, "score": score, "truncated": found.truncated,
                             "alignment": links, "data": packed.data, "weights": packed.weights,
                             "bytes": packed.bytes})

    @app.get("/health", summary="Whether the server answers, and the requests waiting.")
    async def health() -> dict:
        return {"status": "ok", "pending": batcher.pending()}

    @app.get("/info", summary="The model, its languages, parameters, decode defaults and the limits.")
    async def info() -> dict:
        stats = batcher.stats
        return {**served.info, "limits": {"max_sentences": served.limits.max_sentences,
                                          "max_chars": served.limits.max_chars},
                "batching": {"max_batch_tokens": batcher.max_batch_tokens,
                             "max_wait_ms": batcher.max_wait_s * 1000,
                             "batches": stats.batches,
                             "sentences": stats.sentences, "largest": stats.largest}}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def home() -> HTMLResponse:
        return HTMLResponse(page, headers={"Content-Security-Policy": PAGE_POLICY})

    _add_docs(app)


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


def create_app(served: Served, batcher: Batcher, page: str, lifespan=None) -> FastAPI:
    """The application; ``page`` is the HTML of ``/`` (``serve_api.page_html``)."""
    app = FastAPI(title="attnmt", summary="Attention-based neural machine translation", docs_url=None,
                  redoc_url=None, lifespan=lifespan)
    _add_errors(app)
    _add_middleware(app, served)
    _add_routes(app, served, batcher, page)
    return app
