"""Greedy and beam search against oracles: exhaustive search over every sequence of a tiny vocabulary,
greedy search, a hand-made distribution, the full teacher-forced forward recomputed at every step, and
the same sentences decoded alone, in a batch and in another order.

Letters: B batch, S source length, V vocabulary.
"""

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from attnmt.config.schema import LSTMConfig, TransformerConfig
from attnmt.data.batching import collate
from attnmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnmt.decoding.search import beam_search, gnmt_penalty, greedy_search, max_output_lengths
from attnmt.models import build_model, take_rows

V = 10
CONFIGS = {
    "transformer": TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1, dec_layers=1,
                                     d_ff=32, dropout=0.0),
    "lstm": LSTMConfig(arch="lstm", emb_dim=8, hidden_size=8, enc_layers=1, dec_layers=1, attn_dim=8,
                       dropout=0.0),
}
every_model = pytest.mark.parametrize("name", list(CONFIGS))


def make_model(name, vocab=V, seed=0):
    """A random float64 model with weights large enough that its distributions are far from uniform."""
    torch.manual_seed(seed)
    model = build_model(CONFIGS[name], vocab, vocab, PAD_ID).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.6)
    return model


def sentences(lengths, seed, vocab=V):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (n,), generator=generator).tolist() for n in lengths]


class Biased:
    """A model whose logits get a fixed (V,) bias: favour or forbid EOS, or shrink the space."""

    def __init__(self, model, bias):
        self.model, self.bias = model, bias

    def encode(self, src, src_mask):
        return self.model.encode(src, src_mask)

    def step(self, tokens, state, need_attention=False):
        logits, state, attn = self.model.step(tokens, state, need_attention)
        return logits + self.bias, state, attn

    def select(self, state, index, inplace=False):
        return self.model.select(state, index, inplace)


class Uncached:
    """The Transformer without its cache: every step runs the full teacher-forced forward of the prefix."""

    def __init__(self, model):
        self.model = model

    def encode(self, src, src_mask):
        return {"src": src, "src_mask": src_mask, "prefix": src.new_zeros(src.size(0), 0)}

    def step(self, tokens, state, need_attention=False):
        prefix = torch.cat([state["prefix"], tokens[:, None]], dim=1)  # (B, t + 1)
        out = self.model(SimpleNamespace(src=state["src"], src_mask=state["src_mask"], tgt_in=prefix),
                         need_attention)
        attn = out.attention["cross"][-1][:, :, -1].mean(1) if need_attention else None  # (B, S)
        return out.logits[:, -1], {**state, "prefix": prefix}, attn

    def select(self, state, index, inplace=False):
        return take_rows(state, index)


class Table:
    """A fake model: the next-piece distribution is a hand-made row chosen by the position alone."""

    def __init__(self, rows):
        self.logits = torch.tensor(rows, dtype=torch.float64).log()  # (T, V)

    def encode(self, src, src_mask):
        return {"pos": src.new_zeros(src.size(0)), "src_mask": src_mask}

    def step(self, tokens, state, need_attention=False):
        pos = state["pos"]
        mask = state["src_mask"].double()
        attn = mask / mask.sum(1, keepdim=True) if need_attention else None
        return self.logits[pos.clamp(max=len(self.logits) - 1)], {**state, "pos": pos + 1}, attn

    def select(self, state, index, inplace=False):
        return take_rows(state, index)


