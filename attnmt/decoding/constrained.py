"""Lexical constraints: beam search whose outputs contain given target phrases (``translate --constraints``).

Letters: B batch, V vocabulary, K beam size, b sentences still searching, N rows (b * K).

Dynamic beam allocation (Post & Vilar 2018) with the beam size as the whole budget. Every hypothesis
carries its ``Progress`` through its sentence's phrases: which it has produced in full, and how far it
is into the one it is producing. At every step the candidates are the usual best extensions, each live
hypothesis's best piece, and every piece that takes a hypothesis further into a phrase (the next piece of
the phrase it is in, or the first piece of any phrase it lacks), so that a constrained path is always on
offer however unlikely the model finds it; a hypothesis without room left before the length limit for
the constraint pieces it lacks is dropped while there are others. The K that stay live are chosen bank
by bank, a bank being the hypotheses that have produced the same number of constraint pieces: the best
of every bank, from the fullest bank down, then the second best of every bank, and so on (the
round-robin of Hu et al. 2019, which gives each bank K / banks places and hands the places a bank cannot
fill to the others).

A hypothesis may end (EOS) only once it holds every phrase, except at the length limit, where EOS is
forced: a hypothesis that still lacks a phrase there ends too, and ranks after every one that lacks
fewer, whatever the scores. Scores stay the model's own log-probabilities: a forced piece is scored like
any other. A phrase left half way no longer counts, and the piece that left it may start another one.
With no phrases this is exactly ``decode.beam_search``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..data.tokenizer import EOS_ID, UNK_ID
from ..models.protocol import TranslationModel
from .search import (
    Hypothesis,
    _BeamSearch,
    _Candidates,
    check_search_settings,
    max_output_lengths,
    prefix_limits,
)


@dataclass(frozen=True)
class Progress:
    """Where one hypothesis stands against its sentence's phrases."""

    met: frozenset[int] = frozenset()  # the phrases produced in full (indices)
    phrase: int = -1  # the phrase being produced (-1: none)
    matched: int = 0  # how many of its pieces are produced


class Constraints:
    """One sentence's phrases (lists of target piece ids; an empty one is dropped), and the rules a
    hypothesis's ``Progress`` follows through them. A phrase given twice must appear twice."""

    def __init__(self, phrases: Sequence[Sequence[int]]) -> None:
        self.phrases = [tuple(p) for p in phrases if len(p)]
        self.pieces = sum(len(p) for p in self.phrases)
        self.start = Progress()
        self._advanced: dict[tuple[Progress, int], Progress] = {}

    def __bool__(self) -> bool:
        return bool(self.phrases)

    def allowed(self, p: Progress) -> list[int]:
        """The pieces that take ``p`` further: the next of the phrase it is in, else the first of each
        phrase it lacks."""
        if p.phrase >= 0:
            return [self.phrases[p.phrase][p.matched]]
        return [phrase[0] for j, phrase in enumerate(self.phrases) if j not in p.met]

    def advance(self, p: Progress, token: int) -> Progress:
        """``p`` after the hypothesis outputs ``token``."""
        key = (p, token)
        if key not in self._advanced:
            self._advanced[key] = self._advance(p, token)
        return self._advanced[key]

    def _advance(self, p: Progress, token: int) -> Progress:
        if p.phrase >= 0:
            phrase = self.phrases[p.phrase]
            if phrase[p.matched] == token:
                if p.matched + 1 == len(phrase):
                    return Progress(p.met | {p.phrase})
                return Progress(p.met, p.phrase, p.matched + 1)
            p = Progress(p.met)  # left half way: what it had of that phrase no longer counts
        for j, phrase in enumerate(self.phrases):
            if j not in p.met and phrase[0] == token:
                return Progress(p.met | {j}) if len(phrase) == 1 else Progress(p.met, j, 1)
        return p

    def bank(self, p: Progress) -> int:
        """The constraint pieces ``p`` has produced: the bank its hypothesis competes in."""
        return sum(len(self.phrases[j]) for j in p.met) + p.matched

    def unmet(self, p: Progress) -> int:
        return len(self.phrases) - len(p.met)


