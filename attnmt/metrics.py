"""Corpus-level BLEU, chrF and TER through sacrebleu, on detokenised text, with their signatures.

Takes strings only and imports no model code, so it scores files of any earlier run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

METRICS = ("bleu", "chrf", "ter")


@dataclass
class Score:
    name: str  # bleu | chrf | ter
    score: float
    signature: str
    text: str  # sacrebleu's own one-line rendering, e.g. "BLEU = 38.2 70.1/45.3/..."


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    metrics: Sequence[str] = METRICS,
    tgt_lang: str | None = None,
    tokenize: str | None = None,
    lowercase: bool = False,
) -> dict[str, Score]:
    """Score ``hypotheses`` against one or more reference streams (each as long as the hypotheses).

    ``tokenize`` is BLEU's tokenizer (13a, zh, intl, char, none, ...); by default sacrebleu picks it from
    ``tgt_lang`` (``zh`` for Chinese, ``ja-mecab`` for Japanese, 13a otherwise).
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    hypotheses = list(hypotheses)
    references = [list(r) for r in references]
    for i, ref in enumerate(references):
        if len(ref) != len(hypotheses):
            raise ValueError(f"reference {i + 1} has {len(ref)} lines, the hypotheses have {len(hypotheses)}")
    makers = {
        "bleu": lambda: BLEU(lowercase=lowercase, tokenize=tokenize, trg_lang=tgt_lang or ""),
        "chrf": lambda: CHRF(lowercase=lowercase),
        "ter": lambda: TER(case_sensitive=not lowercase),
    }
    out = {}
    for name in metrics:
        metric = makers[name]()
        result = metric.corpus_score(hypotheses, references)
        out[name] = Score(name, float(result.score), str(metric.get_signature()), str(result))
    return out
