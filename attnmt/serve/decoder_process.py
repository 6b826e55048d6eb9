"""``attnmt serve``'s decoder in a process of its own: the model is loaded there and decodes there, so
the HTTP side keeps Python's interpreter lock to itself.

In one process, the decoding thread held the lock between torch's operations (a few hundred Python steps
per decoding step) and the event loop took requests in and answers out only between them: under 128
clients the batches the server could form fell to 6 sentences on average (``scripts/bench/bench_serve.py``).
Across a pipe, a batch costs one pickle of its lines and one of its translations.

``DecoderProcess(opener, threads, nice, budget)`` starts the child (``spawn``: torch's threads do not
survive a fork), where ``opener()`` (a picklable callable: ``functools.partial(open_translator, MODEL,
DEVICE)``) loads the model as ``attnmt translate`` does (``wait_ready`` waits for it);
``variant(settings)`` gives what ``batcher.Batcher`` calls ``translate`` on (with ``settings.markup`` the
lines hold inline tags: the child translates their text and carries the tags to every output,
``translate_marked``), ``draw(text, translation)`` the explorer's data for one pair. Both block the
calling thread (the batcher's) until the child answers; an exception in the child is raised again here,
as it was when it pickles and as a ``RuntimeError`` with its line when it does not. The child ignores
SIGINT and SIGTERM (the server decides when to stop) and leaves when its pipe closes, or at once when the
server dies (``children.spawn_context``).

``nice``: how much lower the child's priority is once its model is loaded. ``yield_to``: a flag shared
with the other lane (a ``multiprocessing`` value): while it is set, the child waits before its next model
step, so that the bulk lane's decoder gives the cores to the interactive one whenever that one has work
(``batcher.Lanes``), and competes with the rest of the machine as any process does. (Linux's idle
scheduling class did the first, but yielded to every process on the machine: one busy process beside the
server starved the bulk decoder, its start-up took 88 s instead of 5, and its requests ran out of time.)

``budget``: seconds of the decoding thread's own CPU time a batch may take in the child (the same as
wall-clock seconds when the decoder has the cores to itself; on a machine that other processes load, a
batch takes longer but is charged only for its own work). The model is wrapped (``Budgeted``) so that the
search, the word scores or the attention maps stop at the first step past it with
``serve_limits.OverBudget``, and the child goes on with the next batch. A CTranslate2 export decodes in
one call that cannot be cut: its batches are bounded by the limits alone.

Each decoder adapts its intra-op threads to the machine (``ThreadShare``): while its decoding thread gets
the CPU time of the wall clock it spends, it decodes with all its threads; when other processes take the
cores (its thread had under 60% of the wall clock), it falls back to one thread, and tries all again
once one thread gets the CPU it asks for and a hold has passed. Two threads that wait for each other at
every operation, one of them given to another process by the kernel, made a 0.2 s batch take 1 to 15 s
beside busy processes on 2 cores (OpenMP's threads spin while they wait; passive waits kept them fast
there, but made a one-line request 2.5x slower on a quiet machine). The bulk decoder's threads wait
passively all the same (``passive``): spinning while it paused, or between the operations of a step the
interactive decoder's work had interrupted, they took the interactive decoder's cores (its p99 beside
the costliest requests went from 1x to 2.7-3.7x its value alone).
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable

from ..children import spawn_context
from ..errors import ResourceError
from ..insight.explorer import Packed
from .batcher import Settings
from .limits import OverBudget

KINDS = ("cross", "enc_self", "dec_self")
# What the child decodes, timed, once its model is loaded: the first rate of its lane's queue estimate.
PROBE = ["1 2 3 4 5 6 7 8 9 10 11 12"] * 8


class _Remote:
    """What ``Batcher`` calls ``translate`` on: one request's settings, decoded in the child."""

    def __init__(self, owner: DecoderProcess, settings: Settings) -> None:
        self.owner, self.settings = owner, settings

    def translate(self, lines, prefixes=None, words: bool = False, constraints=None):
        return self.owner.ask("translate", self.settings, list(lines), prefixes, words, constraints)