@dataclass(frozen=True)
class _Option:
    """One candidate extension: its score, the beam it extends, its piece and the progress it reaches."""

    score: float
    beam: int
    token: int
    progress: Progress
    bank: int


def allocate(options: Sequence[_Option], K: int) -> list[_Option]:
    """The K (at most) options a beam keeps, best score first: ranked by score inside their bank, the first
    of every bank from the fullest down, then the second of every bank, and so on."""
    ranked, seen = [], Counter()
    for o in sorted(options, key=lambda o: -o.score):
        ranked.append(((seen[o.bank], -o.bank), o))
        seen[o.bank] += 1
    chosen = [o for _, o in sorted(ranked, key=lambda pair: pair[0])[:K]]
    return sorted(chosen, key=lambda o: -o.score)


@torch.no_grad()
def constrained_search(
    model: TranslationModel,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    constraints: Sequence[Constraints],
    beam_size: int = 5,
    nbest: int = 1,
    length_penalty: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    need_attention: bool = False,
    prefix: torch.Tensor | None = None,
) -> list[list[Hypothesis]]:
    """``decode.beam_search`` for a batch src (B, S) whose sentences' outputs must hold ``constraints`` (one
    ``Constraints`` per sentence); the arguments and the n-best are beam search's. A sentence whose
    phrases cannot all fit in its length limit gets hypotheses that lack some (ranked by how many)."""
    check_search_settings(beam_size, nbest, length_penalty, min_len)
    if src.size(0) == 0:
        return []
    if len(constraints) != src.size(0):
        raise ValueError(f"{len(constraints)} constraints for {src.size(0)} sentences")
    search = _ConstrainedSearch(model, src_mask, beam_size, nbest, length_penalty, need_attention, prefix,
                                list(constraints))
    limits = prefix_limits(max_output_lengths(src_mask, max_len_a, max_len_b), prefix)
    return search.run(model.encode(src, src_mask), limits, min_len)


