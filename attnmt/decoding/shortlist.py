"""A lexical shortlist (``attnmt shortlist RUN``, ``translate --shortlist FILE``): per batch, the output
layer cut to the pieces the batch's sources may translate to, as Marian's shortlists and the Bergamot
students do. A run folder's encoded training pairs in, a table out (``build_shortlist``); a table and a
model in, the same search over fewer pieces out (``Shortlist.restricted``).

The table: for every source piece, the ``per_piece`` target pieces most associated with it in the
training pairs (Dice's coefficient over sentence co-occurrence, 2 c(s, t) / (c(s) + c(t)), each pair
counted once per sentence), and the ``frequent`` most frequent target pieces. A batch may output the
union of its source pieces' lists, the frequent pieces and the special pieces, nothing else: the output
projection is a product with that many rows instead of the whole vocabulary, and the softmax and the
beam's top-k shrink with it. Scores are normalised over the list (as Marian's are). With every piece in
the list the search is the full search, exactly (the oracle of ``tests/decoding/test_shortlist.py``).

Searches with prefixes or constraints, and sampling, run on the whole vocabulary: their pieces are not
the source's to choose.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config.specials import SPECIAL_PIECES
from ..errors import ConfigError
from .search import Hypothesis

FORMAT = "attnmt-shortlist-1"
CHUNK_PAIRS = 20_000  # pairs counted at once: memory stays bounded by the distinct (source, target) pairs


@dataclass
class Shortlist:
    table: torch.Tensor  # (source vocabulary, per_piece) target pieces, best first; -1 after fewer
    frequent: torch.Tensor  # (F,) the most frequent target pieces
    tokenizer: dict  # the fingerprint of the tokenizer whose pieces these are
    _outputs: dict = field(default_factory=dict, repr=False)  # id(layer) -> its float (weight, bias)

    def pieces(self, sources: Sequence[Sequence[int]]) -> torch.Tensor:
        """(n,) sorted target pieces a batch of ``sources`` may output; the special pieces first, at their
        own ids (they are the lowest), so the searches' PAD, BOS and EOS keep their places."""
        seen = torch.tensor(sorted({p for ids in sources for p in ids if p < len(self.table)}),
                            dtype=torch.long)
        listed = self.table[seen].flatten().long()
        specials = torch.arange(len(SPECIAL_PIECES))
        return torch.cat([specials, self.frequent.long(), listed[listed >= 0]]).unique()

    @contextlib.contextmanager
    def restricted(self, model: nn.Module, sources: Sequence[Sequence[int]]) -> Iterator[_Restricted]:
        """``model`` (or each member of an ensemble) with its output layer cut to ``pieces(sources)``, as a
        model whose vocabulary is that list, while the block runs; ``_Restricted.back`` maps its
        hypotheses to the model's own pieces."""
        ids = self.pieces(sources).to(next(model.parameters()).device)
        members = list(getattr(model, "members", [model]))
        kept = [member.output for member in members]
        try:
            for member, layer in zip(members, kept):
                weight, bias = self._float_output(layer)
                member.output = _Rows(weight[ids], bias[ids] if bias is not None else None)
            yield _Restricted(model, ids)
        finally:
            for member, layer in zip(members, kept):
                member.output = layer

    def _float_output(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output layer's weight and bias in float (an int8 layer's dequantized once)."""
        if id(layer) not in self._outputs:
            if callable(layer.weight):  # torch's quantized linear layer (``quantize.py``)
                bias = layer.bias()
                self._outputs[id(layer)] = (layer.weight().dequantize(), bias)
            else:
                self._outputs[id(layer)] = (layer.weight.detach(), layer.bias)
        return self._outputs[id(layer)]


class _Rows(nn.Module):
    """An output layer with the rows of the listed pieces only."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _Restricted:
    """A model whose vocabulary is the listed pieces ``ids`` (the three calls of ``models.protocol``):
    each step's tokens go back to the model's own pieces before they are embedded."""

    def __init__(self, model: nn.Module, ids: torch.Tensor) -> None:
        self.model, self.ids = model, ids

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor):
        return self.model.encode(src, src_mask)

    def step(self, tokens: torch.Tensor, state, need_attention: bool = False):
        return self.model.step(self.ids[tokens], state, need_attention)

    def select(self, state, index: torch.Tensor, inplace: bool = False):
        return self.model.select(state, index, inplace)

    def back(self, found: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
        """The hypotheses of a search on this model, in the model's own pieces."""
        ids = self.ids.tolist()
        return [[Hypothesis([ids[t] for t in h.tokens], h.score, h.attention) for h in hyps]
                for hyps in found]


def build_shortlist(src_rows: Sequence[Sequence[int]], tgt_rows: Sequence[Sequence[int]], src_vocab: int,
                    tgt_vocab: int, per_piece: int, frequent: int, tokenizer: dict) -> Shortlist:
    """The table of the module docstring from encoded pairs (source and target pieces, no specials)."""
    keys, counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
    src_seen, tgt_seen = np.zeros(src_vocab, np.int64), np.zeros(tgt_vocab, np.int64)
    tgt_total = np.zeros(tgt_vocab, np.int64)
    for start in range(0, len(src_rows), CHUNK_PAIRS):
        chunk = []
        for s, t in zip(src_rows[start:start + CHUNK_PAIRS], tgt_rows[start:start + CHUNK_PAIRS]):
            us, ut = np.unique(np.asarray(s, np.int64)), np.unique(np.asarray(t, np.int64))
            src_seen[us] += 1
            tgt_seen[ut] += 1
            np.add.at(tgt_total, np.asarray(t, np.int64), 1)
            chunk.append((us[:, None] * tgt_vocab + ut[None, :]).ravel())
        merged = np.concatenate([keys, *chunk])
        weights = np.concatenate([counts, np.ones(len(merged) - len(keys), np.int64)])
        keys, inverse = np.unique(merged, return_inverse=True)
        counts = np.bincount(inverse, weights=weights).astype(np.int64)
    s, t = keys // tgt_vocab, keys % tgt_vocab
    dice = 2 * counts / (src_seen[s] + tgt_seen[t])
    order = np.lexsort((-dice, s))  # by source piece, then best first
    s, t = s[order], t[order]
    rank = np.arange(len(s)) - np.searchsorted(s, s)  # the place of each among its source piece's
    table = np.full((src_vocab, per_piece), -1, np.int32)
    keep = rank < per_piece
    table[s[keep], rank[keep]] = t[keep]
    top = np.argsort(-tgt_total, kind="stable")[:frequent]
    return Shortlist(torch.from_numpy(table), torch.from_numpy(top[tgt_total[top] > 0].astype(np.int32)),
                     tokenizer)


def save_shortlist(shortlist: Shortlist, path: Path, about: dict) -> None:
    from ..runfiles import atomic_write_bytes

    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "table": shortlist.table, "frequent": shortlist.frequent,
                "tokenizer": shortlist.tokenizer, **about}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_shortlist(path: Path, tokenizer: dict, model: Path) -> Shortlist:
    """The table ``attnmt shortlist`` wrote at ``path``, checked to be of ``model``'s tokenizer."""
    if not path.exists():
        raise ConfigError(f"--shortlist {path}: no such file (attnmt shortlist RUN writes one)")
    if not path.is_file():  # a pipe would be waited on for ever
        raise ConfigError(f"--shortlist {path}: not a file (attnmt shortlist RUN writes one)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - anything torch.load raises on a file that is not one
        raise ConfigError(f"--shortlist {path}: not a shortlist attnmt wrote ({type(e).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ConfigError(f"--shortlist {path}: not a shortlist attnmt wrote")
    if payload.get("tokenizer") != tokenizer:
        raise ConfigError(f"--shortlist {path}: made for another tokenizer than {model}'s (attnmt shortlist "
                          "on the model's own run folder)")
    return Shortlist(payload["table"], payload["frequent"], tokenizer)