class DecoderProcess:
    def __init__(self, opener: Callable[[], tuple], threads: int | None, nice: int = 0,
                 budget: float | None = None, busy=None, yield_to=None, passive: bool = False) -> None:
        """Start the child (``wait_ready`` waits for its model). ``busy``: a shared flag (``flag()``) this
        side raises while the child works; ``yield_to``: one the child waits on before each model step;
        ``passive``: its OpenMP threads sleep while they wait (``OMP_WAIT_POLICY=PASSIVE``, unless the
        environment sets a policy)."""
        context = spawn_context()  # spawn, and the child dies with the server however it ends (children.py)
        self._conn, child = context.Pipe()
        self._lock = threading.Lock()
        self.busy = busy
        self.process = context.Process(target=_child, args=(child, opener, threads, nice, budget, yield_to),
                                       name="attnmt-decoder", daemon=True)
        given = os.environ.get("OMP_WAIT_POLICY")
        if passive and given is None:
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # read by the child's OpenMP as it loads
        try:
            self.process.start()
        finally:
            if passive and given is None:
                del os.environ["OMP_WAIT_POLICY"]
        child.close()

    @staticmethod
    def flag():
        """A flag one decoder's side raises while it works and another decoder waits on."""
        return spawn_context().Value("b", 0, lock=False)

    def wait_ready(self) -> float:
        """Return once the child has loaded its model (its error if it could not): the seconds it took to
        decode ``PROBE`` then."""
        return self.ask("ready")

    def variant(self, settings: Settings) -> _Remote:
        return _Remote(self, settings)

    def draw(self, text: str, translation: str, source_prefix: str = "") -> Packed:
        """The explorer's data of (``text``, ``translation``), the source read after ``source_prefix``
        (a multilingual model's language token)."""
        return self.ask("draw", text, translation, source_prefix)

    def ask(self, *message):
        with self._lock:
            if self.busy is not None:
                self.busy.value = 1
            try:
                self._conn.send(message)
                status, value = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                code = self.process.exitcode
                raise ResourceError(f"the decoding process stopped (exit code {code})") from None
            finally:
                if self.busy is not None:
                    self.busy.value = 0
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

    def kill(self) -> None:
        """Stop the child now, whatever it is doing (the server leaves with requests unanswered)."""
        self.process.kill()
        self.process.join(5)


class Budgeted:
    """The model behind the protocol ``decode`` uses (``models.TranslationModel``), stopping at the first
    call past ``deadline`` (``time.thread_time``, the decoding thread's CPU time; None: none) with
    ``OverBudget``: a search steps the model once a position, so a batch overruns its budget by one step
    at most. While ``yield_to`` (a shared flag) is raised, each call waits first, its CPU time unspent.
    Everything else is the model's."""

    def __init__(self, model, budget: float | None, yield_to=None) -> None:
        self.model, self.budget, self.yield_to = model, budget, yield_to
        self.deadline: float | None = None
        self.paused = 0.0  # seconds waited for the flag since ``start``

    def start(self, timed: bool = True) -> None:
        """The budget starts now (a batch begins); ``timed`` False: no budget for this one."""
        timed = timed and self.budget is not None
        self.deadline = time.thread_time() + self.budget if timed else None
        self.paused = 0.0

    def _check(self) -> None:
        if self.yield_to is not None and self.yield_to.value:
            started = time.perf_counter()
            while self.yield_to.value:
                time.sleep(0.001)
            self.paused += time.perf_counter() - started
        if self.deadline is not None and time.thread_time() > self.deadline:
            raise OverBudget(f"the batch ran over the server's time budget of {self.budget:g} s "
                             "(--max-request-seconds) and was cut: send fewer or shorter sentences, or "
                             "a smaller beam")

    def __call__(self, *args, **kwargs):
        self._check()
        return self.model(*args, **kwargs)

    def encode(self, *args, **kwargs):
        self._check()
        return self.model.encode(*args, **kwargs)

    def step(self, *args, **kwargs):
        self._check()
        return self.model.step(*args, **kwargs)

    def select(self, *args, **kwargs):
        return self.model.select(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.model, name)


class ThreadShare:
    """How many intra-op threads a decoder uses (see the module docstring): ``after(cpu, wall)`` of each
    piece of work, its decoding thread's CPU seconds against the wall-clock seconds it was not waiting on
    purpose, moves between ``full`` and one thread through ``set_threads``. ``hold``: seconds before one
    thread that gets its CPU tries all again; doubled each time all fall back within it, at most 64 s."""

    LOW, HIGH, SHORTEST = 0.6, 0.9, 0.02  # fall back under LOW, try all again over HIGH; shorter: no signal

    def __init__(self, full: int, set_threads: Callable[[int], None], clock=time.monotonic) -> None:
        self.full, self.now, self.set_threads, self.clock = full, full, set_threads, clock
        self.hold, self.since, self.raised = 1.0, 0.0, 0.0

    def after(self, cpu: float, wall: float) -> None:
        if self.full == 1 or wall < self.SHORTEST:
            return
        share, now = cpu / wall, self.clock()
        if self.now > 1 and share < self.LOW:
            self.hold = min(64.0, self.hold * 2) if now - self.raised < self.hold else 1.0
            self._use(1, now)
        elif self.now == 1 and share > self.HIGH and now - self.since >= self.hold:
            self._use(self.full, now)
            self.raised = now

    def _use(self, threads: int, now: float) -> None:
        self.now, self.since = threads, now
        self.set_threads(threads)


