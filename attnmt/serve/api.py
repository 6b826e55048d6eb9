"""``attnmt serve``'s requests and answers: the JSON bodies, their checks, the limits, the page.

Endpoints (every error is JSON ``{"error": "one line"}``, never a traceback):

- ``POST /translate`` ``{"text": [...] or "...", "beam_size", "nbest", "length_penalty", "sampling",
  "temperature", "top_k", "top_p", "seed", "prefix", "constraints", "scores", "tgt_lang", "markup"}``: the
  options and checks of ``attnmt translate``; a bad field is 422 naming it, text that is not valid Unicode
  too (``check_unicode``); whatever costs decoding is bounded by the server's limits (``serve_limits``: 413
  or 422 naming the field). Answers ``{"translations": [{"outputs": [{"text",
  "score"}], "truncated"}]}``, one entry per sentence in order (a score is null where the model has none
  to give: a CTranslate2 export's single output). ``"markup": true``: each text's inline tags are taken
  out (``data.markup.parse_markup``; a text that is not well-formed is a 422 naming it, ``text[2]: column
  5: ...``, before anything is decoded), the rest is translated, and every output gets the tags back
  around the words aligned to those they wrapped (``insight.reading.carry_markup``, in the decoder).
- ``POST /attention`` ``{"text": "...", "beam_size", "length_penalty", "prefix", "constraints",
  "tgt_lang"}``: the best translation, its
  score, the word alignment ``attnmt align`` would read (``[source word, target word]`` pairs) and every
  layer and head of the cross-, encoder self- and decoder self-attention in the explorer's data format
  (``explorer.Packed``: ``data``, ``weights``, ``bytes``).
- ``GET /health``: ``{"status": "ok", "pending": requests waiting}``; ``GET /info``: the model, its
  languages, parameters, decode defaults, whether it takes markup (not an export), the limits and what
  each lane's batcher has done.
- ``GET /``: the page (``attnmt/web/serve.*`` with the explorer's heatmap and lines); ``GET /docs``:
  the OpenAPI page, its script and style served from the ``swagger-ui-bundle`` package, not a CDN.

One JSON line per request goes to stderr (``access_line``): time, client, method, path, status, latency
in ms, sentences, source pieces and lane. The routes are ``server.py``'s.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from starlette.requests import Request

from ..config.schema import DataConfig
from ..data.markup import MarkedText, MarkupError, parse_markup
from ..decoding.search import Sampling
from ..decoding.translator import DecodeOverrides, Translator
from ..errors import ConfigError
from .batcher import Settings
from .limits import Limits, Refused


@dataclass
class Served:
    """The model behind the server: its translator, where it came from, and its description for /info."""

    translator: Translator  # for the settings and the tokenizer; the decoding is the lanes'
    path: Path
    info: dict
    log: Callable[[str], None]  # one access line (``AccessLog.write``)
    limits: Limits = field(default_factory=Limits)
    cut: bool = False  # a request was cancelled before it was answered (the shutdown ran out of time)
    data: DataConfig | None = None  # the model's data section: its target languages (``tgt_lang``)


class AccessLog:
    """One line per request to stderr, written by a thread of its own (``logging``'s queue handler and
    listener): a slow reader of stderr (a full pipe) must not stall the event loop that answers requests."""

    def __init__(self, stream=None) -> None:
        import logging
        import logging.handlers
        import queue
        import sys

        lines: queue.SimpleQueue = queue.SimpleQueue()
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.listener = logging.handlers.QueueListener(lines, handler)
        self.listener.start()
        self.logger = logging.Logger("attnmt.access")  # not the root logger's: nothing else writes here
        self.logger.addHandler(logging.handlers.QueueHandler(lines))

    def write(self, line: str) -> None:
        self.logger.info(line)

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self.listener.stop()


Number = StrictInt | StrictFloat


class TranslateRequest(BaseModel):
    """The body of ``POST /translate``: ``attnmt translate``'s options."""

    model_config = ConfigDict(extra="forbid")
    text: list[str] | str = Field(description="One sentence, or a list of them.")
    beam_size: StrictInt | None = Field(None, ge=1, description="1: greedy; default the model's.")
    nbest: StrictInt = Field(1, ge=1, description="Outputs per sentence.")
    length_penalty: Number | None = Field(None, ge=0, description="GNMT alpha; default the model's.")
    sampling: StrictBool = Field(False, description="Draw instead of searching (nbest samples).")
    temperature: Number | None = Field(None, gt=0)
    top_k: StrictInt | None = Field(None, ge=0)
    top_p: Number | None = Field(None, gt=0, le=1)
    seed: StrictInt | None = Field(None, ge=0, le=2**64 - 1)
    prefix: list[str] | str | None = Field(None, description="What each translation starts with, one per "
                                           "sentence (\"\": none), as translate --prefix.")
    scores: Literal["words"] | None = Field(None, description="words: each output's words with their "
                                            "probabilities, as translate --scores words.")
    tgt_lang: StrictStr | None = Field(None, description="A multilingual model's target language, as "
                                       "translate --tgt-lang.")
    constraints: list[list[StrictStr]] | None = Field(None, description="The phrases each translation "
                                                      "must hold, a list per sentence, as translate "
                                                      "--constraints.")
    markup: StrictBool = Field(False, description="Each text holds inline XML/HTML tags (<b>, <a href=...>, "
                               "<br/>, entities), as translate --markup: they are taken out, the text is "
                               "translated, and each tag is put back around the words aligned to those it "
                               "wrapped, in every output; prefix and constraints are plain text.")

    @model_validator(mode="after")
    def _sampling_options(self) -> TranslateRequest:
        check_unicode(self, ("text", "prefix", "constraints", "tgt_lang"))
        self.marked()  # markup that is not well-formed: a ValueError naming the text
        options = ("temperature", "top_k", "top_p", "seed")
        given = [name for name in options if getattr(self, name) is not None]
        if given and not self.sampling:
            raise ValueError(f"{given[0]} is a sampling option: add \"sampling\": true")
        if self.sampling and self.beam_size is not None and self.beam_size > 1:
            raise ValueError(f"sampling draws instead of searching: it cannot be used with beam_size "
                             f"{self.beam_size}")
        for name in ("length_penalty", "temperature", "top_p"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name}: expected a finite number")
        self.sampling_settings()  # the search's own rule (``check_sampling``): a ValueError naming the field
        prefixes = self.prefixes()
        if prefixes is not None and len(prefixes) != len(self.lines()):
            raise ValueError(f"prefix: {len(prefixes)} prefixes for {len(self.lines())} sentences")
        if self.constraints is not None and len(self.constraints) != len(self.lines()):
            raise ValueError(f"constraints: {len(self.constraints)} lists for {len(self.lines())} sentences")
        if self.constraints is not None and self.sampling:
            raise ValueError("constraints need a search: they cannot be used with sampling")
        return self

    def prefixes(self) -> list[str] | None:
        return [self.prefix] if isinstance(self.prefix, str) else self.prefix

    def sampling_settings(self) -> Sampling | None:
        """``attnmt translate --sampling``'s defaults for the options not given; None without sampling."""
        if not self.sampling:
            return None
        given = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}
        return Sampling(**{name: value for name, value in given.items() if value is not None})

    def lines(self) -> list[str]:
        return [self.text] if isinstance(self.text, str) else list(self.text)

    def marked(self) -> list[MarkedText] | None:
        """With ``markup``, each text parsed (``parse_markup``; a ValueError naming the text and the column
        where it is not well-formed); None without."""
        if not self.markup:
            return None
        found = []
        for k, line in enumerate(self.lines()):
            try:
                found.append(parse_markup(line))
            except MarkupError as e:
                where = "text" if isinstance(self.text, str) else f"text[{k}]"
                raise ValueError(f"{where}: {e}") from None
        return found


