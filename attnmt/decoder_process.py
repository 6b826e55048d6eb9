"""``attnmt serve``'s decoder in a process of its own: the model is loaded there and decodes there, so
the HTTP side keeps Python's interpreter lock to itself.

In one process, the decoding thread held the lock between torch's operations (a few hundred Python steps
per decoding step) and the event loop took requests in and answers out only between them: under 128
clients the batches the server could form fell to 6 sentences on average (``scripts/bench_serve.py``).
Across a pipe, a batch costs one pickle of its lines and one of its translations.

``DecoderProcess(opener, threads)`` starts the child (``spawn``: torch's threads do not survive a fork),
where ``opener()`` (a picklable callable: ``functools.partial(open_translator, MODEL, DEVICE)``) loads the
model as ``attnmt translate`` does, and waits for it; ``variant(settings)`` gives what
``batcher.Batcher`` calls ``translate`` on, ``draw(text, translation)`` the explorer's data for one
pair. Both block the calling thread (the batcher's) until the child answers; an exception in the child
is raised again here, as it was when it pickles and as a ``RuntimeError`` with its line when it does
not. The child ignores SIGINT and SIGTERM (the server decides when to stop) and leaves when its pipe
closes.
"""

from __future__ import annotations

import pickle
import signal
import threading
from collections.abc import Callable

from .batcher import Settings
from .children import spawn_context
from .errors import ResourceError
from .explorer import Packed

KINDS = ("cross", "enc_self", "dec_self")


class _Remote:
    """What ``Batcher`` calls ``translate`` on: one request's settings, decoded in the child."""

    def __init__(self, owner: DecoderProcess, settings: Settings) -> None:
        self.owner, self.settings = owner, settings

    def translate(self, lines, prefixes=None, words: bool = False, constraints=None):
        return self.owner.ask("translate", self.settings, list(lines), prefixes, words, constraints)


class DecoderProcess:
    def __init__(self, opener: Callable[[], tuple], threads: int | None) -> None:
        context = spawn_context()  # spawn, and the child dies with the server however it ends (children.py)
        self._conn, child = context.Pipe()
        self._lock = threading.Lock()
        self.process = context.Process(target=_child, args=(child, opener, threads),
                                       name="attnmt-decoder", daemon=True)
        self.process.start()
        child.close()
        self.ask("ready")

    def variant(self, settings: Settings) -> _Remote:
        return _Remote(self, settings)

    def draw(self, text: str, translation: str, source_prefix: str = "") -> Packed:
        """The explorer's data of (``text``, ``translation``), the source read after ``source_prefix``
        (a multilingual model's language token)."""
        return self.ask("draw", text, translation, source_prefix)

    def ask(self, *message):
        with self._lock:
            try:
                self._conn.send(message)
                status, value = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                code = self.process.exitcode
                raise ResourceError(f"the decoding process stopped (exit code {code})") from None
        if status == "error":
            raise value
        if status == "failed":
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        self._conn.close()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()


def _child(conn, opener: Callable[[], tuple], threads: int | None) -> None:
    """The decoder's loop: answer each message until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch

    from .alignment import AlignOptions
    from .attention_maps import explorer_sentences
    from .explorer import pack
    from .serve_api import variant_maker

    if threads is not None:
        torch.set_num_threads(threads)
    translator = opener()[0]
    variant = variant_maker(translator)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        kind, args = message[0], message[1:]
        try:
            if kind == "ready":
                value = None
            elif kind == "translate":
                settings, lines, prefixes, words, constraints = args
                value = variant(settings).translate(lines, prefixes, words, constraints)
            else:  # "draw": no pair when the translation is empty, so nothing to draw
                text, translation, translator.source_prefix = args
                value = pack(explorer_sentences(translator, [text], [translation], KINDS, AlignOptions()), 1)
            reply = ("ok", value)
        except Exception as e:  # noqa: BLE001 - the parent raises it again
            reply = ("error", e)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError):
            conn.send(("failed", f"{type(reply[1]).__name__}: {reply[1]}"))
        except (BrokenPipeError, OSError):
            return
