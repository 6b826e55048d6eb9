"""Text in, text out: ``Translator`` cleans, encodes, batches and searches, with the settings of a
``decode`` config section.

Letters: K beam size.

Every command that decodes (``translate``, ``eval``, ``plot``, ``align``) and validation during training
goes through one ``Translator``: one path from a line of text to source pieces (``encode``: clean,
encode, cut to ``max_src_len``), one token budget for batches (``batching.token_batches``: padded
source pieces x K rows), one choice between greedy and beam search.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ..config.schema import DecodeConfig
from ..data.arrival import arrived
from ..data.batching import collate, token_batches
from ..data.readers import clean
from ..data.tokenizer import PAD_ID, UNK_ID, Tokenizer
from ..data.words import WordScores, word_scores
from ..errors import ConfigError, ConstraintError
from ..models.protocol import TranslationModel
from .constrained import Constraints, constrained_search
from .search import (
    Hypothesis,
    Sampling,
    beam_search,
    check_search_settings,
    gnmt_penalty,
    greedy_search,
    output_limit,
)
from .shortlist import Shortlist


@dataclass
class Translation:
    """The n-best outputs of one input line: (detokenised text, score), best first. The score is the one
    the beam ranks by: the sum of log-probabilities over ``gnmt_penalty`` (so it falls down the list)."""

    outputs: list[tuple[str, float]]
    truncated: bool = False  # the source was longer than max_src_len pieces and was cut
    words: list[WordScores] | None = None  # with ``translate(words=True)``: each output's word scores

    def as_json(self, digits: int | None = None) -> dict:
        """The server's answer for one sentence and ``translate --scores words``'s line: the outputs with
        their scores (None where there is none, as a CTranslate2 export's single output; ``digits``: rounded)
        and word scores, if any, and whether the source was cut."""
        found = []
        for k, (text, score) in enumerate(self.outputs):
            value = (round(score, digits) if digits is not None else score) if math.isfinite(score) else None
            found.append({"text": text, "score": value, **(self.words[k].as_json() if self.words else {})})
        return {"outputs": found, "truncated": self.truncated}


@dataclass
class Sources:
    """Input lines as the model reads them: the piece ids of each non-empty line (after ``data.clean``),
    cut to ``decode.max_src_len`` pieces."""

    ids: list[list[int]]
    lines: list[int]  # the input line of each entry of ``ids``
    truncated: set[int] = field(default_factory=set)  # input lines that were cut
    count: int = 0  # input lines, empty ones included


@dataclass(frozen=True)
class DecodeOverrides:
    """What a command line (or a server request) changes in a model's ``decode`` section, as one value:
    None keeps the model's setting. Built once where the options are read and applied by
    ``Translator.with_overrides``, which a CTranslate2 export's translator shares.

    With ``sampling``, each source gets ``nbest`` samples (the rows are ``nbest``, whatever the beam).
    Otherwise the beam is at least ``nbest`` wide unless ``beam_size`` says otherwise, and never wider
    than the target vocabulary. Errors are ConfigErrors that name the option as the caller spells it:
    ``spelling`` "cli" (``--beam-size``) or "api" (``beam_size``)."""

    beam_size: int | None = None
    nbest: int = 1
    length_penalty: float | None = None
    max_tokens: int | None = None
    sampling: Sampling | None = None
    spelling: str = "cli"
    tgt_lang: str | None = None  # a multilingual model's target language (``DataConfig.prefix_for``)
    # int8 linear layers (``quantize.py``): True / False whatever ``decode.quantize`` says, None as it says
    int8: bool | None = None

    def named(self, field_name: str) -> str:
        return "--" + field_name.replace("_", "-") if self.spelling == "cli" else field_name

    def apply(self, decode: DecodeConfig, tgt_vocab_size: int) -> DecodeConfig:
        """A copy of ``decode`` with these overrides, checked as the search will check it."""
        nbest = self.nbest
        if self.sampling is not None:
            beam, named = nbest, self.named("nbest")
        else:
            beam = self.beam_size if self.beam_size is not None else max(decode.beam_size, nbest)
            named = (self.named("beam_size") if self.beam_size is not None
                     else self.named("nbest") if nbest > decode.beam_size else "decode.beam_size")
        if nbest > beam:
            raise ConfigError(f"{self.named('nbest')} {nbest} must not exceed the beam size {beam}")
        if beam > tgt_vocab_size:
            raise ConfigError(f"{named} {beam} exceeds the target vocabulary ({tgt_vocab_size} pieces)")
        update = {"beam_size": beam, "nbest": nbest}
        if self.length_penalty is not None:
            update["length_penalty"] = self.length_penalty
        if self.max_tokens is not None:
            update["max_tokens"] = self.max_tokens
        decode = decode.model_copy(update=update)
        try:  # a bad value the command line let through is the user's, not a bug
            check_search_settings(decode.beam_size, decode.nbest, decode.length_penalty, decode.min_len)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return decode


@dataclass(frozen=True)
class Scored:
    """A given translation's score: the sum of its pieces' log-probabilities (EOS included), how many
    pieces that is (EOS included), and the sum over the GNMT length penalty, beam search's ranking key."""

    logprob: float
    tokens: int
    normalized: float

    @property
    def per_token(self) -> float:
        return self.logprob / self.tokens if self.tokens else 0.0

    @classmethod
    def of(cls, logprobs: Sequence[float], length_penalty: float) -> Scored:
        """From the log-probability of each piece, EOS's included (``Translator.piece_logprobs``)."""
        total, n = float(sum(logprobs)), len(logprobs)
        return cls(total, n, total / gnmt_penalty(n, length_penalty))


class Translator:
    """A model, its tokenizer and its decode settings: ``translate`` lines, ``search`` encoded sources.

    ``decode.beam_size`` 1 (and ``nbest`` 1) means greedy search. Batches hold at most
    ``decode.max_tokens`` padded source pieces x beam rows, so memory stays bounded whatever the input.
    An empty line translates to an empty line. With ``sampling``, each source gets ``decode.nbest``
    samples (in the order drawn) instead of a search; the draws follow ``sampling.seed``.
    """

    source_prefix = ""  # control tokens before every source: a multilingual model's <2xx> (``--tgt-lang``)
    shortlist: Shortlist | None = None  # searches without a prefix or constraints output these pieces only

    def __init__(self, model: TranslationModel, tokenizer: Tokenizer, decode: DecodeConfig,
                 device: torch.device | str = "cpu", sampling: Sampling | None = None) -> None:
        check_search_settings(max(decode.beam_size, decode.nbest) if sampling else decode.beam_size,
                              decode.nbest, decode.length_penalty, decode.min_len)
        self.model, self.tokenizer, self.decode, self.device = model, tokenizer, decode, torch.device(device)
        self.sampling = sampling
        self.generator = (torch.Generator(device=self.device).manual_seed(sampling.seed)
                          if sampling is not None else None)

    def with_settings(self, decode: DecodeConfig, sampling: Sampling | None = None) -> Translator:
        """The same model, tokenizer and device with other decode settings (checked as ``__init__`` checks
        them); its draws start again from ``sampling.seed``."""
        check_search_settings(max(decode.beam_size, decode.nbest) if sampling else decode.beam_size,
                              decode.nbest, decode.length_penalty, decode.min_len)
        other = copy.copy(self)
        other.decode, other.sampling = decode, sampling
        other.generator = (torch.Generator(device=self.device).manual_seed(sampling.seed)
                           if sampling is not None else None)
        return other

    def with_overrides(self, overrides: DecodeOverrides) -> Translator:
        """The same model with ``overrides`` over its ``decode`` settings (``DecodeOverrides.apply``) and
        their sampling, if any."""
        return self.with_settings(overrides.apply(self.decode, self.tokenizer.tgt_vocab_size),
                                  overrides.sampling)

    def encode(self, lines: Sequence[str]) -> Sources:
        """Clean, encode and cut each line (after ``source_prefix``, as the training sources were); empty
        lines (after cleaning) are left out and counted."""
        texts = [clean(line) for line in lines]
        todo = [i for i, text in enumerate(texts) if text]
        encoded = self.tokenizer.encode_src([self._prefixed(texts[i]) for i in todo])
        limit = self.decode.max_src_len
        truncated = {i for i, ids in zip(todo, encoded) if len(ids) > limit}
        return Sources([ids[:limit] for ids in encoded], todo, truncated, len(texts))

    def _prefixed(self, text: str) -> str:
        return f"{self.source_prefix} {text}" if self.source_prefix and text else text

    def search(self, src_ids: Sequence[Sequence[int]], need_attention: bool = False,
               prefixes: Sequence[Sequence[int]] | None = None,
               constraints: Sequence[Sequence[Sequence[int]]] | None = None) -> list[list[Hypothesis]]:
        """Hypotheses for already encoded sources (in their order), batched by length; ``prefixes``: the
        target pieces each source's outputs start with (``decode.force_prefix``), one list per source;
        ``constraints``: the phrases (target pieces) each source's outputs must hold, a list per source
        (``constrained.constrained_search``, whatever the beam size; not with sampling)."""
        d = self.decode
        if constraints is not None and self.sampling is not None and any(constraints):
            raise ConfigError("lexical constraints need a search: they do not go with sampling")
        order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
        lengths = [len(ids) + 1 for ids in src_ids]  # + EOS
        results: list[list[Hypothesis]] = [[] for _ in src_ids]
        if self.sampling is not None:
            n = d.nbest
            for chunk in token_batches(lengths, order, d.max_tokens, rows_per_example=n):
                rows = [i for i in chunk for _ in range(n)]
                batch = collate([src_ids[i] for i in rows]).to(self.device)
                found = greedy_search(self.model, batch.src, batch.src_mask, d.max_len_a, d.max_len_b,
                                      d.min_len, need_attention, self.sampling, self.generator,
                                      self._prefix(prefixes, rows))
                for k, i in enumerate(chunk):
                    results[i] = found[k * n:(k + 1) * n]
            return results
        for chunk in token_batches(lengths, order, d.max_tokens, rows_per_example=d.beam_size):
            # Sentences with phrases apart from those without: a free sentence is searched as it would be
            # in any batch (greedy stays greedy), whatever shares its chunk.
            parts = ([[i for i in chunk if constraints[i]], [i for i in chunk if not constraints[i]]]
                     if constraints is not None else [chunk])
            for part in filter(None, parts):
                found = self._search_part(src_ids, part, prefixes, constraints, need_attention)
                for i, hyps in zip(part, found):
                    results[i] = hyps
        return results

    def _search_part(self, src_ids: Sequence[Sequence[int]], part: list[int],
                     prefixes: Sequence[Sequence[int]] | None,
                     constraints: Sequence[Sequence[Sequence[int]]] | None,
                     need_attention: bool) -> list[list[Hypothesis]]:
        """The search of ``search`` for the sources ``part`` (all with phrases, or none): constrained,
        greedy or beam."""
        d = self.decode
        batch = collate([src_ids[i] for i in part]).to(self.device)
        prefix = self._prefix(prefixes, part)
        if constraints is not None and constraints[part[0]]:
            return constrained_search(self.model, batch.src, batch.src_mask,
                                      [Constraints(constraints[i]) for i in part], d.beam_size, d.nbest,
                                      d.length_penalty, d.max_len_a, d.max_len_b, d.min_len, need_attention,
                                      prefix)
        if self.shortlist is not None and prefix is None:
            with self.shortlist.restricted(self.model, [src_ids[i] for i in part]) as restricted:
                return restricted.back(self._plain_search(restricted, batch, need_attention, None))
        return self._plain_search(self.model, batch, need_attention, prefix)

    def _plain_search(self, model, batch, need_attention: bool, prefix: torch.Tensor | None):
        """Greedy or beam search of ``batch`` with ``model`` (this translator's, or cut to a shortlist)."""
        d = self.decode
        if d.beam_size == 1 and d.nbest == 1:
            return [[h] for h in greedy_search(model, batch.src, batch.src_mask, d.max_len_a,
                                               d.max_len_b, d.min_len, need_attention, prefix=prefix)]
        return beam_search(model, batch.src, batch.src_mask, d.beam_size, d.nbest, d.length_penalty,
                           d.max_len_a, d.max_len_b, d.min_len, need_attention, prefix)

    def _prefix(self, prefixes: Sequence[Sequence[int]] | None, rows: Sequence[int]) -> torch.Tensor | None:
        """(len(rows), P) the prefixes of these sources, PAD after the shorter ones; None without any."""
        if prefixes is None or not any(prefixes[i] for i in rows):
            return None
        width = max(len(prefixes[i]) for i in rows)
        out = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
        for k, i in enumerate(rows):
            out[k, :len(prefixes[i])] = torch.tensor(prefixes[i], dtype=torch.long)
        return out.to(self.device)

    def encode_prefixes(self, sources: Sources, prefixes: Sequence[str]) -> list[list[int]]:
        """The target pieces of each non-empty source's prefix (cleaned as targets are), in ``sources``'
        order; an empty prefix is no prefix."""
        if len(prefixes) != sources.count:
            raise ValueError(f"{len(prefixes)} prefixes for {sources.count} lines")
        texts = [clean(prefixes[i]) for i in sources.lines]
        encoded = self.tokenizer.encode_tgt([t for t in texts if t]) if any(texts) else []
        pieces = iter(encoded)
        return [next(pieces) if text else [] for text in texts]

    def encode_constraints(self, sources: Sources,
                           constraints: Sequence[Sequence[str]]) -> list[list[list[int]]]:
        """The target pieces of each phrase of each non-empty source's constraints (cleaned as targets are;
        an empty phrase is none), in ``sources``' order. ConstraintError, naming the input line, for a phrase
        with a piece the target vocabulary lacks, or phrases that take more pieces than the line's length
        limit (``decode.max_output_lengths``) allows."""
        if len(constraints) != sources.count:
            raise ValueError(f"{len(constraints)} constraint lists for {sources.count} lines")
        d, out = self.decode, []
        for i, ids in zip(sources.lines, sources.ids):
            texts = [t for t in (clean(p) for p in constraints[i]) if t]
            phrases = self.tokenizer.encode_tgt(texts) if texts else []
            for text, pieces in zip(texts, phrases):
                if UNK_ID in pieces:
                    raise ConstraintError(i + 1, f"the phrase {text!r} has a piece the model's target "
                                          "vocabulary lacks (it would come out as an unknown piece)")
            limit = output_limit(len(ids), d.max_len_a, d.max_len_b)
            need = sum(len(p) for p in phrases)
            if need > limit:
                raise ConstraintError(i + 1, f"the phrases take {need} target pieces, more than the line's "
                                      f"length limit of {limit} (decode.max_len_a {d.max_len_a} x {len(ids)} "
                                      f"source pieces + decode.max_len_b {d.max_len_b})")
            out.append(phrases)
        return out

    def translate(self, lines: Sequence[str], prefixes: Sequence[str] | None = None,
                  words: bool = False,
                  constraints: Sequence[Sequence[str]] | None = None) -> list[Translation]:
        """One ``Translation`` per line; ``prefixes`` (one per line, may be empty): the text each line's
        translations start with, the search going on from there (an empty source still gives "");
        ``words``: each output's words with their probabilities too (``words.word_scores``);
        ``constraints`` (a list of phrases per line, may be empty): text each translation must hold
        (``encode_constraints``, ``constrained.py``)."""
        sources = self.encode(lines)
        out = [Translation([("", 0.0)]) for _ in range(sources.count)]
        found = self.search(sources.ids, prefixes=(self.encode_prefixes(sources, prefixes)
                                                   if prefixes is not None else None),
                            constraints=(self.encode_constraints(sources, constraints)
                                         if constraints is not None else None))
        # One call detokenises everything: sentencepiece's batch decoding costs per call, not per piece.
        decoded = iter(self.tokenizer.decode_tgt([h.tokens for hyps in found for h in hyps]))
        for i, hyps in zip(sources.lines, found):
            scores = [h.score / gnmt_penalty(len(h.tokens) + 1, self.decode.length_penalty) for h in hyps]
            out[i] = Translation([(next(decoded), score) for score in scores], i in sources.truncated)
        if words:
            pairs = [(ids, h.tokens) for ids, hyps in zip(sources.ids, found) for h in hyps]
            logprobs = iter(self.piece_logprobs([s for s, _ in pairs], [t for _, t in pairs]))
            for i, hyps in zip(sources.lines, found):
                out[i].words = [word_scores(self.tokenizer.tgt_pieces(h.tokens), next(logprobs))
                                for h in hyps]
            for translation in out:  # an empty line: no words, and it surely ends
                translation.words = translation.words or [WordScores([], 1.0)]
        return out

    def translate_stream(self, lines: Iterable[str], chunk_lines: int = 1000,
                         prefixes: Sequence[str] | None = None, words: bool = False,
                         constraints: Sequence[Sequence[str]] | None = None) -> Iterator[list[Translation]]:
        """``translate`` over a stream: each chunk is the lines that have arrived (at least one, at most
        ``chunk_lines``; ``arrived``), and its translations come out, in order, as soon as it is done. A
        user or a pipe that sends one line and waits gets its answer; a file still goes in full chunks,
        and needs memory for about two of them. ``prefixes`` and ``constraints`` (one per line, in order)
        and ``words``: as ``translate``'s; a ConstraintError names its line in
        ``lines``."""
        done = 0
        for chunk in arrived(lines, chunk_lines):
            part = slice(done, done + len(chunk))
            try:
                yield self.translate(chunk, prefixes[part] if prefixes is not None else None, words,
                                     constraints[part] if constraints is not None else None)
            except ConstraintError as e:
                raise ConstraintError(e.line + done, e.reason) from None
            done += len(chunk)

    def best(self, lines: Sequence[str]) -> list[str]:
        """The best translation of each line."""
        return [t.outputs[0][0] for t in self.translate(lines)]

    def score(self, sources: Sequence[str], targets: Sequence[str]) -> list[Scored]:
        """The model's log-probability of each given target under teacher forcing, EOS included, in the
        model's own distribution (what beam search sums for its hypotheses); sources are cleaned, encoded
        and cut to ``decode.max_src_len`` as ``translate`` does, targets cleaned and encoded whole."""
        src_ids, tgt_ids = self.encode_pairs(sources, targets)
        return [Scored.of(logprobs, self.decode.length_penalty)
                for logprobs in self.piece_logprobs(src_ids, tgt_ids)]

    def encode_pairs(self, sources: Sequence[str], targets: Sequence[str]) -> tuple[list, list]:
        """Piece ids of given pairs: sources as ``translate`` reads them, targets cleaned, encoded whole."""
        src_ids = [ids[: self.decode.max_src_len] for ids in
                   self.tokenizer.encode_src([self._prefixed(clean(s)) for s in sources])] if sources else []
        tgt_ids = self.tokenizer.encode_tgt([clean(t) for t in targets]) if targets else []
        return src_ids, tgt_ids

    @torch.no_grad()
    def piece_logprobs(self, src_ids: Sequence[Sequence[int]],
                       tgt_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """Each target piece's log-probability under teacher forcing, then EOS's (len(target) + 1 each)."""
        order = sorted(range(len(src_ids)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i])))
        lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids)]
        out: list[list[float]] = [[] for _ in src_ids]
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk in token_batches(lengths, order, self.decode.max_tokens):
                batch = collate([src_ids[i] for i in chunk], [tgt_ids[i] for i in chunk]).to(self.device)
                logits = self.model(batch).logits  # (B, T, V), in at least fp32 as the search's
                logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
                logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.tgt_out[..., None])[..., 0]
                for i, row, n in zip(chunk, logp.tolist(), batch.tgt_lengths.tolist()):
                    out[i] = row[:n]
        finally:
            self.model.train(was_training)
        return out
