"""Every head of a trained Transformer explained (``attnmt heads``): what it attends to
(``head_patterns.py``, from its maps under teacher forcing) and how much the model needs it (Michel et al.
2019, "Are Sixteen Heads Really Better than One?").

Letters: B batch, T target length, S source length, D d_model, H heads, dh = D / H.

A head is (kind, layer, head): ``enc_self``, ``dec_self`` or ``cross``, 0-based here (1-based in what the
command shows). Masking a head: its d_head-wide slice of the input of its ``MultiHeadAttention.out_proj``
(the heads' contexts concatenated in order, ``MultiHeadAttention._split_heads``) is multiplied by 0, by a
forward pre-hook on ``out_proj`` that ``masked_heads`` installs and removes; the model itself is never
changed, so the decoders, the fast path and every kernel run as they are.

Importance, measured on the same pairs (teacher forcing on the given targets, else on the model's own
translations):

- delta loss: the mean negative log-likelihood per target token (EOS included, no label smoothing) with
  the head alone masked, minus the unmasked one; the heads are ranked by it;
- delta BLEU: the corpus BLEU of the translations with the head alone masked, minus the unmasked one,
  against the given targets, or without them against the unmasked model's own translations (whose own
  BLEU is then 100 by construction);
- pruning: the BLEU (and loss) with the least important fraction f of all heads masked together, n =
  round(f x heads), halves up; and, for comparison, the mean of ``random_draws`` draws of the same share of
  heads taken at random (numpy's ``default_rng(seed)``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..data.batching import collate, token_batches
from ..data.readers import clean
from ..data.tokenizer import BOS_ID, EOS_ID
from ..decoding.metrics import corpus_scores
from ..decoding.translator import Translator
from ..errors import ConfigError, DataError
from ..models.attention import MultiHeadAttention
from ..models.loss import label_smoothed_nll
from ..models.transformer import TransformerModel
from .attention_maps import teacher_forced_attention
from .head_patterns import KINDS, PATTERNS, HeadScores, Tally, is_delimiter
from .heads_page import Sample

HeadId = tuple[str, int, int]
"""(kind, layer, head), 0-based."""

Advance = Callable[[int], None]


# ------------------------------------------------------------------------------------------ masking


def attention_modules(model) -> dict[tuple[str, int], MultiHeadAttention]:
    """(kind, layer) -> the layer's ``MultiHeadAttention`` of that kind; a ConfigError for anything but a
    Transformer (an LSTM's one attention is the whole of its cross-attention: masking it is no head's
    importance)."""
    if not isinstance(model, TransformerModel):
        arch = getattr(getattr(model, "cfg", None), "arch", type(model).__name__)
        raise ConfigError(f"heads needs a Transformer model (this one is {arch})")
    modules = {("enc_self", k): layer.self_attn for k, layer in enumerate(model.encoder)}
    for k, layer in enumerate(model.decoder):
        modules[("dec_self", k)] = layer.self_attn
        modules[("cross", k)] = layer.cross_attn
    return modules


def head_ids(model) -> list[HeadId]:
    """Every head of ``model``: encoder self, decoder self, then cross-attention; by layer, then head."""
    modules = attention_modules(model)
    return [(kind, layer, h) for kind in KINDS for (k, layer), module in modules.items() if k == kind
            for h in range(module.n_heads)]


def _zero_slices(keep: torch.Tensor):
    def hook(module, args):
        return (args[0] * keep.to(args[0].dtype),) + tuple(args[1:])  # (..., D) times (D,)

    return hook


@contextlib.contextmanager
def masked_heads(model, heads: Iterable[HeadId]) -> Iterator[None]:
    """Inside: each of ``heads`` contributes nothing (its slice of the input of ``out_proj`` times 0)."""
    modules = attention_modules(model)
    chosen: dict[tuple[str, int], set[int]] = {}
    for kind, layer, head in heads:
        module = modules.get((kind, layer))
        if module is None or not 0 <= head < module.n_heads:
            raise ValueError(f"no head {kind} layer {layer} head {head} in this model")
        chosen.setdefault((kind, layer), set()).add(head)
    handles = []
    try:
        for where, numbers in chosen.items():
            module = modules[where]
            keep = torch.ones(module.d_model, device=module.out_proj.weight.device)  # (D,)
            for h in numbers:
                keep[h * module.d_head:(h + 1) * module.d_head] = 0.0
            handles.append(module.out_proj.register_forward_pre_hook(_zero_slices(keep)))
        yield
    finally:
        for handle in handles:
            handle.remove()


# ------------------------------------------------------------------------------------------ the pairs


@dataclass
class Pairs:
    """Sentence pairs as the model reads them: source ids (cut as ``Translator.encode`` cuts them), target
    ids, the reference texts BLEU is computed against, and each pair's input line (0-based); ``own``: the
    targets are the model's own translations."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    references: list[str]
    lines: list[int]
    own: bool

    def __len__(self) -> int:
        return len(self.src_ids)