def exhaustive(model, src, src_mask, vocab, limit, alpha, nbest, min_len=0):
    """The nbest of every hypothesis of one sentence (src (1, S)): each prefix of min_len .. limit
    non-EOS pieces followed by EOS, scored by the model's log-probabilities, ranked by score / lp."""
    others = [v for v in range(vocab) if v != EOS_ID]
    seqs = [list(p) for n in range(min_len, limit + 1) for p in itertools.product(others, repeat=n)]
    N = len(seqs)
    lengths = torch.tensor([len(p) for p in seqs])  # (N,)
    targets = torch.tensor([p + [EOS_ID] * (limit + 1 - len(p)) for p in seqs])  # (N, limit + 1)
    state = model.select(model.encode(src, src_mask), torch.zeros(N, dtype=torch.long))
    tokens, total = torch.full((N,), BOS_ID), torch.zeros(N, dtype=torch.float64)
    with torch.no_grad():
        for t in range(limit + 1):
            logits, state, _ = model.step(tokens, state)
            logp = torch.log_softmax(logits.double(), -1).gather(1, targets[:, t : t + 1])[:, 0]  # (N,)
            total += torch.where(t <= lengths, logp, 0.0)
            tokens = targets[:, t]
    normalized = [float(total[i]) / gnmt_penalty(len(seqs[i]) + 1, alpha) for i in range(N)]
    best = sorted(range(N), key=lambda i: -normalized[i])[:nbest]
    return [(seqs[i], float(total[i])) for i in best]


def assert_same(actual, expected, atol=1e-9):
    """Two n-best lists (of Hypothesis or (tokens, score)): the same tokens, scores within atol."""
    pairs = lambda hyps: [(h.tokens, h.score) if hasattr(h, "tokens") else h for h in hyps]  # noqa: E731
    actual, expected = pairs(actual), pairs(expected)
    assert [t for t, _ in actual] == [t for t, _ in expected]
    assert [s for _, s in actual] == pytest.approx([s for _, s in expected], abs=atol, rel=0)


# ----------------------------------------------------------------- oracles


@every_model
@pytest.mark.parametrize("min_len", [0, 2])
def test_beam_of_one_is_greedy(name, min_len):
    model = Biased(make_model(name), torch.tensor([0.0] * EOS_ID + [2.0] + [0.0] * (V - EOS_ID - 1)))
    batch = collate(sentences([3, 1, 6, 4, 2, 5], seed=1))
    kw = dict(max_len_a=1.0, max_len_b=2, min_len=min_len, need_attention=True)
    greedy = greedy_search(model, batch.src, batch.src_mask, **kw)
    beam = beam_search(model, batch.src, batch.src_mask, beam_size=1, length_penalty=0.0, **kw)
    assert {len(g.tokens) for g in greedy} != {len(g.tokens) for g in greedy[:1]}  # some end early, some late
    for g, (b,) in zip(greedy, beam):
        assert b.tokens == g.tokens and b.score == g.score  # bit for bit: the same fp adds
        torch.testing.assert_close(b.attention, g.attention, atol=0, rtol=0)


def likely_three(name: str, vocab: int):
    """A random model whose logits favour EOS, 4 and 5 (the other pieces at e^-30), its oracle (the
    Transformer without its cache) and a batch of two sentences."""
    bias = torch.full((vocab,), -30.0, dtype=torch.float64)
    bias[[EOS_ID, 4, 5]] = 0
    base = make_model(name, vocab=vocab)
    oracle = Biased(Uncached(base) if name == "transformer" else base, bias)
    return Biased(base, bias), oracle, collate(sentences([4, 2], seed=3, vocab=vocab))


@every_model
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_full_width_beam_equals_exhaustive_search(name, alpha):
    """12 pieces, beam 12, 3 pieces at most. The bias leaves EOS and two pieces likely and the other
    nine at e^-30, so the 3 * 2^t likely candidates of step t < 3 all fit in the beam and the search
    covers every hypothesis that can rank; the oracle still enumerates all 1 + 11 + 11^2 + 11^3."""
    vocab = 12
    model, oracle, batch = likely_three(name, vocab)
    results = beam_search(model, batch.src, batch.src_mask, beam_size=vocab, nbest=vocab,
                          length_penalty=alpha, max_len_a=0, max_len_b=3)
    for i, hyps in enumerate(results):
        expected = exhaustive(oracle, batch.src[i : i + 1], batch.src_mask[i : i + 1], vocab, 3, alpha, vocab)
        assert_same(hyps, expected)
        assert len({len(h.tokens) for h in hyps}) > 1  # the ranking mixes lengths


