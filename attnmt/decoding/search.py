"""Search over the models' shared protocol (``models/protocol.py``): encode once, then step.

Letters: B batch, S source length, V vocabulary, K beam size, N rows being decoded (B for greedy,
live sentences * K for beam search).

Lengths: a hypothesis has at most ``floor(max_len_a * source pieces + max_len_b)`` pieces before its
EOS, which is forced at that point (the limit wins over ``min_len``); EOS is banned before ``min_len``
pieces. Finished sentences leave the batch, so the work per step shrinks as sentences end, and a
sentence's result never depends on which others share its batch.

Scores are sums of log-probabilities kept in at least fp32 (fp64 models keep fp64); banned tokens get
``finfo.min``, never ``-inf``, so every score stays finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from ..models.protocol import TranslationModel


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities, EOS included
    attention: torch.Tensor | None = None  # (len(tokens) + 1, S): one row per output step, EOS included


def max_output_lengths(src_mask: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """(B,) most pieces each output may have before EOS; source pieces exclude the source EOS."""
    src_pieces = (src_mask.sum(1) - 1).clamp(min=0).double()  # (B,)
    return torch.floor(src_pieces * max_len_a + max_len_b).long().clamp(min=1)


def output_limit(src_pieces: int, max_len_a: float, max_len_b: int) -> int:
    """``max_output_lengths`` of one source of ``src_pieces`` pieces (its EOS excluded)."""
    return max(math.floor(src_pieces * max_len_a + max_len_b), 1)


def gnmt_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty (Wu et al. 2016, eq. 14): lp = ((5 + |Y|) / 6) ** alpha.

    ``length`` counts the EOS, so the empty output has |Y| = 1 and lp >= 1 for every hypothesis; the
    max(.., 1) only guards against a caller passing 0. Increasing in ``length`` for alpha >= 0, which
    the stopping bound of ``beam_search`` relies on.
    """
    return ((5 + max(length, 1)) / 6) ** alpha


def _log_probs(logits: torch.Tensor, t: int, limits: torch.Tensor, min_len: int) -> torch.Tensor:
    """Logits (N, V) for output position t -> log-probabilities (N, V) in at least fp32, with EOS
    banned while t < min_len and everything but EOS banned once t reaches the row's limit (N,).
    PAD and BOS are never output (their probability mass is kept in the normaliser: the model's own
    distribution is what scores are compared in)."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logp = F.log_softmax(logits.to(dtype), dim=-1)  # (N, V)
    lowest = torch.finfo(dtype).min
    logp[:, PAD_ID] = lowest
    logp[:, BOS_ID] = lowest
    at_limit = limits <= t  # (N,)
    if t < min_len:
        logp[:, EOS_ID] = torch.where(at_limit, logp[:, EOS_ID], lowest)
    if bool(at_limit.any()):
        not_eos = torch.arange(logp.size(1), device=logp.device) != EOS_ID  # (V,)
        logp.masked_fill_(at_limit[:, None] & not_eos[None, :], lowest)
    return logp


def force_prefix(logp: torch.Tensor, prefix: torch.Tensor | None, rows: torch.Tensor, t: int) -> torch.Tensor:
    """Target prefixes forced: logp (N, V) at output position t, ``prefix`` (B, P) the pieces each sentence's
    output must start with (PAD after a shorter one), ``rows`` (N,) the sentence of each row. A row whose
    prefix has a piece at t keeps that piece's log-probability and every other piece gets ``finfo.min``,
    so the search takes it and scores it as it scores any piece; the others are left alone."""
    if prefix is None or t >= prefix.size(1):
        return logp
    forced = prefix[rows, t]  # (N,)
    on = forced != PAD_ID  # (N,)
    if not bool(on.any()):
        return logp
    kept = logp.gather(1, forced[:, None])  # (N, 1); a row left alone gets its own value back
    return logp.masked_fill(on[:, None], torch.finfo(logp.dtype).min).scatter(1, forced[:, None], kept)


def prefix_limits(limits: torch.Tensor, prefix: torch.Tensor | None) -> torch.Tensor:
    """(B,) length limits at least as long as each sentence's prefix (EOS comes after it)."""
    if prefix is None:
        return limits
    return torch.maximum(limits, (prefix != PAD_ID).sum(1).to(limits.device))