def _child(conn, opener: Callable[[], tuple], threads: int | None, nice: int, budget: float | None,
           yield_to) -> None:
    """The decoder's loop: answer each message until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    # at the server's priority: a busy machine slows both start-ups alike
    translator, cfg, checkpoint = opener()
    if nice:
        _lower_priority(nice)
    budgeted = None
    if (budget is not None or yield_to is not None) and getattr(translator, "model", None) is not None:
        translator.model = budgeted = Budgeted(translator.model, budget, yield_to)
    answer = _answerer(translator, cfg, checkpoint)
    share = ThreadShare(torch.get_num_threads(), torch.set_num_threads)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if budgeted is not None:
            budgeted.start(message[0] != "ready")
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            reply = ("ok", answer(message[0], message[1:]))
        except Exception as e:  # noqa: BLE001 - the parent raises it again
            reply = ("error", e)
        if message[0] != "ready":
            waited = budgeted.paused if budgeted is not None else 0.0
            share.after(time.thread_time() - cpu, time.perf_counter() - wall - waited)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError):
            conn.send(("failed", f"{type(reply[1]).__name__}: {reply[1]}"))
        except (BrokenPipeError, OSError):
            return


def _lower_priority(nice: int) -> None:
    """``nice`` more for every thread of this process (torch's threads have started: each has its own
    priority on Linux), or for this thread where there are no others to find."""
    try:
        tasks = [int(task) for task in os.listdir("/proc/self/task")]
    except OSError:
        tasks = [0]
    for task in tasks:
        try:
            os.setpriority(os.PRIO_PROCESS, task, os.getpriority(os.PRIO_PROCESS, task) + nice)
        except OSError:  # a thread that ended, or a system that does not allow it: that thread keeps its own
            pass


def _answerer(translator, cfg=None, checkpoint=None) -> Callable[[str, tuple], object]:
    """What the child answers to each kind of message; ``cfg`` and ``checkpoint`` (``open_translator``'s)
    say how the model is read for word links (``reading.default_align_options``, as ``attnmt align``)."""
    from ..insight.explorer import pack
    from ..insight.exploring import explorer_sentences
    from ..insight.links import AlignOptions
    from ..insight.reading import default_align_options
    from .api import variant_maker

    variant = variant_maker(translator)

    @functools.cache  # read once, on the first request with markup (an export has none)
    def reading() -> AlignOptions:
        return default_align_options(cfg, checkpoint)

    def answer(kind: str, args: tuple) -> object:
        if kind == "ready":  # one sentence first: torch's first calls are slow, and a budget would count them
            translator.translate(["1"])
            started = time.perf_counter()
            translator.translate(PROBE)
            return time.perf_counter() - started
        if kind == "translate":
            settings, lines, prefixes, words, constraints = args
            if settings.markup:
                return translate_marked(variant(settings), lines, prefixes, words, constraints, reading())
            return variant(settings).translate(lines, prefixes, words, constraints)
        # "draw": no pair when the translation is empty, so nothing to draw
        text, translation, translator.source_prefix = args
        return pack(explorer_sentences(translator, [text], [translation], KINDS, AlignOptions()), 1)

    return answer


def translate_marked(translator, lines, prefixes, words: bool, constraints, options) -> list:
    """``Translator.translate`` of lines that hold inline tags (checked well-formed by the server): each
    line's text without its tags is translated, and every output gets the tags back
    (``insight.reading.carry_markup`` with the word links read as ``options`` say: one teacher-forced
    reading of all the outputs together, inside the batch's budget). Scores, word scores and
    ``truncated`` are those of the outputs' words."""
    import dataclasses

    from ..data.markup import parse_markup
    from ..insight.reading import carry_markup

    marked = [parse_markup(line) for line in lines]
    found = translator.translate([m.text for m in marked], prefixes, words, constraints)
    sources = [m for m, translation in zip(marked, found) for _ in translation.outputs]
    outputs = [text for translation in found for text, _ in translation.outputs]
    tagged = iter(carry_markup(translator, sources, outputs, options))
    return [dataclasses.replace(translation, outputs=[(next(tagged), score)
                                                      for _, score in translation.outputs])
            for translation in found]
