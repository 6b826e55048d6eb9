"""An ensemble of trained models behind the one model protocol, so greedy and beam search decode it
unchanged: at each step every member steps with its own state (its own key/value cache), and the
members' log-probabilities are averaged (``translate --ensemble``, ``eval --ensemble``).

The average of log-probabilities is returned as the step's logits; the searches' log-softmax then
renormalises it (a geometric mean of the members' distributions), which leaves a model ensembled with
itself exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .protocol import DecoderState, ModelOutput


@dataclass(frozen=True, kw_only=True, eq=False)
class EnsembleState(DecoderState):
    members: tuple  # one decoding state per member, in order


class Ensemble(nn.Module):
    """Members with the same vocabularies (one tokenizer), averaged step by step."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        self.members = nn.ModuleList(members)

    @staticmethod
    def _mean_log_probs(logits: Sequence[torch.Tensor]) -> torch.Tensor:
        dtype = torch.promote_types(logits[0].dtype, torch.float32)
        return torch.stack([F.log_softmax(x.to(dtype), dim=-1) for x in logits]).mean(0)

    def forward(self, batch, need_attention: bool = False, align_layer: int | None = None,
                full_context: bool = False) -> ModelOutput:
        """Teacher forcing: the members' mean log-probabilities (B, T, V) as logits; attention is the first
        member's (each member has its own layers)."""
        outs = [m(batch, need_attention, full_context=full_context and k == 0)
                for k, m in enumerate(self.members)]
        return ModelOutput(self._mean_log_probs([o.logits for o in outs]), outs[0].attention)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> EnsembleState:
        return EnsembleState(members=tuple(m.encode(src, src_mask) for m in self.members))

    def step(self, tokens: torch.Tensor, state: EnsembleState, need_attention: bool = False):
        """(logits (N, V): the mean of the members' log-probabilities, the new state, the mean of the
        members' head-averaged cross-attention (N, S) or None)."""
        outs = [m.step(tokens, s, need_attention) for m, s in zip(self.members, state.members)]
        attention = torch.stack([o[2] for o in outs]).mean(0) if need_attention else None
        new_state = EnsembleState(members=tuple(o[1] for o in outs))
        return self._mean_log_probs([o[0] for o in outs]), new_state, attention

    def select(self, state: EnsembleState, index: torch.Tensor, inplace: bool = False) -> EnsembleState:
        pairs = zip(self.members, state.members)
        return EnsembleState(members=tuple(m.select(s, index, inplace) for m, s in pairs))