def model_pairs(translator: Translator, sources: Sequence[str], targets: Sequence[str] | None) -> Pairs:
    """The pairs of every non-empty source line; without ``targets``, the model's own translations (its
    decode settings) stand in for them. A DataError when no source line has text."""
    encoded = translator.encode(sources)
    if not encoded.ids:
        raise DataError("no sentences: every source line is empty")
    if targets is not None:
        references = [targets[i] for i in encoded.lines]
        tgt_ids = translator.tokenizer.encode_tgt([clean(t) for t in references])
        return Pairs(encoded.ids, tgt_ids, references, encoded.lines, own=False)
    tgt_ids = [found[0].tokens for found in translator.search(encoded.ids)]
    references = translator.tokenizer.decode_tgt(tgt_ids)
    return Pairs(encoded.ids, tgt_ids, references, encoded.lines, own=True)


class Judge:
    """The loss and the BLEU of a model on ``pairs``, with whatever heads are masked at the time."""

    def __init__(self, translator: Translator, pairs: Pairs, tgt_lang: str | None) -> None:
        self.translator, self.pairs, self.tgt_lang = translator, pairs, tgt_lang
        lengths = [max(len(s), len(t)) + 1 for s, t in zip(pairs.src_ids, pairs.tgt_ids)]
        order = sorted(range(len(pairs)), key=lambda i: lengths[i])
        self.batches = [collate([pairs.src_ids[i] for i in chunk], [pairs.tgt_ids[i] for i in chunk])
                        .to(translator.device)
                        for chunk in token_batches(lengths, order, translator.decode.max_tokens)]
        self.tokens = sum(int(b.tgt_lengths.sum()) for b in self.batches)

    @torch.no_grad()
    def loss(self) -> float:
        """Negative log-likelihood per target token, under teacher forcing."""
        model = self.translator.model
        if model.training:  # eval() again would drop the fast path's packed weights
            model.eval()
        total = 0.0
        for batch in self.batches:
            logits = model(batch).logits  # (B, T, V)
            total += float(label_smoothed_nll(logits, batch.tgt_out, self.translator.tokenizer.pad_id).nll)
        return total / max(self.tokens, 1)

    def bleu(self) -> float:
        """Corpus BLEU of the model's translations against the references."""
        found = self.translator.search(self.pairs.src_ids)
        texts = self.translator.tokenizer.decode_tgt([hyps[0].tokens for hyps in found])
        return self.score(texts)

    def score(self, texts: Sequence[str]) -> float:
        return corpus_scores(texts, [self.pairs.references], ("bleu",), self.tgt_lang)["bleu"].score


# ------------------------------------------------------------------------------------------ patterns


