"""Lines as they arrive: a stream (stdin, a pipe) read by a thread of its own and handed over in lists of
whatever has arrived, so that a program that sends one line and waits gets its answer (``translate``'s
streaming, ``Translator.translate_stream``), and plain chunks of a list."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable, Iterator
from queue import Empty, Full, Queue

_END = object()


def arrived(lines: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of the items of ``lines`` that have arrived: a reader thread takes them from
    ``lines`` (say, stdin) into a bounded queue; each list waits for one item, then takes whatever else has
    arrived, up to ``size``, without waiting. Order is kept; an exception in ``lines`` (a decoding error)
    is raised here, after the items before it."""
    queue: Queue = Queue(maxsize=2 * size)
    stop = threading.Event()

    def read() -> None:
        if hasattr(signal, "pthread_sigmask"):  # a Ctrl-C or SIGTERM is the main thread's to take
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for line in lines:
                while not stop.is_set():
                    try:
                        queue.put(line, timeout=0.1)
                        break
                    except Full:
                        continue
                if stop.is_set():
                    return
            queue.put(_END)
        except BaseException as e:  # handed to the consumer, which raises it
            queue.put(e)

    reader = threading.Thread(target=read, name="attnmt-input", daemon=True)
    reader.start()
    try:
        done = False
        while not done:
            chunk: list = []
            item = _wait_for(queue)
            while True:
                if item is _END:
                    done = True
                    break
                if isinstance(item, BaseException):
                    if chunk:
                        yield chunk
                    raise item
                chunk.append(item)
                if len(chunk) == size:
                    break
                try:
                    item = queue.get_nowait()
                except Empty:
                    break
            if chunk:
                yield chunk
    finally:
        stop.set()


def _wait_for(queue: Queue):
    """The next item, waited for in short turns: a signal then interrupts the wait whichever thread the
    kernel gave it to (a wait without a timeout is woken only by one given to this thread)."""
    while True:
        try:
            return queue.get(timeout=0.25)
        except Empty:
            continue


def chunks(lines: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of ``size`` items (the last may be shorter)."""
    chunk: list = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
