"""``serve``: a translation server (``server.py`` on uvicorn) with dynamic batching (``batcher.py``) and a
page that translates and shows the attention."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from ..config.choices import Device
from ..errors import ConfigError, ResourceError
from .app import command
from .common import open_translator
from .options import DeviceOpt, Int8Opt, ModelArg

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
# The bulk lane's decoder's niceness: beside the interactive decoder it waits anyway (it pauses before each
# step while that one works); beside other processes it keeps a share of the cores, where Linux's idle
# class, used before, kept none and its requests ran out of time.
BULK_NICE = 10


@command(inputs=("model",))
def serve(
    model: ModelArg,
    host: Annotated[str, typer.Option("--host", help="The address to listen on (0.0.0.0: every "
                                      "interface; the default answers this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="The port (0: any free one; the "
                                      "first line on stderr says which).")] = 8000,
    max_batch_tokens: Annotated[int, typer.Option("--max-batch-tokens", min=1, max=2**31, help="Decode "
                                                  "waiting requests together up to this many source "
                                                  "pieces x beam rows.")] = 4096,
    max_wait_ms: Annotated[float, typer.Option("--max-wait-ms", min=0, max=60_000, help="How long the "
                                               "oldest waiting request may wait for others to join "
                                               "its batch, or after a batch for as many "
                                               "requests as it answered (clients that wait for "
                                               "their answers send again as soon as they have "
                                               "them).")] = 40.0,
    max_sentences: Annotated[int, typer.Option("--max-sentences", min=1, max=100_000, help="Sentences "
                                               "per request (more: HTTP 413).")] = 100,
    max_chars: Annotated[int, typer.Option("--max-chars", min=1, max=1_000_000, help="Characters per "
                                           "sentence (more: HTTP 413).")] = 2000,
    max_beam: Annotated[int, typer.Option("--max-beam", min=1, max=1024, help="Beam rows per sentence "
                                          "(beam_size, nbest, a sampling request's nbest; more: HTTP "
                                          "422).")] = 8,
    max_phrases: Annotated[int, typer.Option("--max-phrases", min=0, max=1024, help="Constraint phrases "
                                             "per sentence (more: HTTP 413); their characters count "
                                             "against --max-chars together.")] = 8,
    max_request_seconds: Annotated[float, typer.Option("--max-request-seconds", min=0.01, max=3600,
                                                       help="The budget of a batch in a decoder, in "
                                                       "seconds of the decoder's own CPU time (other "
                                                       "processes loading the machine slow a batch but "
                                                       "do not count): one that runs over is cut and "
                                                       "its requests answered HTTP 503; the others go "
                                                       "on.")] = 5.0,
    max_queue_seconds: Annotated[float, typer.Option("--max-queue-seconds", min=0.01, max=86_400,
                                                     help="Refuse a request at once, HTTP 503 with "
                                                     "Retry-After, while its lane's queue holds more work "
                                                     "than the decoder is expected to serve in this many "
                                                     "seconds (from its rate as measured now).")] = 30.0,
    bulk_above: Annotated[int, typer.Option("--bulk-above", min=0, max=2**31, help="Decode requests of "
                                            "more source and prefix pieces x beam rows than this in a "
                                            "second decoder of low priority, so that they never delay "
                                            "smaller ones (0: one decoder for all).")] = 1024,
    threads: Annotated[int | None, typer.Option("--threads", min=1, max=1024, help="Intra-op threads of "
                                                "the decoding process (default: every core this process may "
                                                "use).", show_default=False)] = None,
    grace: Annotated[float, typer.Option("--grace", min=0, max=3600, help="On SIGTERM or Ctrl-C, seconds "
                                         "to finish the requests in flight (then exit 143 / 130).")] = 30.0,
    check: Annotated[bool, typer.Option("--check", help="Load the model, bind the port, print what "
                                        "would be served, and exit.")] = False,
    int8: Int8Opt = False,
    device: DeviceOpt = "auto",
) -> None:
    """Serve MODEL over HTTP: POST /translate and /attention, GET /health, /info, the page at / and the
    API's documentation at /docs. SIGTERM stops accepting, finishes what is in flight and exits 0. Every
    request is checked against the limits (stated in /info) before it is queued."""
    _check_before_loading(max_wait_ms, grace, max_request_seconds, max_queue_seconds)
    translator, cfg, path, opener = _open(model, device, int8)
    limits = _limits(translator, max_sentences, max_chars, max_beam, max_phrases, max_request_seconds,
                     bulk_above, max_queue_seconds)
    sock = _bind(host, port)
    try:
        threads = threads if threads is not None else len(os.sched_getaffinity(0))
        code = _run(sock, translator, cfg, (path, opener), (max_batch_tokens, max_wait_ms / 1000, threads),
                    limits, grace, check)
    finally:
        sock.close()
    if code:
        raise typer.Exit(code)


def _open(model: Path, device, int8: bool):
    """The model opened here (settings, pieces, limits) and how each decoder process opens it the same way
    (``open_translator`` with the same overrides): (translator, config, checkpoint path, opener)."""
    from ..decoding.translator import DecodeOverrides

    overrides = DecodeOverrides(int8=int8 or None)
    translator, cfg, path = open_translator(model, device, overrides)
    return translator, cfg, path, functools.partial(open_translator, path, Device(translator.device.type),
                                                    overrides)


def _limits(translator, max_sentences: int, max_chars: int, max_beam: int, *rest):
    """The server's ``Limits``, the model's default beam within ``--max-beam``."""
    from ..serve.limits import Limits

    if translator.decode.beam_size > max_beam:
        raise ConfigError(f"--max-beam {max_beam} is below the model's decode.beam_size "
                          f"{translator.decode.beam_size}: requests without a beam_size would be refused")
    return Limits(max_sentences, max_chars, max_beam, *rest)


def _check_before_loading(*finite: float) -> None:
    """The 'serve' extra installed, and the seconds options (``finite``) finite, before the model loads."""
    if not all(math.isfinite(x) for x in finite):
        raise ConfigError("--max-wait-ms, --grace, --max-request-seconds and --max-queue-seconds take finite "
                          "numbers")
    try:
        import uvicorn  # noqa: F401

        from ..serve.server import create_app  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"attnmt serve needs the 'serve' extra ({e.name} is missing): "
                          "pip install 'attnmt[serve]'") from None


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket (bound here, so that a busy port is one line and port 0 is known)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {host!r}: not an address of this machine ({e})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"--host {host}: not an address of this machine") from None
        raise ResourceError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    return sock


def _describe(translator, cfg, path: Path) -> dict:
    from ..decoding.quantize import parameter_count, quantized

    model = translator.model
    parameters = parameter_count(model) if model is not None else None
    return {"model": str(path), "arch": cfg.model.arch if model is not None else "ctranslate2",
            "src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang,
            "tgt_langs": cfg.data.target_languages(), "parameters": parameters,
            "attention": model is not None, "device": str(translator.device),
            "decode": translator.decode.model_dump(mode="json"),
            "quantize": "int8" if model is not None and quantized(model) else "none"}


def _run(sock, translator, cfg, model: tuple[Path, Callable], batching: tuple[int, float, int], limits,
         grace: float, check: bool) -> int:
    """Serve until a signal; the exit code: 0, or 130 / 143 when requests in flight were cut. ``model``:
    the checkpoint's path and how a decoder process opens it (``open_translator`` with this command's
    overrides); ``batching``: the budget in pieces, the wait in seconds and the decoders' intra-op threads."""
    import uvicorn

    path, opener = model
    from ..serve.api import AccessLog, Served, page_html
    from ..serve.server import create_app, json_error_h11

    info = {**_describe(translator, cfg, path), "decoder_threads": batching[2]}
    host, port = sock.getsockname()[:2]
    if check:  # the model loaded, the port bound, the page's files read: what serving needs, but a decoder
        page_html()
        sys.stderr.write(f"attnmt serve: http://{host}:{port} ({path}, {info['arch']}, "
                         f"{info['src_lang']}-{info['tgt_lang']}) [check]\n")
        return 0
    for heavy in ("model", "engine"):  # the decoders load their own; this one reads settings and pieces
        if hasattr(translator, heavy):
            setattr(translator, heavy, None)
    lanes, decoders = _lanes(translator, opener, batching, limits)
    access = AccessLog()
    served = Served(translator, path, info, access.write, limits, data=cfg.data)
    drained = True

    @contextlib.asynccontextmanager
    async def lifespan(app):
        nonlocal drained
        yield
        drained = lanes.close(grace)  # after uvicorn stopped taking requests and waited for its own
        if drained:
            for decoder in decoders:
                decoder.close()

    app = create_app(served, lanes, page_html(), lifespan)
    sys.stderr.write(f"attnmt serve: http://{host}:{port} ({path}, {info['arch']}, "
                     f"{info['src_lang']}-{info['tgt_lang']})\n")
    sys.stderr.flush()
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=grace,
                            lifespan="on", server_header=False, http=json_error_h11())
    logging.getLogger("uvicorn.error").addFilter(_OwnShutdownLine())
    server = _Server(config)
    server.run(sockets=[sock])
    access.close()
    if server.stopped_by is None or not (served.cut or not drained or server.force_exit):
        return 0
    # Requests were cut, and a batcher's thread may still wait on its decoder: stop the decoders, and
    # leave without the interpreter's shutdown.
    for decoder in decoders:
        decoder.kill()
    sys.stderr.write(f"attnmt serve: stopped by {server.stopped_by.name} with requests unanswered "
                     f"(--grace {grace:g} s ran out)\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(EXIT[server.stopped_by])


def _lanes(translator, opener: Callable, batching: tuple[int, float, int], limits) -> tuple:
    """The interactive lane and, with ``limits.bulk_above``, the bulk lane: each a decoder process and a
    batcher over it, the bulk one waiting before each step while the interactive one works, at a lower
    priority (``BULK_NICE``), its threads waiting passively; both decoders load the model at once. Each
    batcher's rate starts at what its decoder measured on ``PROBE``."""
    from ..serve.batcher import Batcher, Lane, Lanes
    from ..serve.decoder_process import PROBE, DecoderProcess

    decoders = {"interactive": DecoderProcess(opener, batching[2], budget=limits.max_seconds,
                                              busy=DecoderProcess.flag() if limits.bulk_above else None)}
    if limits.bulk_above:
        decoders["bulk"] = DecoderProcess(opener, batching[2], nice=BULK_NICE, budget=limits.max_seconds,
                                          yield_to=decoders["interactive"].busy, passive=True)
    measure = lambda lines: sum(len(ids) + 1 for ids in translator.tokenizer.encode_src(lines))  # noqa: E731
    probe = measure(PROBE) * translator.decode.beam_size
    made = {}
    for name, decoder in decoders.items():
        rate = probe / max(decoder.wait_ready(), 1e-6)
        batcher = Batcher(decoder.variant, measure, *batching[:2], max_queue_s=limits.max_queue_seconds,
                          max_job_s=limits.max_seconds, rate=rate)
        made[name] = Lane(name, batcher, decoder.draw)
    return Lanes(made["interactive"], made.get("bulk"), limits.bulk_above), list(decoders.values())


class _OwnShutdownLine(logging.Filter):
    """uvicorn's "Cancel N running task(s), timeout graceful shutdown exceeded": the command writes its
    own line for it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "timeout graceful shutdown exceeded" not in record.getMessage()


def _server_class():
    import uvicorn

    from ..serve.server import quiet_accept_errors

    class Server(uvicorn.Server):
        """uvicorn's server, but a signal that stopped it is not raised again on the way out (uvicorn
        re-raises it, which would make a clean shutdown exit 143): the command decides the exit code; and
        connections it cannot accept (too many open files) are one line every 10 s, not a traceback each."""

        stopped_by: signal.Signals | None = None

        async def serve(self, sockets=None) -> None:
            quiet_accept_errors(asyncio.get_running_loop(), _say)
            await super().serve(sockets)

        @contextlib.contextmanager
        def capture_signals(self):
            def handle(signum, frame):
                self.stopped_by = signal.Signals(signum)
                self.handle_exit(signum, frame)

            previous = {sig: signal.signal(sig, handle) for sig in EXIT}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _Server(config):  # noqa: N802 - the class is made on first use: uvicorn is an optional extra
    return _server_class()(config)
