"""The ``data`` section: where the pairs come from (one source class per format), and the training
corpora's languages, weights and tags (``DataConfig``).

``data.train`` is one source or a list of them. Each training corpus may name its own ``src_lang`` and
``tgt_lang`` (default: the section's), a ``weight`` (its share of the examples drawn in an epoch, relative
to the others'; ``batching.corpus_draws``) and a ``tag`` (a token put before each of its sources, as for
tagged back-translation, Caswell et al. 2019). When the training corpora go into more than one target
language, the model is multilingual: every source starts with its target language's token (``<2fr>``,
Johnson et al. 2017), and ``translate --tgt-lang`` chooses it. These control tokens are pieces of their
own in the tokenizer (sentencepiece's user-defined symbols).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, StringConstraints, Tag
from pydantic import StrictInt as Int
from pydantic import StrictStr as Str

from ..errors import ConfigError
from .model import PositiveInt, Section
from .specials import reserved_because

LangCode = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
Token = Annotated[str, StringConstraints(strict=True, pattern=r"^\S+$")]
Weight = Annotated[float, Field(strict=True, gt=0.0, allow_inf_nan=False)]


class Corpus(Section):
    """What every source may say about itself as a training corpus (``DataConfig``)."""

    src_lang: LangCode | None = None
    tgt_lang: LangCode | None = None
    """Its languages, default the section's ``src_lang``/``tgt_lang``."""
    weight: Weight | None = None
    """Training only: its share of an epoch's examples, relative to the other corpora's (default 1 when any
    corpus has one; with none, an epoch is one pass over every pair)."""
    tag: Token | None = None
    """Training only: a token put before each of its sources (e.g. ``<bt>`` for back-translations)."""


class TextSource(Corpus):
    """Two aligned text files, one sentence per line, plain or gzipped."""

    format: Literal["text"] = "text"
    src: Path
    tgt: Path


class TsvSource(Corpus):
    """One tab-separated file; columns are counted from 0."""

    format: Literal["tsv"]
    path: Path
    src_column: Annotated[int, Field(strict=True, ge=0)] = 0
    tgt_column: Annotated[int, Field(strict=True, ge=0)] = 1


class JsonlSource(Corpus):
    """One JSON object per line; fields may be dotted (``translation.de``)."""

    format: Literal["jsonl"]
    path: Path
    src_field: Str
    tgt_field: Str


class HfSource(Corpus):
    """A Hugging Face dataset: a hub name, or a builder (json, csv, parquet, arrow) with local data files."""

    format: Literal["hf"]
    name: Str
    data_files: Path | list[Path] | None = None
    config_name: Str | None = None
    split: Str = "train"
    src_field: Str
    tgt_field: Str


class ToySource(Corpus):
    """The embedded default: generated date-translation pairs (see ``toy.toy_pairs``)."""

    format: Literal["toy"]
    split: Literal["train", "dev", "test"]
    size: PositiveInt
    seed: Int = 1
    lang: Literal["de", "zh"] = "de"
    """The target language: German, or Chinese (``toy.py``)."""


def _source_tag(value: Any) -> str:
    if isinstance(value, dict):
        fmt = value.get("format", "text")
        return fmt if isinstance(fmt, str) else "text"
    return getattr(value, "format", "text")


Source = Annotated[Annotated[TextSource, Tag("text")] | Annotated[TsvSource, Tag("tsv")]
                   | Annotated[JsonlSource, Tag("jsonl")] | Annotated[HfSource, Tag("hf")]
                   | Annotated[ToySource, Tag("toy")],
                   Discriminator(_source_tag, custom_error_type="invalid_format",
                                 custom_error_message="format must be one of text, tsv, jsonl, hf, toy")]


def _one_or_many(value: Any) -> str:
    return "many" if isinstance(value, list) else "one"


Corpora = Annotated[Annotated[Source, Tag("one")]
                    | Annotated[Annotated[list[Source], Field(min_length=1)], Tag("many")],
                    Discriminator(_one_or_many)]


def target_token(lang: str) -> str:
    """The token that asks a multilingual model for ``lang``."""
    return f"<2{lang}>"


