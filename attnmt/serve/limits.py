"""What one ``attnmt serve`` request may cost, checked before it reaches a queue.

Every field that costs decoding is bounded, and the bounds are the server's, stated in ``/info``
(``Limits.describe``): sentences per request; characters per sentence, per prefix and per sentence's
phrases together; phrases per sentence; beam rows (``beam_size``, ``nbest``, a sampling request's
``nbest``); and the decode length, which is the model's own: a source is cut to ``decode.max_src_len``
pieces, an output has at most ``decode.max_len_a`` x source pieces + ``decode.max_len_b`` pieces, and a
prefix or a sentence's phrases must fit inside that (a prefix is not allowed to lengthen the decode as
``attnmt translate --prefix`` may). A request over a size is ``TooLarge`` (HTTP 413), a value out of
range or fields that do not fit together ``Refused`` (422), each naming the field as the request spells it
(``prefix[3]``, ``constraints[0]``).

What is left, the time a batch takes, is the decoder's budget (``--max-request-seconds``, seconds of the
decoder's own CPU time, so that a machine loaded by other processes slows a batch without cutting it): a
batch past it is cut there (``OverBudget``, HTTP 503), and the other requests go on. Overload is the
queue's to shed (``batcher.Overloaded``, 503 with ``Retry-After``, before any work is spent): past
``--max-queue-seconds`` of work waiting in a lane, a new request of that lane is refused at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..decoding.search import output_limit
from ..decoding.translator import Translator
from ..errors import ConstraintError


class TooLarge(Exception):
    """A request over the limits (HTTP 413)."""


class Refused(Exception):
    """A request whose fields are each valid but do not go together, or a value past a limit (HTTP 422)."""


class OverBudget(Exception):
    """A batch ran past the decoder's CPU-time budget and was cut (HTTP 503 for each of its requests)."""


@dataclass(frozen=True)
class Limits:
    """What one request may hold (see the module docstring). ``max_seconds``: the budget of a batch in
    the decoder, in seconds of the decoder's CPU time; ``bulk_above``: a request costing more pieces x beam
    rows than this is decoded in the bulk lane (``lanes.Lanes``; 0: one lane for all);
    ``max_queue_seconds``: the work a lane's queue may hold, in the seconds its decoder is expected to
    take to serve it, before new requests are refused (``batcher.Overloaded``)."""

    max_sentences: int = 100
    max_chars: int = 2000
    max_beam: int = 8
    max_phrases: int = 8
    max_seconds: float = 5.0
    bulk_above: int = 1024
    max_queue_seconds: float = 30.0

    @property
    def max_body(self) -> int:
        """The largest body the limits allow: per sentence its text, prefix and phrases (each up to
        ``max_chars``), JSON-escaped ("\\uXXXX" per UTF-16 unit, two a character), with their quotes and
        commas, and some room for the options."""
        per_sentence = 3 * self.max_chars * 12 + (self.max_phrases + 3) * 4
        return self.max_sentences * per_sentence + 4096

    def describe(self, translator: Translator) -> dict:
        """The limits as ``/info`` states them, the model's length limits included."""
        d = translator.decode
        return {"max_sentences": self.max_sentences, "max_chars": self.max_chars, "max_beam": self.max_beam,
                "max_phrases": self.max_phrases, "max_request_seconds": self.max_seconds,
                "max_body_bytes": self.max_body, "bulk_above": self.bulk_above,
                "max_queue_seconds": self.max_queue_seconds,
                "max_src_pieces": d.max_src_len, "max_len_a": d.max_len_a, "max_len_b": d.max_len_b}


def check_sizes(limits: Limits, lines: Sequence[str], prefixes: Sequence[str] | None,
                constraints: Sequence[Sequence[str]] | None) -> None:
    """The counts and characters of a request's text fields (no model needed)."""
    if not lines:
        raise Refused("text: expected at least one sentence")
    if len(lines) > limits.max_sentences:
        raise TooLarge(f"text: {len(lines)} sentences, at most {limits.max_sentences} per request")
    _check_chars(limits, "text", lines)
    if prefixes is not None:
        _check_chars(limits, "prefix", prefixes)
    for k, phrases in enumerate(constraints or ()):
        if len(phrases) > limits.max_phrases:
            raise TooLarge(f"constraints[{k}]: {len(phrases)} phrases, at most {limits.max_phrases} per "
                           "sentence")
        chars = sum(len(phrase) for phrase in phrases)
        if chars > limits.max_chars:
            raise TooLarge(f"constraints[{k}]: {chars} characters in all, at most {limits.max_chars} per "
                           "sentence")


def _check_chars(limits: Limits, field_name: str, texts: Sequence[str]) -> None:
    for k, text in enumerate(texts):
        if len(text) > limits.max_chars:
            raise TooLarge(f"{field_name}[{k}]: {len(text)} characters, at most {limits.max_chars} per "
                           "sentence")


def check_rows(limits: Limits, rows: int, beam_given: bool, sampling: bool) -> None:
    """A request's beam rows per sentence: its beam (or, sampling, its samples) within ``max_beam``."""
    if rows <= limits.max_beam:
        return
    named = "nbest" if sampling or not beam_given else "beam_size"
    raise Refused(f"{named}: {rows} beam rows per sentence, at most {limits.max_beam} on this server "
                  "(--max-beam)")


def check_pieces(translator: Translator, lines: Sequence[str], prefixes: Sequence[str] | None,
                 constraints: Sequence[Sequence[str]] | None, exported: bool) -> int:
    """Each prefix and each sentence's phrases within the sentence's output length limit, and the phrases
    in the target vocabulary (``translator`` with the request's settings and source prefix); the
    request's cost: its source and prefix pieces (EOS included) x beam rows, which picks its lane."""
    sources = translator.encode(lines)
    d = translator.decode
    prefix_pieces = translator.encode_prefixes(sources, prefixes) if prefixes is not None else []
    for i, ids, pieces in zip(sources.lines, sources.ids, prefix_pieces):
        limit = output_limit(len(ids), d.max_len_a, d.max_len_b)
        if len(pieces) > limit:
            raise Refused(f"prefix[{i}]: {len(pieces)} target pieces, more than the sentence's length limit "
                          f"of {limit} (the model's decode.max_len_a {d.max_len_a} x {len(ids)} source "
                          f"pieces + decode.max_len_b {d.max_len_b})")
    if constraints is not None and any(constraints):
        if exported:
            raise Refused("constraints: a CTranslate2 export has no lexical constraints")
        try:
            translator.encode_constraints(sources, constraints)
        except ConstraintError as e:
            raise Refused(f"constraints[{e.line - 1}]: {e.reason}") from None
    rows = d.nbest if translator.sampling is not None else d.beam_size
    pieces = sum(len(ids) + 1 for ids in sources.ids) + sum(len(p) for p in prefix_pieces)
    return pieces * rows