class _ConstrainedSearch(_BeamSearch):
    """``_BeamSearch`` with each row's ``Progress`` (``progress``, one per row) and the candidates and
    choice of dynamic beam allocation."""

    def __init__(self, model: TranslationModel, src_mask: torch.Tensor, beam_size: int, nbest: int,
                 length_penalty: float, need_attention: bool, prefix: torch.Tensor | None,
                 constraints: list[Constraints]) -> None:
        super().__init__(model, src_mask, beam_size, nbest, length_penalty, need_attention, prefix)
        self.constraints = constraints
        self.progress = [c.start for c in constraints for _ in range(beam_size)]  # (N,)
        self._chosen: list[list[_Option]] = []  # each sentence's live options of this step
        self._room: list[int] = []  # each sentence's pieces left after this step's

    def _log_probs(self, logits: torch.Tensor, t: int, limits: torch.Tensor, min_len: int) -> torch.Tensor:
        """Beam search's, and EOS banned for every row that lacks a phrase, until its limit."""
        logp = super()._log_probs(logits, t, limits, min_len)
        self._room = (limits[self.active] - t - 1).tolist()  # (b,) pieces left after this step's
        rows = self.active.repeat_interleave(self.K)  # (N,)
        lacking = [self.constraints[s].unmet(p) > 0 for s, p in zip(rows.tolist(), self.progress)]
        if any(lacking):
            before_limit = limits[rows] > t  # (N,)
            ban = torch.tensor(lacking, device=logp.device) & before_limit
            logp[:, EOS_ID] = logp[:, EOS_ID].masked_fill(ban, torch.finfo(logp.dtype).min)
        return logp

    def _unmet(self, row: int) -> int:
        return self.constraints[int(self.active[row // self.K])].unmet(self.progress[row])

    def _candidates(self, logp: torch.Tensor, attn: torch.Tensor | None) -> _Candidates:
        """Each sentence's options (``_options``), allocated twice: the K live ones among those that go on,
        and, among all of them, EOS included, those that end now."""
        b, K, V = self.active.numel(), self.K, logp.size(-1)
        cand = self._extensions(logp, attn).view(b, K, V)  # (b, K, V)
        eos = cand[:, :, EOS_ID].clone()  # (b, K)
        cand[:, :, EOS_ID] = torch.finfo(cand.dtype).min
        going_on = self._options(cand, eos)
        lowest = float(torch.finfo(cand.dtype).min)
        dead = _Option(lowest, 0, UNK_ID, Progress(), 0)
        live, ending = [], []
        for options, endings in going_on:
            live.append(allocate(options, K) + [dead] * K)
            ending.append([o for o in allocate(options + endings, K) if o.token == EOS_ID] + [dead] * K)
        self._chosen = [row[:K] for row in live]

        def table(rows: list[list[_Option]], field: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([[getattr(o, field) for o in row[:K]] for row in rows], dtype=dtype,
                                device=self.device)

        base = torch.arange(b, device=self.device)[:, None] * K
        return _Candidates(top_scores=table(ending, "score", cand.dtype),
                           top_beam=table(ending, "beam", torch.long),
                           is_eos=table(ending, "token", torch.long) == EOS_ID,
                           live_scores=table(live, "score", cand.dtype),
                           live_parents=base + table(live, "beam", torch.long),
                           live_tokens=table(live, "token", torch.long))

    def _options(self, cand: torch.Tensor, eos: torch.Tensor) -> list[tuple[list[_Option], list[_Option]]]:
        """Per sentence, the extensions worth choosing from (``cand`` (b, K, V) without EOS): the 2K best,
        each row's best, each row's pieces into a phrase (``Constraints.allowed``); and its rows' EOS
        (``eos`` (b, K)), each with its score, progress and bank. Banned and dead ones are left out, and so
        are those without room left for the constraint pieces they lack, while there are others."""
        b, K, V = cand.shape
        lowest = float(torch.finfo(cand.dtype).min)
        top = cand.view(b, K * V).topk(min(2 * K, K * V), dim=1).indices.tolist()  # (b, 2K)
        row_best = cand.argmax(-1).tolist()  # (b, K)
        sentences = self.active.tolist()
        picked: list[list[tuple[int, int]]] = []
        for i, s in enumerate(sentences):
            pairs = {(j // V, j % V) for j in top[i]} | {(k, row_best[i][k]) for k in range(K)}
            for k in range(K):
                pairs.update((k, token) for token in self.constraints[s].allowed(self.progress[i * K + k]))
            picked.append(sorted(pairs))
        flat = torch.tensor([(i * K + k) * V + v for i, pairs in enumerate(picked) for k, v in pairs],
                            dtype=torch.long, device=cand.device)
        scores = iter(cand.reshape(-1)[flat].tolist())
        eos_scores = eos.tolist()
        out = []
        for i, s in enumerate(sentences):
            c, options, endings = self.constraints[s], [], []
            for k, token in picked[i]:
                score = next(scores)
                if score > lowest:
                    p = c.advance(self.progress[i * K + k], token)
                    options.append(_Option(score, k, token, p, c.bank(p)))
            # A hypothesis that no longer has room for the pieces it lacks gives its place to one that has.
            options = [o for o in options if c.pieces - o.bank <= self._room[i]] or options
            for k in range(K):
                if eos_scores[i][k] > lowest:
                    p = self.progress[i * K + k]
                    endings.append(_Option(eos_scores[i][k], k, EOS_ID, p, c.bank(p)))
            out.append((options, endings))
        return out

    def _advance(self, c: _Candidates, keep: torch.Tensor, index: torch.Tensor,
                 attn: torch.Tensor | None) -> torch.Tensor:
        kept = keep.tolist()
        self.progress = [o.progress for i, row in enumerate(self._chosen) if kept[i] for o in row]
        return super()._advance(c, keep, index, attn)