def _delimiter_table(pieces: Callable[[list[int]], list[str]], size: int) -> np.ndarray:
    """(V,) True where a vocabulary id is BOS, EOS or punctuation (``head_patterns.is_delimiter``)."""
    table = np.array([is_delimiter(p) for p in pieces(list(range(size)))], dtype=bool)
    table[[BOS_ID, EOS_ID]] = True
    return table


def measure_patterns(translator: Translator, pairs: Pairs, sample: int | None = None,
                     advance: Advance | None = None, chunk: int = 256) -> tuple[dict[HeadId, HeadScores],
                                                                                Sample | None]:
    """Every head's scores over ``pairs`` under teacher forcing, and the maps of pair ``sample`` (an index
    into ``pairs``), ``chunk`` pairs' maps in memory at a time."""
    tokenizer = translator.tokenizer
    src_table = _delimiter_table(tokenizer.src_pieces, tokenizer.src_vocab_size)
    tgt_table = _delimiter_table(tokenizer.tgt_pieces, tokenizer.tgt_vocab_size)
    tallies: dict[tuple[str, int], Tally] = {}
    kept = None
    for start in range(0, len(pairs), chunk):
        src_ids, tgt_ids = pairs.src_ids[start:start + chunk], pairs.tgt_ids[start:start + chunk]
        maps = teacher_forced_attention(translator.model, src_ids, tgt_ids, translator.device,
                                        translator.decode.max_tokens, KINDS)
        for k, (src, tgt, found) in enumerate(zip(src_ids, tgt_ids, maps)):
            keys = {"enc_self": src_table[src + [EOS_ID]], "cross": src_table[src + [EOS_ID]],
                    "dec_self": tgt_table[[BOS_ID] + tgt]}
            for kind, layers in found.items():
                for layer, weights in enumerate(layers):  # (H, rows, cols)
                    tally = tallies.setdefault((kind, layer), Tally(weights.shape[0]))
                    tally.add(weights, kind, keys[kind])
            if sample == start + k:
                kept = found
        if advance is not None:
            advance(len(src_ids))
    scores = {(kind, layer, h): s for (kind, layer), tally in tallies.items()
              for h, s in enumerate(tally.scores())}
    if kept is None:
        return scores, None
    src, tgt = pairs.src_ids[sample], pairs.tgt_ids[sample]
    pieces = tokenizer.tgt_pieces(tgt)
    return scores, Sample(pairs.lines[sample] + 1, tokenizer.src_pieces(src) + ["</s>"], pieces + ["</s>"],
                          ["<s>"] + pieces, kept)


# ------------------------------------------------------------------------------------------ importance


@dataclass
class HeadsOptions:
    """What ``explain_heads`` measures: per-head BLEU (else only the loss), the pruned shares of heads,
    the random prunings (share, draws, seed), and the pair whose maps the page shows (an index into the
    pairs; None: none)."""

    bleu: bool = True
    prune: tuple[float, ...] = (0.1, 0.25, 0.5)
    random_fraction: float = 0.25
    random_draws: int = 5
    seed: int = 0
    sample: int | None = 0


@dataclass
class Head:
    kind: str
    layer: int
    head: int
    scores: HeadScores
    delta_loss: float
    delta_bleu: float | None = None


@dataclass
class Pruned:
    """The model with ``heads`` masked together: a share of all heads, by importance or at random."""

    fraction: float
    heads: list[HeadId]
    loss: float
    bleu: float