# PAD UNK BOS EOS a b, by position: stop at once (0.6) or "a" (0.39); then "a" almost surely (0.98),
# twice; then EOS (the limit of 3 pieces forces it anyway).
TABLE = [
    [1e-6, 1e-6, 1e-6, 0.6, 0.39, 0.01 - 3e-6],
    [1e-6, 1e-6, 1e-6, 0.01, 0.98, 0.01 - 3e-6],
    [1e-6, 1e-6, 1e-6, 0.01, 0.98, 0.01 - 3e-6],
    [1e-6, 1e-6, 1e-6, 0.98, 0.01, 0.01 - 3e-6],
]


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
def test_hand_made_distribution_and_the_stopping_bound(alpha):
    """With alpha = 2, "a a a EOS" (log 0.367 / (9/6)^2 = -0.45) beats the first finished "EOS" (log 0.6 =
    -0.51). Right after that EOS the live "a" (log 0.39 = -0.94) divided by the penalty of the
    shortest length it can finish with, 2, gives -0.69: a bound that looked only one step ahead, or a
    search that stopped at beam_size finished hypotheses, would return "EOS"."""
    model = Table(TABLE)
    batch = collate([[4, 5]])
    kw = dict(max_len_a=0, max_len_b=3)
    for beam_size in (1, 2, 6):
        (hyps,) = beam_search(model, batch.src, batch.src_mask, beam_size=beam_size, nbest=1,
                              length_penalty=alpha, **kw)
        assert_same(hyps, exhaustive(model, batch.src, batch.src_mask, 6, 3, alpha, 1), atol=1e-12)
    assert hyps[0].tokens == ([4, 4, 4] if alpha == 2.0 else [])
    if alpha == 0.0:
        assert greedy_search(model, batch.src, batch.src_mask, **kw)[0].tokens == []


def test_cached_search_equals_uncached_search():
    model = make_model("transformer")
    batch = collate(sentences([5, 2, 7], seed=4))
    kw = dict(beam_size=3, nbest=3, length_penalty=0.6, max_len_a=1.0, max_len_b=3, need_attention=True)
    cached = beam_search(model, batch.src, batch.src_mask, **kw)
    uncached = beam_search(Uncached(model), batch.src, batch.src_mask, **kw)
    for c, u in zip(cached, uncached):
        assert_same(c, u)
        for hc, hu in zip(c, u):
            torch.testing.assert_close(hc.attention, hu.attention, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name, eos_bias", [("transformer", 0.0), ("lstm", 0.0)])
def test_batch_size_and_order_change_nothing(name, eos_bias):
    """64 sentences of 1-12 pieces, some stopping early and leaving the batch, some at their limit."""
    model = Biased(make_model(name), torch.tensor([0.0] * EOS_ID + [eos_bias] + [0.0] * (V - EOS_ID - 1)))
    src = sentences(torch.randint(1, 13, (64,), generator=torch.Generator().manual_seed(5)).tolist(), seed=6)
    kw = dict(beam_size=4, nbest=2, length_penalty=0.6, max_len_a=1.0, max_len_b=2, need_attention=True)
    batch = collate(src)
    together = beam_search(model, batch.src, batch.src_mask, **kw)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(7)).tolist()
    shuffled = collate([src[i] for i in order])
    reordered = dict(zip(order, beam_search(model, shuffled.src, shuffled.src_mask, **kw)))
    for i, s in enumerate(src):
        one = collate([s])
        (alone,) = beam_search(model, one.src, one.src_mask, **kw)
        n = len(s) + 1  # real source positions, EOS included
        for other in (together[i], reordered[i]):
            assert_same(other, alone)
            for h, a in zip(other, alone):
                torch.testing.assert_close(h.attention[:, :n], a.attention, atol=1e-10, rtol=0)
                assert not h.attention[:, n:].any()
    at_limit = [len(h[0].tokens) == n
                for h, n in zip(together, max_output_lengths(batch.src_mask, 1.0, 2).tolist())]
    assert 10 < sum(at_limit) < 54