@torch.no_grad()
def greedy_search(
    model: TranslationModel,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    need_attention: bool = False,
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
    prefix: torch.Tensor | None = None,
) -> list[Hypothesis]:
    """The most probable next piece at every step, for a batch src (B, S); with ``sampling``, a piece
    drawn from the (tempered, truncated) distribution instead (``sample_tokens``). Scores are the model's
    own log-probabilities of the pieces taken either way. ``prefix`` (B, P): pieces each output starts
    with (``force_prefix``), the search going on from there."""
    B = src.size(0)
    if B == 0:
        return []
    limits = prefix_limits(max_output_lengths(src_mask, max_len_a, max_len_b), prefix)  # (B,)
    state = model.encode(src, src_mask)
    alive = torch.arange(B, device=src.device)  # (b,) batch rows still decoding
    tokens = torch.full((B,), BOS_ID, dtype=torch.long, device=src.device)  # (b,)
    outputs: list[list[int]] = [[] for _ in range(B)]
    scores: torch.Tensor | None = None  # (B,) accumulated in the log-probabilities' dtype, like the beam
    attention: list[list[torch.Tensor]] = [[] for _ in range(B)]
    t = 0
    while alive.numel():
        logits, state, attn = model.step(tokens, state, need_attention)  # (b, V)
        logp = force_prefix(_log_probs(logits, t, limits[alive], min_len), prefix, alive, t)  # (b, V)
        if scores is None:
            scores = logp.new_zeros(B)
        best = logp.argmax(-1) if sampling is None else sample_tokens(logp, sampling, generator)  # (b,)
        scores[alive] += logp.gather(1, best[:, None])[:, 0]
        done = best == EOS_ID
        for row, (i, token) in enumerate(zip(alive.tolist(), best.tolist())):
            if need_attention:
                attention[i].append(attn[row])
            if token != EOS_ID:
                outputs[i].append(token)
        if bool(done.any()):
            keep = (~done).nonzero()[:, 0]  # (b',)
            alive, best = alive[keep], best[keep]
            if alive.numel():
                state = model.select(state, keep, inplace=True)
        tokens = best
        t += 1
    return [
        Hypothesis(outputs[i], float(scores[i]), torch.stack(attention[i]) if need_attention else None)
        for i in range(B)
    ]


# The search draws in float32 (or float64: ``_log_probs``), so a temperature or top_p must be a number float32
# holds at full precision: past its range 1e-46 rounds to 0 (a division by zero) and 1e39 to inf.
FLOAT32 = torch.finfo(torch.float32)


def check_sampling(temperature: float, top_k: int, top_p: float, seed: int,
                   named: Callable[[str], str] = str) -> None:
    """ValueError for the first sampling setting no draw can be made with, naming it as ``named`` spells
    it (``--top-p`` on the command line, ``top_p`` in a request): a temperature in float32's normal range
    (``FLOAT32.tiny`` to ``FLOAT32.max``), top_k >= 0, top_p from ``FLOAT32.tiny`` to 1, a 64-bit seed."""
    if not (math.isfinite(temperature) and FLOAT32.tiny <= temperature <= FLOAT32.max):
        raise ValueError(f"{named('temperature')} {temperature}: expected a number > 0 that float32 holds "
                         f"({FLOAT32.tiny:.4g} to {FLOAT32.max:.4g}: the search divides in float32)")
    if top_k < 0:
        raise ValueError(f"{named('top_k')} {top_k}: expected 0 (no cut) or more")
    if not FLOAT32.tiny <= top_p <= 1:
        raise ValueError(f"{named('top_p')} {top_p}: expected a value in (0, 1] that float32 holds (at least "
                         f"{FLOAT32.tiny:.4g})")
    if not 0 <= seed <= 2**64 - 1:
        raise ValueError(f"{named('seed')} {seed}: expected 0 to 2**64 - 1")


