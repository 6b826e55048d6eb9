"""``collate`` and the token-budget batch sampler: budgets, coverage, determinism, ranks, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnmt.data.batching import TokenBatchSampler, collate, token_batches
from attnmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnmt.errors import DataError

# ------------------------------------------------------------------------------------------ collate

SRC = [[10, 11, 12], [13], [14, 15, 16, 17, 18]]
TGT = [[20, 21], [22, 23, 24, 25], [26]]


def test_collate_shapes_and_lengths():
    batch = collate(SRC, TGT, indices=[7, 3, 9])
    assert batch.src.shape == (3, 6) and batch.tgt_in.shape == batch.tgt_out.shape == (3, 5)
    assert batch.src_lengths.tolist() == [4, 2, 6] and batch.tgt_lengths.tolist() == [3, 5, 2]
    assert batch.indices.tolist() == [7, 3, 9]
    assert batch.size == 3 and batch.n_src_tokens == 12 and batch.n_tgt_tokens == 10
    for t in (batch.src, batch.tgt_in, batch.tgt_out, batch.src_lengths, batch.indices):
        assert t.dtype == torch.long
    assert batch.src_mask.dtype == batch.tgt_mask.dtype == torch.bool


def test_collate_content():
    batch = collate(SRC, TGT)
    for i, (s, t) in enumerate(zip(SRC, TGT)):
        assert batch.src[i].tolist() == s + [EOS_ID] + [PAD_ID] * (6 - len(s) - 1)
        assert batch.tgt_in[i].tolist() == [BOS_ID] + t + [PAD_ID] * (5 - len(t) - 1)
        assert batch.tgt_out[i].tolist() == t + [EOS_ID] + [PAD_ID] * (5 - len(t) - 1)
        assert batch.src_mask[i].tolist() == [True] * (len(s) + 1) + [False] * (6 - len(s) - 1)
        assert batch.tgt_mask[i].tolist() == [True] * (len(t) + 1) + [False] * (5 - len(t) - 1)
    # teacher forcing: the decoder input is the output shifted right by one
    assert torch.equal(batch.tgt_in[:, 1:][batch.tgt_mask[:, 1:]],
                       batch.tgt_out[:, :-1][batch.tgt_mask[:, 1:]])
    assert torch.equal(batch.src_mask, batch.src != PAD_ID)
    assert torch.equal(batch.tgt_mask, batch.tgt_out != PAD_ID)


def test_collate_empty_sentences_still_have_eos():
    batch = collate([[], [5]], [[], [6]])
    assert batch.src.tolist() == [[EOS_ID, PAD_ID], [5, EOS_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, PAD_ID], [BOS_ID, 6]]
    assert batch.tgt_out.tolist() == [[EOS_ID, PAD_ID], [6, EOS_ID]]
    assert batch.src_mask.any(dim=1).all()  # every row has a key to attend to


def test_collate_without_targets():
    batch = collate(SRC)
    assert batch.tgt_in.shape == batch.tgt_out.shape == batch.tgt_mask.shape == (3, 0)
    assert batch.tgt_lengths.tolist() == [0, 0, 0] and batch.n_tgt_tokens == 0
    assert batch.indices.tolist() == [0, 1, 2]


def test_batch_to_keeps_every_field():
    batch = collate(SRC, TGT).to("cpu")
    assert torch.equal(batch.src, collate(SRC, TGT).src) and batch.indices.tolist() == [0, 1, 2]


# ------------------------------------------------------------------------------------------ sampler


def random_lengths(seed: int) -> tuple[np.ndarray, int]:
    """Lengths of a random corpus with a few examples over the budget, and the budget."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(40, 400))
    lengths = rng.integers(3, 60, size=n)
    max_tokens = int(rng.integers(200, 800))
    lengths[rng.choice(n, size=2, replace=False)] = max_tokens + int(rng.integers(1, 50))
    return lengths, max_tokens


SEEDS = [0, 1, 2, 3, 4, 5]


def as_lists(batches) -> list[list[int]]:
    return [b.tolist() for b in batches]


def cost(lengths, batch) -> int:
    return len(batch) * int(max(lengths[i] for i in batch))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shuffle", [True, False])
def test_budget_respected_and_every_example_once(seed, shuffle):
    lengths, max_tokens = random_lengths(seed)
    sampler = TokenBatchSampler(lengths, max_tokens, seed=seed, shuffle=shuffle, bucket_batches=4)
    for epoch in (0, 1):
        batches = as_lists(sampler.batches(epoch))
        assert all(batches)
        assert all(cost(lengths, b) <= max_tokens or len(b) == 1 for b in batches)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(lengths)))


def test_oversized_example_gets_a_batch_of_its_own():
    lengths = np.array([5, 5, 50, 5, 5])
    batches = token_batches(lengths, np.argsort(lengths, kind="stable"), max_tokens=20)
    assert [2] in batches and sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    assert [len(b) for b in batches if b != [2]] == [4]


def test_batches_are_filled_up_to_the_budget():
    lengths = np.full(100, 10)
    batches = as_lists(TokenBatchSampler(lengths, max_tokens=64, shuffle=False).batches(0))
    assert [len(b) for b in batches] == [6] * 16 + [4]


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_same_seed_and_epoch_same_batches(seed):
    lengths, max_tokens = random_lengths(seed)
    first = as_lists(TokenBatchSampler(lengths, max_tokens, seed=seed).batches(3))
    assert as_lists(TokenBatchSampler(lengths, max_tokens, seed=seed).batches(3)) == first
    assert as_lists(TokenBatchSampler(lengths, max_tokens, seed=seed).batches(4)) != first
    assert as_lists(TokenBatchSampler(lengths, max_tokens, seed=seed + 100).batches(3)) != first