# ----------------------------------------------------------------- contracts


def test_nbest_sorted_distinct_and_topped_by_the_1_best():
    model = make_model("transformer")
    batch = collate(sentences([3, 6, 1], seed=8))
    kw = dict(beam_size=5, length_penalty=0.6, max_len_a=1.0, max_len_b=3)
    one = beam_search(model, batch.src, batch.src_mask, nbest=1, **kw)
    many = beam_search(model, batch.src, batch.src_mask, nbest=5, **kw)
    for (best,), hyps in zip(one, many):
        assert len(hyps) == 5
        assert (hyps[0].tokens, hyps[0].score) == (best.tokens, best.score)
        normalized = [h.score / gnmt_penalty(len(h.tokens) + 1, 0.6) for h in hyps]
        assert normalized == sorted(normalized, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5
        assert all(EOS_ID not in h.tokens for h in hyps)


@every_model
def test_min_len_and_forced_eos_at_the_limit(name):
    batch = collate(sentences([1, 4, 7], seed=9))
    limits = max_output_lengths(batch.src_mask, 0.5, 2).tolist()  # [2, 4, 5]
    eager = Biased(make_model(name), torch.tensor([0.0] * EOS_ID + [8.0] + [0.0] * (V - EOS_ID - 1)))
    for hyps in beam_search(eager, batch.src, batch.src_mask, beam_size=3, nbest=3, max_len_a=0.5,
                            max_len_b=2):
        assert min(len(h.tokens) for h in hyps) == 0  # without min_len it would stop at once
    for hyps in beam_search(eager, batch.src, batch.src_mask, beam_size=3, nbest=3, max_len_a=0.5,
                            max_len_b=2, min_len=2):
        assert min(len(h.tokens) for h in hyps) == 2
    never = Biased(make_model(name), torch.tensor([0.0] * EOS_ID + [-50.0] + [0.0] * (V - EOS_ID - 1)))
    results = beam_search(never, batch.src, batch.src_mask, beam_size=3, nbest=3, max_len_a=0.5, max_len_b=2)
    assert [{len(h.tokens) for h in hyps} for hyps in results] == [{n} for n in limits]
    assert all(-100 < h.score < -50 for hyps in results for h in hyps)  # the forced EOS's real log-prob


def test_the_limit_wins_over_min_len():
    """min_len beyond the limit: EOS is still forced there, scored by its real log-probability."""
    batch = collate([[4, 5]])
    for hyp in (
        greedy_search(Table(TABLE), batch.src, batch.src_mask, max_len_a=0, max_len_b=1, min_len=3)[0],
        beam_search(Table(TABLE), batch.src, batch.src_mask, beam_size=2, max_len_a=0, max_len_b=1,
                    min_len=3)[0][0],
    ):
        assert hyp.tokens == [4] and hyp.score == pytest.approx(math.log(0.39 * 0.01))


def test_fewer_hypotheses_only_when_fewer_exist():
    """One piece, and it must be there: the V - 3 pieces other than EOS, PAD and BOS (never output)
    are all the hypotheses there are."""
    model = make_model("lstm")
    batch = collate([[4, 5]])
    (hyps,) = beam_search(model, batch.src, batch.src_mask, beam_size=V, nbest=V, max_len_a=0, max_len_b=1,
                          min_len=1)
    assert sorted(h.tokens[0] for h in hyps) == [v for v in range(V) if v not in (EOS_ID, PAD_ID, BOS_ID)]


def test_attention_rows():
    model = make_model("transformer")
    src = sentences([2, 6], seed=10)
    batch = collate(src)
    for hyps, s in zip(beam_search(model, batch.src, batch.src_mask, beam_size=3, nbest=3,
                                   need_attention=True), src):
        for h in hyps:
            assert h.attention.shape == (len(h.tokens) + 1, batch.src.size(1))
            torch.testing.assert_close(h.attention[:, : len(s) + 1].sum(1),
                                       torch.ones(len(h.tokens) + 1, dtype=torch.float64))
            assert not h.attention[:, len(s) + 1 :].any()


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(beam_size=0), "beam_size must be at least 1"),
        (dict(beam_size=V + 1), r"beam_size \(11\) must not exceed the vocabulary size \(10\)"),
        (dict(beam_size=2, nbest=0), "nbest must be between 1 and beam_size"),
        (dict(beam_size=2, nbest=3), r"nbest must be between 1 and beam_size \(2\), got 3"),
        (dict(length_penalty=-0.5), r"length_penalty must be a number in \[0, 10\]"),
        (dict(length_penalty=math.nan), r"length_penalty must be a number in \[0, 10\]"),
        (dict(length_penalty=11.0), r"length_penalty must be a number in \[0, 10\]"),
    ],
)
def test_bad_arguments(kw, message):
    model = make_model("transformer")
    batch = collate([[4, 5]])
    with pytest.raises(ValueError, match=message):
        beam_search(model, batch.src, batch.src_mask, **kw)


