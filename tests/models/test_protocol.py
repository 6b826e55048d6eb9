"""models/protocol.py: the row layout of decoding states (``sentences_of``) and ``select_rows`` on a state
of per-sentence and per-row fields."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnmt.models.protocol import DecoderState, per_row, per_sentence, select_rows, sentences_of, take_rows


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Toy(DecoderState):
    memory: torch.Tensor = per_sentence()  # (B, 2)
    hidden: list = per_row()  # [(N, 1)]
    pos: int = 0


def toy(beams: int, sentences: int = 3) -> Toy:
    n = beams * sentences
    return Toy(beams=beams, memory=torch.arange(sentences * 2).view(sentences, 2),
               hidden=[torch.arange(n).view(n, 1)], pos=4)


@pytest.mark.parametrize(
    "index, beams, n, expected",
    [([0, 1, 2], 1, 3, (None, 1)),  # the same sentences in order: nothing to move
     ([0, 0, 1, 1, 2, 2], 1, 3, (None, 2)),  # every sentence in K copies: the beams of a beam search
     ([4, 5, 0, 1], 2, 3, ([2, 0], 2)),  # sentences dropped and reordered, blocks kept
     ([1, 0, 3, 2, 5, 4], 2, 3, (None, 2)),  # beams reordered within their sentence
     ([0, 1, 2, 2, 5], 2, 3, ([0, 0, 1, 1, 2], 1)),  # uneven blocks: every row a sentence of its own
     ([], 2, 3, ([], 1))],
)  # fmt: skip
def test_sentences_of(index, beams, n, expected):
    kept, new_beams = sentences_of(torch.tensor(index, dtype=torch.long), beams, n)
    assert (None if kept is None else kept.tolist(), new_beams) == expected


def test_select_rows_moves_rows_and_sentences_and_keeps_the_rest():
    state = toy(beams=2)
    new = select_rows(state, torch.tensor([4, 5, 1, 0]), 3)
    assert new.beams == 2 and new.pos == 4
    assert new.memory.tolist() == [[4, 5], [0, 1]]  # sentences 2 and 0, once each, not once per beam
    assert new.hidden[0].view(-1).tolist() == [4, 5, 1, 0]
    assert state.hidden[0].view(-1).tolist() == list(range(6))  # the old state is unchanged: a value
    same = select_rows(state, torch.tensor([1, 0, 3, 2, 5, 4]), 3)
    assert same.memory is state.memory  # sentences unchanged: not copied at all


def test_select_rows_takes_changes_as_given():
    state = toy(beams=1)
    replaced = [torch.zeros(2, 1)]
    new = select_rows(state, torch.tensor([2, 0]), 3, hidden=replaced, pos=9)
    assert new.hidden is replaced and new.pos == 9 and new.memory.tolist() == [[4, 5], [0, 1]]


def test_take_rows_follows_containers_and_shares_the_rest():
    value = {"a": torch.arange(3), "b": [torch.arange(6).view(3, 2)], "c": 7}
    taken = take_rows(value, torch.tensor([2, 2]))
    assert taken["a"].tolist() == [2, 2] and taken["b"][0].tolist() == [[4, 5], [4, 5]] and taken["c"] == 7


def test_states_compare_by_identity():
    state = toy(beams=1)
    assert state == state and state != toy(beams=1)  # no elementwise tensor comparison