@dataclass(frozen=True)
class Sampling:
    """Random sampling instead of search (back-translation): the distribution divided by ``temperature``,
    cut to the ``top_k`` most probable pieces (0: all) and to the smallest set whose probability reaches
    ``top_p`` (nucleus sampling, Holtzman et al. 2020; 1: all), renormalised; ``seed`` makes it repeat.
    Settings ``check_sampling`` refuses are a ValueError."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p, self.seed)


def sampling_distribution(logp: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Log-probabilities (N, V) -> the probabilities (N, V) that ``sample_tokens`` draws from. Each row's
    best piece is moved to 0 before the division, so that a tiny temperature leaves it finite (the others go
    to -inf: greedy), never a row of -inf. A banned piece (``finfo.min``: past the length limit, outside a
    forced prefix, PAD and BOS) gets probability 0 whatever the temperature: divided by a large one it
    would come near 0 like any other and be drawn (a sample past its length limit); the best piece of a
    row stays, banned or not, so a row is never empty."""
    best = logp.max(dim=-1, keepdim=True).values  # (N, 1)
    banned = (logp <= torch.finfo(logp.dtype).min) & (logp < best)  # (N, V)
    scaled = ((logp - best) / sampling.temperature).masked_fill(banned, -math.inf)
    if sampling.top_k and sampling.top_k < scaled.size(-1):
        kth = scaled.topk(sampling.top_k, dim=-1).values[:, -1:]  # (N, 1)
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    if sampling.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the pieces ranked above each one
        cut = before >= sampling.top_p  # every piece after the set that reaches top_p; the first is kept
        sorted_probs = sorted_probs.masked_fill(cut, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_tokens(logp: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """One piece per row drawn from ``sampling_distribution`` (N,)."""
    return torch.multinomial(sampling_distribution(logp, sampling), 1, generator=generator)[:, 0]


def check_search_settings(beam_size: int, nbest: int, length_penalty: float, min_len: int) -> None:
    """ValueError for settings no search can run with."""
    if not 1 <= beam_size:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and beam_size ({beam_size}), got {nbest}")
    if not (math.isfinite(length_penalty) and 0 <= length_penalty <= 10):
        raise ValueError(f"length_penalty must be a number in [0, 10], got {length_penalty}")
    if min_len < 0:
        raise ValueError(f"min_len must be >= 0, got {min_len}")


@torch.no_grad()
def beam_search(
    model: TranslationModel,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    beam_size: int = 5,
    nbest: int = 1,
    length_penalty: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    need_attention: bool = False,
    prefix: torch.Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Beam search for a batch src (B, S): per sentence, up to ``nbest`` hypotheses, best first. With
    ``prefix`` (B, P), every hypothesis starts with its sentence's prefix (``force_prefix``).

    Each step extends the K live hypotheses of every sentence by every piece and takes the 2K best
    candidates by score (sum of log-probabilities). EOS candidates among the first K finish and are
    kept aside (the best K per sentence, ranked by score / ``gnmt_penalty(len + 1, alpha)`` with
    alpha = ``length_penalty``; 0 ranks by the plain sum); the first K others stay live. With K = 1
    and alpha = 0 this is exactly ``greedy_search``.

    A sentence stops when nothing live can still enter its n-best: scores only fall as a hypothesis
    grows and lp grows with length, so no continuation of a live hypothesis with score s can be
    ranked above s / lp(limit + 1); once the nbest-th kept hypothesis reaches that bound for the best
    live s, the result equals what running to the length limit would give. It stops anyway at the
    limit, where EOS is forced. Fewer than ``nbest`` come back only if fewer distinct hypotheses exist
    (e.g. a 1-piece limit, min_len = 1 and nbest = V).

    Raises ValueError unless 1 <= beam_size <= V and 1 <= nbest <= beam_size.
    """
    check_search_settings(beam_size, nbest, length_penalty, min_len)
    if src.size(0) == 0:
        return []
    search = _BeamSearch(model, src_mask, beam_size, nbest, length_penalty, need_attention, prefix)
    limits = prefix_limits(max_output_lengths(src_mask, max_len_a, max_len_b), prefix)
    return search.run(model.encode(src, src_mask), limits, min_len)


@dataclass
class _Finished:
    normalized: float  # score / length_penalty: the ranking key
    order: int  # insertion order: an equal later hypothesis ranks after an earlier one
    hyp: Hypothesis
    unmet: int = 0  # lexical constraints it lacks (``constrained.py``): fewer rank first, whatever the score

    def rank(self) -> tuple[int, float, int]:
        return self.unmet, -self.normalized, self.order


@dataclass
class _Candidates:
    """One step's 2K best extensions of each live sentence (b of them), and the K that stay live."""

    top_scores: torch.Tensor  # (b, 2K) best first
    top_beam: torch.Tensor  # (b, 2K) the beam each extends
    is_eos: torch.Tensor  # (b, 2K)
    live_scores: torch.Tensor  # (b, K) the first K that are not EOS, best first
    live_parents: torch.Tensor  # (b, K) their parent rows
    live_tokens: torch.Tensor  # (b, K)


class _BeamSearch:
    """The bookkeeping of one ``beam_search`` call: what is live (``active`` sentences, their rows'
    ``scores``, ``history`` and attention) and what has finished (``finished``, best K per sentence)."""

    def __init__(self, model: TranslationModel, src_mask: torch.Tensor, beam_size: int, nbest: int,
                 length_penalty: float, need_attention: bool, prefix: torch.Tensor | None = None) -> None:
        self.model, self.K, self.nbest, self.alpha = model, beam_size, nbest, length_penalty
        self.need_attention, self.device = need_attention, src_mask.device
        B = src_mask.size(0)
        self.active = torch.arange(B, device=self.device)  # (b,) sentences still searching
        # (N, t) pieces so far, no BOS
        self.history = torch.zeros(B * self.K, 0, dtype=torch.long, device=self.device)
        self.attn_history: torch.Tensor | None = None  # (N, t, S)
        self.scores: torch.Tensor | None = None  # (N,)
        self.finished: list[list[_Finished]] = [[] for _ in range(B)]
        # normalized score a new hypothesis must beat to be kept (K kept already)
        self.floor = [-math.inf] * B
        self.inserted = 0
        self.prefix = prefix  # (B, P) pieces every hypothesis starts with, PAD after a shorter one

    def run(self, state: Any, limits: torch.Tensor, min_len: int) -> list[list[Hypothesis]]:
        B, K = limits.numel(), self.K
        # The largest penalty each sentence's hypotheses can get: its limit plus the EOS.
        lp_max = [gnmt_penalty(n + 1, self.alpha) for n in limits.tolist()]
        tokens = torch.full((B,), BOS_ID, dtype=torch.long, device=self.device)  # (N,)
        t = 0
        while self.active.numel():
            logits, state, attn = self.model.step(tokens, state, self.need_attention)  # (N, V), attn (N, S)
            if t == 0:
                logits, state, attn = self._copy_first_step(logits, state, attn)
            if K > logits.size(-1):
                raise ValueError(f"beam_size ({K}) must not exceed the vocabulary size ({logits.size(-1)})")
            logp = self._log_probs(logits, t, limits, min_len)  # (N, V)
            candidates = self._candidates(logp, attn)
            self._keep_finished(candidates, t, attn)
            keep = self._still_searching(candidates.live_scores, lp_max)  # (b,)
            # (N',) rows of the next step, in their parents' positions
            index = candidates.live_parents[keep].view(-1)
            self.active = self.active[keep]
            if not self.active.numel():
                break
            state = self.model.select(state, index, inplace=True)
            tokens = self._advance(candidates, keep, index, attn)
            t += 1
        ranked = [sorted(f, key=_Finished.rank)[: self.nbest] for f in self.finished]
        return [[f.hyp for f in kept] for kept in ranked]

    def _log_probs(self, logits: torch.Tensor, t: int, limits: torch.Tensor, min_len: int) -> torch.Tensor:
        """Step t's log-probabilities (N, V) of every row's next piece, with the bans of ``_log_probs`` and
        the pieces the prefix forces."""
        rows = self.active.repeat_interleave(self.K)  # (N,) the sentence of each row
        return force_prefix(_log_probs(logits, t, limits[rows], min_len), self.prefix, rows, t)

    def _copy_first_step(self, logits: torch.Tensor, state: Any, attn: torch.Tensor | None):
        """Every beam starts from the same BOS: one row per sentence went through the model, and now
        becomes K identical rows (of which the search keeps one live, see ``_candidates``)."""
        B = logits.size(0)
        copies = torch.arange(B, device=self.device).repeat_interleave(self.K)  # (B*K,)
        logits, state = logits.index_select(0, copies), self.model.select(state, copies, inplace=True)
        return logits, state, (attn.index_select(0, copies) if self.need_attention else None)

    def _extensions(self, logp: torch.Tensor, attn: torch.Tensor | None) -> torch.Tensor:
        """(b, K*V) the score of every extension of every row, sentence by sentence (logp is consumed)."""
        b, K = self.active.numel(), self.K
        dtype, lowest = logp.dtype, torch.finfo(logp.dtype).min
        if self.scores is None:
            if self.need_attention:
                self.attn_history = attn.new_zeros(b * K, 0, attn.size(1))
            # One live hypothesis per sentence at first, so the K copies of BOS don't fill the beam.
            scores = torch.full((b, K), lowest, dtype=dtype, device=self.device)
            scores[:, 0] = 0
            self.scores = scores.view(-1)
        # Clamp: lowest + lowest would be -inf; a banned or dead candidate stays exactly `lowest`.
        # In place: logp is this step's own tensor, and (N, V) is the largest thing the search makes.
        return logp.add_(self.scores[:, None]).clamp_(min=lowest).view(b, -1)  # (b, K*V)

    def _candidates(self, logp: torch.Tensor, attn: torch.Tensor | None) -> _Candidates:
        """Score every extension of every live row and keep each sentence's 2K best (logp is consumed)."""
        b, K, V = self.active.numel(), self.K, logp.size(-1)
        cand = self._extensions(logp, attn)  # (b, K*V)
        top_scores, top_index = cand.topk(2 * K, dim=1)  # (b, 2K), best first
        top_beam, top_token = top_index // V, top_index % V  # (b, 2K)
        is_eos = top_token == EOS_ID
        # At most K EOS among 2K, so the first K non-EOS candidates always exist.
        positions = torch.arange(2 * K, device=self.device)
        live_pos = (is_eos.long() * 2 * K + positions).topk(K, dim=1, largest=False).values % (2 * K)
        parents = torch.arange(b, device=self.device)[:, None] * K + top_beam.gather(1, live_pos)  # (b, K)
        return _Candidates(top_scores, top_beam, is_eos, top_scores.gather(1, live_pos), parents,
                           top_token.gather(1, live_pos))

    def _keep_finished(self, c: _Candidates, t: int, attn: torch.Tensor | None) -> None:
        """EOS among the first K candidates, not banned and good enough: kept, the best K per sentence."""
        K, dtype = self.K, c.top_scores.dtype
        lowest = torch.finfo(dtype).min
        sentences = self.active.tolist()
        lp = torch.tensor(gnmt_penalty(t + 1, self.alpha), dtype=dtype, device=self.device)
        normalized = c.top_scores[:, :K] / lp  # (b, K)
        floors = torch.tensor([self.floor[i] for i in sentences], dtype=dtype, device=self.device)  # (b,)
        new_done = c.is_eos[:, :K] & (c.top_scores[:, :K] > lowest) & (normalized > floors[:, None])
        if not bool(new_done.any()):
            return
        for i, j in new_done.nonzero().tolist():
            sentence, row = sentences[i], i * K + int(c.top_beam[i, j])
            attention = torch.cat([self.attn_history[row], attn[row][None]]) if self.need_attention else None
            hyp = Hypothesis(self.history[row].tolist(), float(c.top_scores[i, j]), attention)
            self.finished[sentence].append(_Finished(float(normalized[i, j]), self.inserted, hyp,
                                                     self._unmet(row)))
            self.inserted += 1
        for sentence in set(self.active[new_done.any(1)].tolist()):
            kept = sorted(self.finished[sentence], key=_Finished.rank)[:K]
            self.finished[sentence] = kept
            if len(kept) == K:
                self.floor[sentence] = kept[-1].normalized

    def _unmet(self, row: int) -> int:
        """How many lexical constraints the hypothesis of ``row`` lacks (none here)."""
        return 0

    def _still_searching(self, live_scores: torch.Tensor, lp_max: list[float]) -> torch.Tensor:
        """(b,) bool: False for a sentence with nothing live, or whose nbest-th kept hypothesis no live
        one can beat (the bound of the docstring of ``beam_search``)."""
        dtype = live_scores.dtype
        lowest, sentences = torch.finfo(dtype).min, self.active.tolist()
        best_live = live_scores[:, 0]  # (b,): live candidates come best first
        # The best normalized score a live continuation can reach; same dtype and division as `normalized`.
        bound = (best_live / torch.tensor([lp_max[i] for i in sentences], dtype=dtype,
                                          device=self.device)).tolist()
        n = self.nbest
        done = [
            best_live_score <= lowest or (len(self.finished[i]) >= n
                                          and self.finished[i][n - 1].normalized >= bound_i)
            for i, best_live_score, bound_i in zip(sentences, best_live.tolist(), bound)
        ]
        return torch.tensor([not d for d in done], device=self.device)

    def _advance(self, c: _Candidates, keep: torch.Tensor, index: torch.Tensor,
                 attn: torch.Tensor | None) -> torch.Tensor:
        """The live candidates of the sentences still searching become the rows; returns their tokens."""
        self.scores, tokens = c.live_scores[keep].view(-1), c.live_tokens[keep].view(-1)
        self.history = torch.cat([self.history[index], tokens[:, None]], dim=1)  # (N', t + 1)
        if self.need_attention:
            # (N', t + 1, S)
            self.attn_history = torch.cat([self.attn_history[index], attn[index][:, None]], dim=1)
        return tokens