def test_empty_batch():
    batch = collate([])
    assert beam_search(make_model("lstm"), batch.src, batch.src_mask) == []
    assert greedy_search(make_model("lstm"), batch.src, batch.src_mask) == []


def test_fp32_scores_are_fp32_sums():
    """An fp32 model keeps its beam scores in fp32 and finite, banned tokens included."""
    torch.manual_seed(0)
    model = build_model(CONFIGS["transformer"], V, V, PAD_ID).eval()
    batch = collate(sentences([3, 5], seed=11))
    for hyps in beam_search(model, batch.src, batch.src_mask, beam_size=4, nbest=4, min_len=2):
        assert all(math.isfinite(h.score) and float(torch.tensor(h.score, dtype=torch.float32)) == h.score
                   for h in hyps)


# ------------------------------------------------------------------------------------------- sampling


@torch.no_grad()
def _exact_first_piece(model, src, src_mask, temperature, top_k, top_p):
    """The oracle: the distribution of the first piece, written out separately from decode.py: the
    model's probabilities with PAD and BOS never output, tempered, cut to the top k, then to the smallest
    set reaching top_p (ties kept in index order), renormalised."""
    state = model.encode(src, src_mask)
    logits, _, _ = model.step(torch.full((1,), BOS_ID), state)
    logp = torch.log_softmax(logits[0].double(), -1)
    logp[PAD_ID] = logp[BOS_ID] = -math.inf
    p = torch.softmax(logp / temperature, -1).tolist()
    ranked = sorted(range(len(p)), key=lambda v: (-p[v], v))
    keep = ranked[:top_k] if top_k else ranked
    kept, mass = [], 0.0
    total = sum(p[v] for v in keep)
    for v in keep:
        kept.append(v)
        mass += p[v] / total
        if mass >= top_p:
            break
    z = sum(p[v] for v in kept)
    return {v: p[v] / z for v in kept}


@every_model
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.5, 4, 1.0),
                                                       (1.0, 0, 0.8), (2.0, 5, 0.9)])
def test_sampling_draws_from_the_exact_distribution(name, temperature, top_k, top_p):
    """A goodness-of-fit check: 20,000 one-piece outputs (the limit forces EOS after one piece) drawn by
    the search, against the exact distribution: no piece outside its support, and Pearson's chi-square
    below df + 6 sqrt(2 df) (a chance of failing far below one in a million for a correct sampler)."""
    from attnmt.decoding.search import Sampling

    model = make_model(name)
    (src,) = sentences([5], seed=3)
    n = 20_000
    batch = collate([src] * n)
    exact = _exact_first_piece(model, batch.src[:1], batch.src_mask[:1], temperature, top_k, top_p)
    generator = torch.Generator().manual_seed(11)
    found = greedy_search(model, batch.src, batch.src_mask, max_len_a=0.0, max_len_b=1,
                          sampling=Sampling(temperature, top_k, top_p), generator=generator)
    counts: dict[int, int] = {}
    for h in found:
        piece = h.tokens[0] if h.tokens else EOS_ID
        counts[piece] = counts.get(piece, 0) + 1
    assert set(counts) <= set(exact)
    chi2 = sum((counts.get(v, 0) - n * q) ** 2 / (n * q) for v, q in exact.items())
    df = max(len(exact) - 1, 1)
    assert chi2 < df + 6 * math.sqrt(2 * df), (chi2, df, exact, counts)
    # Scores are the model's own log-probabilities of the pieces drawn (EOS included), not the tempered ones.
    torch.set_grad_enabled(False)
    state = model.encode(batch.src[:1], batch.src_mask[:1])
    logits, state, _ = model.step(torch.full((1,), BOS_ID), state)
    first = torch.log_softmax(logits[0].double(), -1)
    h = next(h for h in found if h.tokens)
    second, _, _ = model.step(torch.tensor([h.tokens[0]]), state)
    eos = torch.log_softmax(second[0].double(), -1)[EOS_ID]
    torch.set_grad_enabled(True)
    assert h.score == pytest.approx(float(first[h.tokens[0]] + eos))


