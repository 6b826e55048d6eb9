"""Names a user chooses among, shared by the config schema and the command line, and the processor's flags
that an ``auto`` choice reads (``train.precision``, the quantized engine of ``--int8``); this module imports
nothing heavy, so that ``attnmt --help`` stays fast."""

from __future__ import annotations

import functools
from enum import Enum


class Device(str, Enum):
    """``train.device`` and ``--device``: ``auto`` takes CUDA when the machine has it."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


METRICS = ("bleu", "chrf", "ter")
"""The corpus metrics ``attnmt eval`` computes (``metrics.corpus_scores``)."""


def higher_is_better(metric: str) -> bool:
    """``train.metric``'s direction: BLEU and chrF rise as a model improves, the dev loss falls."""
    return metric != "loss"


def improves(score: float, than: float | None, higher_better: bool) -> bool:
    """The one "is this score better" rule (early stopping, the plateau schedule, the best checkpoint, the
    average against it): strictly better than ``than``, and anything is better than nothing (None)."""
    return than is None or (score > than if higher_better else score < than)


class BleuTokenizer(str, Enum):
    """``eval --tokenize``: sacrebleu's BLEU tokenizers (sacrebleu 2.6; ``tests/decoding/test_metrics.py``
    checks the list against the installed sacrebleu). ``ja-mecab`` and ``ko-mecab`` need sacrebleu's MeCab
    extras."""

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


class Scores(str, Enum):
    """``translate --scores``: what to print beside each translation."""

    words = "words"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The first processor's flags in ``/proc/cpuinfo`` (Linux), read once; empty where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()
