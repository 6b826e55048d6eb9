"""Names a user chooses among, shared by the config schema and the command line; this module imports
nothing, so that ``attnmt --help`` stays fast."""

from __future__ import annotations

from enum import Enum


class Device(str, Enum):
    """``train.device`` and ``--device``: ``auto`` takes CUDA when the machine has it."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


METRICS = ("bleu", "chrf", "ter")
"""The corpus metrics ``attnmt eval`` computes (``metrics.corpus_scores``)."""


class BleuTokenizer(str, Enum):
    """``eval --tokenize``: sacrebleu's BLEU tokenizers (sacrebleu 2.6; ``tests/test_metrics.py`` checks the
    list against the installed sacrebleu). ``ja-mecab`` and ``ko-mecab`` need sacrebleu's MeCab extras."""

    t13a = "13a"
    zh = "zh"
    intl = "intl"
    char = "char"
    none = "none"
    ja_mecab = "ja-mecab"
    ko_mecab = "ko-mecab"
    spm = "spm"
    flores101 = "flores101"
    flores200 = "flores200"
    spbleu_1k = "spBLEU-1K"