def test_sampling_repeats_with_its_seed():
    from attnmt.decoding.search import Sampling

    model = make_model("transformer")
    batch = collate(sentences([4, 6, 3], seed=5) * 20)

    def draw(seed):
        generator = torch.Generator().manual_seed(seed)
        found = greedy_search(model, batch.src, batch.src_mask, sampling=Sampling(1.0), generator=generator)
        return [h.tokens for h in found]

    assert draw(1) == draw(1) and draw(1) != draw(2)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=0.0)


# ------------------------------------------------------------------------------------------- ensembles


@every_model
def test_an_ensemble_of_a_model_with_itself_is_the_model(name):
    from attnmt.models import Ensemble

    model = make_model(name)
    ensemble = Ensemble([model, model]).eval()
    batch = collate(sentences([5, 3, 7], seed=2))
    def flat(found):
        return [h for x in found for h in (x if isinstance(x, list) else [x])]

    for search in (lambda m: greedy_search(m, batch.src, batch.src_mask),
                   lambda m: beam_search(m, batch.src, batch.src_mask, beam_size=4, nbest=3)):
        alone, together = search(model), search(ensemble)
        assert [h.tokens for h in flat(alone)] == [h.tokens for h in flat(together)]
        assert [h.score for h in flat(together)] == pytest.approx([h.score for h in flat(alone)], abs=1e-9)


def test_a_two_model_ensemble_steps_with_the_average_of_their_log_probabilities():
    from attnmt.models import Ensemble

    first, second = make_model("transformer", seed=0), make_model("lstm", seed=1)
    ensemble = Ensemble([first, second]).eval()
    batch = collate(sentences([4, 6], seed=4))
    states = [m.encode(batch.src, batch.src_mask) for m in (first, second)]
    state = ensemble.encode(batch.src, batch.src_mask)
    tokens = torch.full((2,), BOS_ID)
    for step_tokens in ([5, 6], [7, 4], [EOS_ID, 8]):
        logits, state, _ = ensemble.step(tokens, state)
        by_hand = []
        for k, m in enumerate((first, second)):
            member_logits, states[k], _ = m.step(tokens, states[k])
            by_hand.append(torch.log_softmax(member_logits, -1))
        torch.testing.assert_close(logits, (by_hand[0] + by_hand[1]) / 2)
        tokens = torch.tensor(step_tokens)
    # The searches renormalise it: greedy picks the argmax of the average.
    found = greedy_search(ensemble, batch.src, batch.src_mask, max_len_a=0.0, max_len_b=1)
    s0 = [m.encode(batch.src, batch.src_mask) for m in (first, second)]
    bos = torch.full((2,), BOS_ID)
    avg = sum(torch.log_softmax(m.step(bos, s)[0], -1) for m, s in zip((first, second), s0))
    avg[:, PAD_ID] = avg[:, BOS_ID] = -math.inf
    assert [h.tokens[:1] or [EOS_ID] for h in found] == [[int(t)] for t in avg.argmax(-1)]