@dataclass
class HeadsReport:
    heads: list[Head]
    pairs: int
    tokens: int
    own: bool  # the targets and references are the model's own translations
    beam_size: int
    loss: float
    bleu: float
    pruned: list[Pruned] = field(default_factory=list)
    random: list[Pruned] = field(default_factory=list)
    sample: Sample | None = None

    @property
    def random_bleu(self) -> float | None:
        return float(np.mean([r.bleu for r in self.random])) if self.random else None

    def counts(self) -> dict[str, dict[str, int]]:
        """kind -> pattern -> heads, every pattern listed."""
        return {kind: {p: sum(h.kind == kind and h.scores.pattern == p for h in self.heads) for p in PATTERNS}
                for kind in KINDS if any(h.kind == kind for h in self.heads)}

    def as_dict(self) -> dict:
        """Everything, JSON-ready, with layers and heads numbered from 1."""
        def ids(heads):
            return [{"kind": k, "layer": layer + 1, "head": h + 1} for k, layer, h in heads]

        def pruned(p: Pruned):
            return {"fraction": p.fraction, "heads": ids(p.heads), "loss": p.loss, "bleu": p.bleu}

        return {
            "pairs": self.pairs, "target_tokens": self.tokens, "beam_size": self.beam_size,
            "references": "own translations" if self.own else "targets",
            "loss": self.loss, "bleu": self.bleu,
            "heads": [{"kind": h.kind, "layer": h.layer + 1, "head": h.head + 1, **asdict(h.scores),
                       "delta_loss": h.delta_loss, "delta_bleu": h.delta_bleu} for h in self.heads],
            "pattern_counts": self.counts(),
            "pruned": [pruned(p) for p in self.pruned],
            "random": {"fraction": self.random[0].fraction if self.random else None,
                       "mean_bleu": self.random_bleu, "draws": [pruned(p) for p in self.random]},
            "sample": None if self.sample is None else self.sample.number,
        }


def share(fraction: float, total: int) -> int:
    """round(fraction x total), halves up, within 0 .. total."""
    return min(max(int(np.floor(fraction * total + 0.5)), 0), total)


def prune(judge: Judge, heads: Sequence[HeadId], fraction: float) -> Pruned:
    """``heads`` (a ``fraction`` of all heads) masked together: the loss and the BLEU."""
    with masked_heads(judge.translator.model, heads):
        return Pruned(fraction, list(heads), judge.loss(), judge.bleu())


def planned_passes(heads: int, options: HeadsOptions) -> int:
    """Passes over the pairs ``explain_heads`` makes (its ``advance`` is told each one's pairs)."""
    per_head = 2 if options.bleu else 1
    return 3 + heads * per_head + 2 * (len(options.prune) + options.random_draws)


def explain_heads(translator: Translator, pairs: Pairs, tgt_lang: str | None,
                  options: HeadsOptions = HeadsOptions(), advance: Advance | None = None) -> HeadsReport:
    """Every head's pattern and importance on ``pairs`` (``model_pairs``), and the prunings."""
    model, done = translator.model, advance or (lambda n: None)
    ids = head_ids(model)
    scores, sample = measure_patterns(translator, pairs, options.sample, done)
    judge = Judge(translator, pairs, tgt_lang)
    loss = judge.loss()
    done(len(pairs))
    bleu = judge.score(pairs.references) if pairs.own else judge.bleu()
    done(len(pairs))
    heads = []
    for kind, layer, h in ids:
        with masked_heads(model, [(kind, layer, h)]):
            delta_loss = judge.loss() - loss
            done(len(pairs))
            delta_bleu = judge.bleu() - bleu if options.bleu else None
        if options.bleu:
            done(len(pairs))
        heads.append(Head(kind, layer, h, scores[(kind, layer, h)], delta_loss, delta_bleu))
    ranking = [ids[i] for i in np.argsort([h.delta_loss for h in heads], kind="stable")]
    report = HeadsReport(heads, len(pairs), judge.tokens, pairs.own, translator.decode.beam_size, loss, bleu,
                         sample=sample)
    for fraction in options.prune:
        report.pruned.append(prune(judge, ranking[:share(fraction, len(ids))], fraction))
        done(2 * len(pairs))
    rng = np.random.default_rng(options.seed)
    for _ in range(options.random_draws):
        drawn = [ids[i] for i in sorted(rng.choice(len(ids), share(options.random_fraction, len(ids)),
                                                   replace=False))]
        report.random.append(prune(judge, drawn, options.random_fraction))
        done(2 * len(pairs))
    return report