class DataConfig(Section):
    src_lang: Str = "src"
    tgt_lang: Str = "tgt"
    train: Corpora
    dev: Source | None = None
    test: Source | None = None
    max_len: PositiveInt = 128
    """Pairs with more subword pieces than this on either side are dropped from training."""
    max_ratio: Annotated[float, Field(strict=True, ge=1.0, allow_inf_nan=False)] = 3.0
    """Pairs whose piece counts differ by more than this factor are dropped from training."""
    max_dropped_fraction: Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)] = 0.5
    """Stop with an error when cleaning drops more than this fraction of the training pairs."""

    def corpora(self) -> list[Any]:
        """The training corpora, in order (one source or the list)."""
        return list(self.train) if isinstance(self.train, list) else [self.train]

    def target_languages(self) -> list[str]:
        """The languages the training corpora go into, sorted."""
        return sorted({c.tgt_lang or self.tgt_lang for c in self.corpora()})

    @property
    def multilingual(self) -> bool:
        return len(self.target_languages()) > 1

    def languages(self) -> tuple[str, ...]:
        """Every language named, the section's first (for the tokenizer's defaults)."""
        named = [self.src_lang, self.tgt_lang]
        named += [lang for c in self.corpora() for lang in (c.src_lang, c.tgt_lang)]
        return tuple(dict.fromkeys(lang for lang in named if lang))

    def source_prefix(self, source: Any) -> str:
        """The control tokens put before each source of ``source`` (a training, dev or test corpus), as text:
        the target language's token in a multilingual model, then the corpus's tag."""
        tokens = [target_token(source.tgt_lang or self.tgt_lang)] if self.multilingual else []
        return " ".join(tokens + ([source.tag] if source.tag else []))

    def control_tokens(self) -> list[str]:
        """Every token ``source_prefix`` may put: the tokenizer keeps each as one piece."""
        targets = [target_token(lang) for lang in self.target_languages()] if self.multilingual else []
        return targets + sorted({c.tag for c in self.corpora() if c.tag} - set(targets))

    def corpus_keys(self) -> list[str]:
        """Each training corpus's key as messages name it: ``data.train`` (one), ``data.train.N`` (a list)."""
        if not isinstance(self.train, list):
            return ["data.train"]
        return [f"data.train.{i}" for i in range(len(self.train))]

    def weights(self) -> list[float] | None:
        """Each training corpus's weight (1 where unset), or None when no corpus has one."""
        corpora = self.corpora()
        if all(c.weight is None for c in corpora):
            return None
        return [c.weight if c.weight is not None else 1.0 for c in corpora]

    def prefix_for(self, lang: str | None, named: str) -> str:
        """The source prefix that asks for ``lang`` (None: the section's ``tgt_lang``) at translation time;
        ConfigError naming the option (``named``) for a language the model was not trained into."""
        langs = self.target_languages()
        if lang is None:  # the section's language, or the corpora's only one
            if self.tgt_lang not in langs and len(langs) > 1:
                raise ConfigError(f"this model translates into {', '.join(langs)}: choose one with {named}")
            lang = self.tgt_lang if self.tgt_lang in langs else langs[0]
        elif lang not in langs:
            raise ConfigError(f"{named} {lang}: this model translates into {', '.join(langs)} only")
        return target_token(lang) if self.multilingual else ""

def check_corpora(data: DataConfig, where: Callable[[str], str]) -> None:
    """What the schema cannot see: weights and tags on training corpora only, dev and test into a language
    the training corpora go into; ``where(key)`` says where a key was set."""
    langs = data.target_languages()
    for split in ("dev", "test"):
        source = getattr(data, split)
        if source is None:
            continue
        for key in ("weight", "tag"):
            if getattr(source, key) is not None:
                raise ConfigError(f"{where(f'data.{split}.{key}')}: only training corpora have a {key} "
                                  "(data.train)")
        lang = source.tgt_lang or data.tgt_lang
        if data.multilingual and lang not in langs:
            key = f"data.{split}.tgt_lang" if source.tgt_lang else "data.tgt_lang"
            raise ConfigError(f"{where(key)}: {lang}, but the training corpora go into {', '.join(langs)}")
    targets = {target_token(lang) for lang in langs} if data.multilingual else set()
    # A target-language token <2xx> is never reserved (a language code is letters, digits, _ and -): tags are.
    for key, corpus in zip(data.corpus_keys(), data.corpora(), strict=True):
        if not corpus.tag:
            continue
        why = reserved_because(corpus.tag)
        if why is not None:
            raise ConfigError(f"{where(f'{key}.tag')}: {corpus.tag!r} cannot be a tag: {why}; choose another "
                              "(such as <bt>)")
        if corpus.tag in targets:
            raise ConfigError(f"{where(f'{key}.tag')}: the tag {corpus.tag} is also a target-language token")