def test_shuffled_batches_hold_similar_lengths():
    lengths = np.random.default_rng(0).integers(2, 100, size=2000)
    batches = as_lists(TokenBatchSampler(lengths, max_tokens=1000, seed=1, bucket_batches=50).batches(0))
    padding = sum(cost(lengths, b) - int(lengths[b].sum()) for b in batches)
    assert padding < 0.1 * lengths.sum()  # bucketing by length keeps padding small


def test_unshuffled_batches_do_not_depend_on_the_epoch():
    lengths, max_tokens = random_lengths(0)
    sampler = TokenBatchSampler(lengths, max_tokens, shuffle=False)
    assert as_lists(sampler.batches(0)) == as_lists(sampler.batches(5))
    flat = [i for b in as_lists(sampler.batches(0)) for i in b]
    assert [lengths[i] for i in flat] == sorted(lengths)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("replicas", [2, 3])
def test_ranks_share_an_epoch_without_overlap(seed, replicas):
    lengths, max_tokens = random_lengths(seed)
    samplers = [TokenBatchSampler(lengths, max_tokens, seed=seed, num_replicas=replicas, rank=r)
                for r in range(replicas)]
    for epoch in (0, 1):
        global_batches = as_lists(samplers[0].global_batches(epoch))
        assert len(global_batches) % replicas == 0
        per_rank = [as_lists(s.batches(epoch)) for s in samplers]
        assert len({len(b) for b in per_rank}) == 1  # the same number of steps on every rank
        for r, batches in enumerate(per_rank):
            assert batches == global_batches[r::replicas]
            # every rank computes the same list
            assert as_lists(samplers[r].global_batches(epoch)) == global_batches
        examples = [[i for b in batches for i in b] for batches in per_rank]
        union = [i for ex in examples for i in ex]
        assert sorted(union) == list(range(len(lengths)))  # disjoint, and nothing lost
        assert all(b for batches in per_rank for b in batches)
        assert all(cost(lengths, b) <= max_tokens or len(b) == 1 for b in global_batches)
    assert [len(s) for s in samplers] == [len(samplers[0].batches(0))] * replicas


@pytest.mark.parametrize("replicas, multiple_of", [(1, 4), (2, 3), (3, 2)])
def test_multiple_of_is_respected(replicas, multiple_of):
    for seed in SEEDS[:3]:
        lengths, max_tokens = random_lengths(seed)
        for r in range(replicas):
            sampler = TokenBatchSampler(lengths, max_tokens, seed=seed, num_replicas=replicas, rank=r,
                                        multiple_of=multiple_of)
            assert len(as_lists(sampler.global_batches(0))) % (replicas * multiple_of) == 0
            assert len(as_lists(sampler.batches(0))) % multiple_of == 0
            flat = [i for b in as_lists(sampler.global_batches(0)) for i in b]
            assert sorted(flat) == list(range(len(lengths)))


def test_one_rank_with_accumulation_sees_what_two_ranks_see():
    lengths, max_tokens = random_lengths(7)
    single = as_lists(TokenBatchSampler(lengths, max_tokens, seed=7, multiple_of=2).batches(0))
    ranks = [as_lists(TokenBatchSampler(lengths, max_tokens, seed=7, num_replicas=2, rank=r).batches(0))
             for r in (0, 1)]
    assert single[0::2] == ranks[0] and single[1::2] == ranks[1]


@pytest.mark.parametrize("replicas, rank", [(1, 0), (3, 2)])
def test_resume_from_any_batch(replicas, rank):
    lengths, max_tokens = random_lengths(11)
    sampler = TokenBatchSampler(lengths, max_tokens, seed=11, num_replicas=replicas, rank=rank)
    for epoch in (0, 2):
        batches = as_lists(sampler.batches(epoch))
        for k in range(len(batches) + 1):
            resumed = TokenBatchSampler(lengths, max_tokens, seed=11, num_replicas=replicas, rank=rank)
            assert as_lists(resumed.iter_from(epoch, k)) == batches[k:]
    assert as_lists(sampler.iter_from(0)) == as_lists(sampler.batches(0))


@pytest.mark.parametrize("n, replicas, multiple_of", [(0, 1, 1), (2, 3, 1), (3, 2, 2), (5, 1, 8)])
def test_too_few_examples_for_the_ranks(n, replicas, multiple_of):
    with pytest.raises(DataError, match=rf"epoch has 0 steps: {n} examples cannot fill "
                                        rf"{replicas} rank\(s\) x {multiple_of}"):
        TokenBatchSampler([5] * n, 100, num_replicas=replicas, multiple_of=multiple_of)


def test_just_enough_examples_for_the_ranks():
    samplers = [TokenBatchSampler([5, 6, 7], 100, num_replicas=3, rank=r) for r in range(3)]
    assert sorted(i for s in samplers for b in as_lists(s.batches(0)) for i in b) == [0, 1, 2]
    assert [len(s) for s in samplers] == [1, 1, 1]


def test_rank_out_of_range():
    with pytest.raises(ValueError, match=r"rank 2 is not in \[0, 2\)"):
        TokenBatchSampler([5] * 10, 100, num_replicas=2, rank=2)


def test_no_empty_batch_when_no_batch_can_be_split():
    # Two examples never fit together (2 * 6 > 10), so there are 3 one-example batches for 2 ranks:
    # two of them are merged (over budget) rather than one split into an empty batch.
    sampler = TokenBatchSampler([6, 6, 6], max_tokens=10, num_replicas=2)
    batches = as_lists(sampler.global_batches(0))
    assert all(batches) and len(batches) % 2 == 0
    assert sorted(i for b in batches for i in b) == [0, 1, 2]