class AttentionRequest(BaseModel):
    """The body of ``POST /attention``: one sentence and how to search for its translation (``/translate``'s
    ``prefix``, ``constraints`` and ``tgt_lang`` for this one sentence, so that the map is of the same
    translation)."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="One sentence.")
    beam_size: StrictInt | None = Field(None, ge=1)
    length_penalty: Number | None = Field(None, ge=0)
    prefix: StrictStr | None = Field(None, description="What the translation starts with.")
    constraints: list[StrictStr] | None = Field(None, description="The phrases it must hold.")
    tgt_lang: StrictStr | None = Field(None, description="A multilingual model's target language.")

    @model_validator(mode="after")
    def _unicode(self) -> AttentionRequest:
        check_unicode(self, ("text", "prefix", "constraints", "tgt_lang"))
        return self


class ErrorBody(BaseModel):
    """The body of every answer but a 200, whatever the error (a framework's too): one line, never a
    traceback."""

    error: str = Field(description="What went wrong, in one line; a bad field is named as the request spells "
                       "it (text[2], beam_size).")


def check_unicode(body: BaseModel, names: tuple[str, ...]) -> None:
    """A ValueError naming the first string of these fields that is not valid Unicode: JSON may carry a
    lone surrogate (``"\\ud83d"``, what ``JSON.stringify`` writes for a string cut inside an emoji), which
    no tokenizer can encode."""
    for name in names:
        _check_text(name, getattr(body, name))


def _check_text(where: str, value: object) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            code = ord(value[e.start])
            raise ValueError(f"{where}: not valid Unicode: a lone surrogate (\\u{code:04x}) at character "
                             f"{e.start}; send whole characters (a string cut inside an emoji leaves half "
                             "of one)") from None
    elif isinstance(value, list):
        for k, item in enumerate(value):
            _check_text(f"{where}[{k}]", item)


def settings_for(translator: Translator, beam_size: int | None, nbest: int, length_penalty: float | None,
                 sampling: Sampling | None, words: bool = False, tgt_lang: str | None = None,
                 data: DataConfig | None = None, markup: bool = False) -> Settings:
    """The request's settings over the model's decode defaults, checked as ``attnmt translate`` checks
    them (``DecodeOverrides``, the fields named as the request names them); ``tgt_lang`` against the
    model's ``data`` section (``DataConfig.prefix_for``); ``markup``: the lines hold tags to carry."""
    overrides = DecodeOverrides(beam_size, nbest, length_penalty, sampling=sampling, spelling="api")
    try:
        decode = overrides.apply(translator.decode, translator.tokenizer.tgt_vocab_size)
        prefix = data.prefix_for(tgt_lang, "tgt_lang") if data is not None else translator.source_prefix
    except ConfigError as e:
        raise Refused(str(e)) from None
    return Settings(decode.beam_size, decode.nbest, float(decode.length_penalty), sampling, words, prefix,
                    markup)


def variant_maker(translator: Translator) -> Callable[[Settings], Translator]:
    """``Batcher``'s ``variant``: the translator with a request's settings (kept, but for sampling, whose
    draws must start from the request's seed)."""
    cache: dict[Settings, Translator] = {}

    def variant(settings: Settings) -> Translator:
        if settings in cache:
            return cache[settings]
        made = translator.with_overrides(DecodeOverrides(settings.beam_size, settings.nbest,
                                                         settings.length_penalty, sampling=settings.sampling))
        made.source_prefix = settings.source_prefix
        if settings.sampling is None and len(cache) < 64:
            cache[settings] = made
        return made

    return variant


def one_line(errors: list[dict]) -> str:
    """A pydantic validation error as one line: where (``text[2]``, ``beam_size``) and what."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}"
    where = ""
    for part in first.get("loc", ())[1:] if first.get("loc", ("",))[0] == "body" else first.get("loc", ()):
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    message = first.get("msg", "invalid").removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def access_line(request: Request, status: int, started: float) -> str:
    state = request.state
    return json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "client": request.client.host if request.client else None,
                       "method": request.method, "path": request.url.path, "status": status,
                       "ms": round((time.perf_counter() - started) * 1000, 2),
                       "sentences": getattr(state, "sentences", 0), "tokens": getattr(state, "tokens", 0),
                       "lane": getattr(state, "lane", None)})


def page_html() -> str:
    """``/``: the serve page's body and script with the explorer's controls, style and script."""
    files = resources.files("attnmt") / "web"
    read = {name: (files / name).read_text(encoding="utf-8") for name in
            ("explorer.css", "serve.css", "serve_body.html", "explorer_body.html", "explorer.js", "serve.js")}
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<link rel=\"icon\" href=\"data:,\">\n<title>attnmt</title>\n"
            f"<style>{read['explorer.css']}{read['serve.css']}</style>\n</head>\n<body data-draws=\"0\">\n"
            f"{read['serve_body.html']}<section id=\"serve-attention\" hidden>\n{read['explorer_body.html']}"
            f"</section>\n<script>{read['explorer.js']}</script>\n<script>{read['serve.js']}</script>\n"
            "</body>\n</html>\n")


PAGE_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
               "connect-src 'self'; base-uri 'none'; form-action 'none'")
