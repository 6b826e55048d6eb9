"""Corpus-level BLEU, chrF and TER through sacrebleu, on detokenised text, with their signatures.

BLEU's tokenizer follows the target language whatever code names it (``languages.bleu_tokenizer``: zh for
``zh-CN``, ``cmn``, ...; ja-mecab, ko-mecab; 13a otherwise), and TER splits CJK characters for a CJK
target. Takes strings and files only and imports no model code, so it scores files of any earlier run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config.choices import METRICS
from ..config.languages import bleu_tokenizer, is_cjk_language, missing_extra
from ..data.readers import read_lines
from ..errors import ConfigError, DataError


@dataclass
class Score:
    name: str  # bleu | chrf | ter
    score: float
    signature: str
    text: str  # sacrebleu's own one-line rendering, e.g. "BLEU = 38.2 70.1/45.3/..."

    @property
    def label(self) -> str:
        return "chrF" if self.name == "chrf" else self.name.upper()

    def as_dict(self) -> dict:
        return {"metric": self.name, "score": round(self.score, 4), "signature": self.signature,
                "text": self.text}


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    metrics: Sequence[str] = METRICS,
    tgt_lang: str | None = None,
    tokenize: str | None = None,
    lowercase: bool = False,
) -> dict[str, Score]:
    """Score ``hypotheses`` against one or more reference streams (each as long as the hypotheses).

    ``tokenize`` is BLEU's tokenizer (13a, zh, intl, char, none, ...); by default it follows ``tgt_lang``
    (``bleu_tokenize``).
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    tokenize = bleu_tokenize(tgt_lang, tokenize)

    hypotheses = list(hypotheses)
    references = [list(r) for r in references]
    for i, ref in enumerate(references):
        if len(ref) != len(hypotheses):
            raise ValueError(f"reference {i + 1} has {len(ref)} lines, the hypotheses have {len(hypotheses)}")
    makers = {
        "bleu": lambda: BLEU(lowercase=lowercase, tokenize=tokenize, trg_lang=tgt_lang or ""),
        "chrf": lambda: CHRF(lowercase=lowercase),
        "ter": lambda: TER(case_sensitive=not lowercase, asian_support=is_cjk_language(tgt_lang)),
    }
    out = {}
    for name in metrics:
        metric = makers[name]()
        result = metric.corpus_score(hypotheses, references)
        out[name] = Score(name, float(result.score), str(metric.get_signature()), str(result))
    return out


def bleu_tokenize(tgt_lang: str | None, tokenize: str | None = None) -> str:
    """BLEU's tokenizer: ``tokenize`` if given, else the one for ``tgt_lang``; a ConfigError with the
    install hint when it needs an extra that is missing (MeCab for Japanese and Korean), a DataError with
    the fix when it needs a model file that is not on this machine (``missing_model``)."""
    tokenize = tokenize or bleu_tokenizer(tgt_lang)
    extra = missing_extra(tokenize)
    if extra is not None:
        why = f"target language {tgt_lang!r}: " if tgt_lang and tokenize == bleu_tokenizer(tgt_lang) else ""
        raise ConfigError(f"{why}BLEU's {tokenize} tokenizer needs MeCab, which is not installed "
                          f"(pip install '{extra}')")
    missing = missing_model(tokenize)
    if missing is not None:
        path, url = missing
        raise DataError(f"BLEU's {tokenize} tokenizer needs its sentencepiece model {path}, which is not on "
                        f"this machine, and attnmt downloads nothing: fetch {url} to that path (or set "
                        f"SACREBLEU to a folder holding models/{path.name})")
    return tokenize


def missing_model(tokenize: str) -> tuple[Path, str] | None:
    """(path, url) of the sentencepiece model that sacrebleu's spm, flores101, flores200 and spBLEU-1K
    tokenizers load, when it is not on disk; sacrebleu would download it (and leave a lock file in
    ``~/.sacrebleu`` when the network is not there)."""
    # tokenizer_spm's own SACREBLEU_DIR: the folder that module loads from
    from sacrebleu.tokenizers.tokenizer_spm import SACREBLEU_DIR, SPM_MODELS

    if tokenize not in SPM_MODELS:
        return None
    url = SPM_MODELS[tokenize]["url"]
    path = Path(SACREBLEU_DIR) / "models" / Path(url).name
    return None if path.is_file() else (path, url)


def read_references(paths: Sequence[Path]) -> list[tuple[Path, list[str]]]:
    """(path, lines) of each reference file."""
    return [(Path(p), list(read_lines(p))) for p in paths]


def score_corpus(
    hypotheses: Sequence[str],
    name: str,
    references: Sequence[tuple[Path, Sequence[str]]],
    metrics: Sequence[str] = METRICS,
    tgt_lang: str | None = None,
    tokenize: str | None = None,
    lowercase: bool = False,
) -> dict[str, Score]:
    """``corpus_scores`` after checking the files: no reference empty, as many lines in each as in the
    hypotheses (``name`` says where they come from), at least one line (else a DataError names them)."""
    for path, lines in references:
        if not lines:
            raise DataError(f"{path}: the reference file is empty")
        if len(lines) != len(hypotheses):
            raise DataError(f"{name} has {len(hypotheses)} lines, {path} has {len(lines)}")
    if not hypotheses:
        raise DataError(f"{name}: no lines to score")
    streams = [lines for _, lines in references]
    return corpus_scores(hypotheses, streams, metrics, tgt_lang=tgt_lang, tokenize=tokenize,
                         lowercase=lowercase)
