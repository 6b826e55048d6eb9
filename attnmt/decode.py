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
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .batching import collate
from .data import clean
from .tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities, EOS included
    attention: torch.Tensor | None = None  # (len(tokens) + 1, S): one row per output step, EOS included


def max_output_lengths(src_mask: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """(B,) most pieces each output may have before EOS; source pieces exclude the source EOS."""
    src_pieces = (src_mask.sum(1) - 1).clamp(min=0).double()  # (B,)
    return torch.floor(src_pieces * max_len_a + max_len_b).long().clamp(min=1)


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


@torch.no_grad()
def greedy_search(
    model,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    need_attention: bool = False,
) -> list[Hypothesis]:
    """The most probable next piece at every step, for a batch src (B, S)."""
    B = src.size(0)
    if B == 0:
        return []
    limits = max_output_lengths(src_mask, max_len_a, max_len_b)  # (B,)
    state = model.encode(src, src_mask)
    alive = torch.arange(B, device=src.device)  # (b,) batch rows still decoding
    tokens = torch.full((B,), BOS_ID, dtype=torch.long, device=src.device)  # (b,)
    outputs: list[list[int]] = [[] for _ in range(B)]
    scores: torch.Tensor | None = None  # (B,) accumulated in the log-probabilities' dtype, like the beam
    attention: list[list[torch.Tensor]] = [[] for _ in range(B)]
    t = 0
    while alive.numel():
        logits, state, attn = model.step(tokens, state, need_attention)  # (b, V)
        logp = _log_probs(logits, t, limits[alive], min_len)  # (b, V)
        if scores is None:
            scores = logp.new_zeros(B)
        best = logp.argmax(-1)  # (b,)
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


@dataclass
class _Finished:
    normalized: float  # score / length_penalty: the ranking key
    order: int  # insertion order: an equal later hypothesis ranks after an earlier one
    hyp: Hypothesis


def _check_beam_args(beam_size: int, nbest: int, length_penalty: float, min_len: int) -> None:
    if not 1 <= beam_size:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and beam_size ({beam_size}), got {nbest}")
    if not (math.isfinite(length_penalty) and length_penalty >= 0):
        raise ValueError(f"length_penalty must be a finite number >= 0, got {length_penalty}")
    if min_len < 0:
        raise ValueError(f"min_len must be >= 0, got {min_len}")


@torch.no_grad()
def beam_search(
    model,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    beam_size: int = 5,
    nbest: int = 1,
    length_penalty: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    need_attention: bool = False,
) -> list[list[Hypothesis]]:
    """Beam search for a batch src (B, S): per sentence, up to ``nbest`` hypotheses, best first.

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
    _check_beam_args(beam_size, nbest, length_penalty, min_len)
    B, K, device = src.size(0), beam_size, src.device
    if B == 0:
        return []
    limits = max_output_lengths(src_mask, max_len_a, max_len_b)  # (B,)
    # The largest penalty each sentence's hypotheses can get: its limit plus the EOS.
    lp_max = [gnmt_penalty(n + 1, length_penalty) for n in limits.tolist()]
    state = model.encode(src, src_mask)  # B rows: the first step runs once per sentence, see below
    active = torch.arange(B, device=device)  # (b,) sentences still searching
    tokens = torch.full((B,), BOS_ID, dtype=torch.long, device=device)  # (N,)
    history = torch.zeros(B * K, 0, dtype=torch.long, device=device)  # (N, t) pieces so far, no BOS
    attn_history: torch.Tensor | None = None  # (N, t, S)
    scores: torch.Tensor | None = None  # (N,)
    finished: list[list[_Finished]] = [[] for _ in range(B)]
    floor = [-math.inf] * B  # normalized score a new hypothesis must beat to be kept (K kept already)
    inserted = 0
    t = 0
    while active.numel():
        b, sentences = active.numel(), active.tolist()
        logits, state, attn = model.step(tokens, state, need_attention)  # (N, V), attn (N, S)
        if t == 0:
            # Every beam starts from the same BOS: one row per sentence went through the model, and now
            # becomes K identical rows (of which the search keeps one live, below).
            copies = torch.arange(B, device=device).repeat_interleave(K)  # (B*K,)
            logits, state = logits.index_select(0, copies), model.select(state, copies, inplace=True)
            attn = attn.index_select(0, copies) if need_attention else None
        V = logits.size(-1)
        if K > V:
            raise ValueError(f"beam_size ({K}) must not exceed the vocabulary size ({V})")
        logp = _log_probs(logits, t, limits[active].repeat_interleave(K), min_len)  # (N, V)
        dtype, lowest = logp.dtype, torch.finfo(logp.dtype).min
        if scores is None:
            if need_attention:
                attn_history = attn.new_zeros(b * K, 0, attn.size(1))
            # One live hypothesis per sentence at first, so the K copies of BOS don't fill the beam.
            scores = torch.full((b, K), lowest, dtype=dtype, device=device)
            scores[:, 0] = 0
            scores = scores.view(-1)
        # Clamp: lowest + lowest would be -inf; a banned or dead candidate stays exactly `lowest`.
        # In place: logp is this step's own tensor, and (N, V) is the largest thing the search makes.
        cand = logp.add_(scores[:, None]).clamp_(min=lowest).view(b, K * V)  # (b, K*V)
        top_scores, top_index = cand.topk(2 * K, dim=1)  # (b, 2K), best first
        top_beam, top_token = top_index // V, top_index % V  # (b, 2K)
        is_eos = top_token == EOS_ID
        # At most K EOS among 2K, so the first K non-EOS candidates always exist.
        live_pos = (is_eos.long() * 2 * K + torch.arange(2 * K, device=device)).topk(K, dim=1, largest=False).values % (2 * K)
        new_scores = top_scores.gather(1, live_pos)  # (b, K)
        rows = torch.arange(b, device=device)[:, None] * K + top_beam.gather(1, live_pos)  # (b, K) parent rows
        new_tokens = top_token.gather(1, live_pos)  # (b, K)

        # Finished: EOS among the first K candidates, not banned, and good enough to be kept.
        lp = torch.tensor(gnmt_penalty(t + 1, length_penalty), dtype=dtype, device=device)
        normalized = top_scores[:, :K] / lp  # (b, K)
        floors = torch.tensor([floor[i] for i in sentences], dtype=dtype, device=device)  # (b,)
        new_done = is_eos[:, :K] & (top_scores[:, :K] > lowest) & (normalized > floors[:, None])
        if bool(new_done.any()):
            for i, j in new_done.nonzero().tolist():
                sentence, row = sentences[i], i * K + int(top_beam[i, j])
                attention = torch.cat([attn_history[row], attn[row][None]]) if need_attention else None
                hyp = Hypothesis(history[row].tolist(), float(top_scores[i, j]), attention)
                finished[sentence].append(_Finished(float(normalized[i, j]), inserted, hyp))
                inserted += 1
            for sentence in set(active[new_done.any(1)].tolist()):
                kept = sorted(finished[sentence], key=lambda f: (-f.normalized, f.order))[:K]
                finished[sentence] = kept
                if len(kept) == K:
                    floor[sentence] = kept[-1].normalized

        # Stop a sentence with nothing live, or whose nbest-th kept hypothesis no live one can beat.
        best_live = new_scores[:, 0]  # (b,): live candidates come best first
        # The best normalized score a live continuation can reach; same dtype and division as `normalized`.
        bound = (best_live / torch.tensor([lp_max[i] for i in sentences], dtype=dtype, device=device)).tolist()
        done = [
            best_live_score <= lowest
            or (len(finished[i]) >= nbest and finished[i][nbest - 1].normalized >= bound_i)
            for i, best_live_score, bound_i in zip(sentences, best_live.tolist(), bound)
        ]
        keep = torch.tensor([not d for d in done], device=device)  # (b,)
        index = rows[keep].view(-1)  # (N',) rows of the next step, in their parents' current positions
        active = active[keep]
        if not active.numel():
            break
        state = model.select(state, index, inplace=True)
        scores, tokens = new_scores[keep].view(-1), new_tokens[keep].view(-1)
        history = torch.cat([history[index], tokens[:, None]], dim=1)  # (N', t + 1)
        if need_attention:
            attn_history = torch.cat([attn_history[index], attn[index][:, None]], dim=1)  # (N', t + 1, S)
        t += 1
    return [[f.hyp for f in sorted(finished[i], key=lambda f: (-f.normalized, f.order))[:nbest]] for i in range(B)]


# ----------------------------------------------------------------------------------- translating


@dataclass
class Translation:
    """The n-best outputs of one input line: (detokenised text, score), best first. The score is the one
    the beam ranks by: the sum of log-probabilities over ``gnmt_penalty`` (so it falls down the list)."""

    outputs: list[tuple[str, float]]
    truncated: bool = False  # the source was longer than max_src_len pieces and was cut


class Translator:
    """Text in, text out: clean, encode, sort by length, batch under a token budget, search, decode.

    ``beam_size`` 1 means greedy search. Batches hold at most ``max_tokens`` source pieces x beam rows
    (padded), so memory stays bounded whatever the input. An empty line translates to an empty line.
    """

    def __init__(self, model, tokenizer, beam_size: int = 5, nbest: int = 1, length_penalty: float = 0.6,
                 max_len_a: float = 1.5, max_len_b: int = 10, min_len: int = 0, max_src_len: int = 256,
                 max_tokens: int = 8000, device: torch.device | str = "cpu") -> None:
        _check_beam_args(beam_size, nbest, length_penalty, min_len)
        self.model, self.tokenizer, self.device = model, tokenizer, torch.device(device)
        self.beam_size, self.nbest, self.length_penalty = beam_size, nbest, length_penalty
        self.max_len_a, self.max_len_b, self.min_len = max_len_a, max_len_b, min_len
        self.max_src_len, self.max_tokens = max_src_len, max_tokens

    def search(self, src_ids: list[list[int]], need_attention: bool = False) -> list[list[Hypothesis]]:
        """Hypotheses for already encoded sources (in their order), batched by length."""
        order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
        results: list[list[Hypothesis]] = [[] for _ in src_ids]
        start = 0
        while start < len(order):
            end, longest = start, 0
            while end < len(order):
                longest = max(longest, len(src_ids[order[end]]) + 1)
                if end > start and longest * (end - start + 1) * self.beam_size > self.max_tokens:
                    break
                end += 1
            chunk = order[start:end]
            batch = collate([src_ids[i] for i in chunk]).to(self.device)
            if self.beam_size == 1 and self.nbest == 1:
                found = [[h] for h in greedy_search(self.model, batch.src, batch.src_mask, self.max_len_a,
                                                    self.max_len_b, self.min_len, need_attention)]
            else:
                found = beam_search(self.model, batch.src, batch.src_mask, self.beam_size, self.nbest, self.length_penalty,
                                    self.max_len_a, self.max_len_b, self.min_len, need_attention)
            for i, hyps in zip(chunk, found):
                results[i] = hyps
            start = end
        return results

    def translate(self, lines: list[str]) -> list[Translation]:
        texts = [clean(line) for line in lines]
        todo = [i for i, text in enumerate(texts) if text]
        encoded = self.tokenizer.encode_src([texts[i] for i in todo])
        truncated = {i for i, ids in zip(todo, encoded) if len(ids) > self.max_src_len}
        encoded = [ids[: self.max_src_len] for ids in encoded]
        out = [Translation([("", 0.0)]) for _ in texts]
        for i, hyps in zip(todo, self.search(encoded)):
            decoded = self.tokenizer.decode_tgt([h.tokens for h in hyps])
            scores = [h.score / gnmt_penalty(len(h.tokens) + 1, self.length_penalty) for h in hyps]
            out[i] = Translation(list(zip(decoded, scores)), i in truncated)
        return out
