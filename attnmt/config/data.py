"""The text going in: the ``data`` section, where the pairs come from (one source class per format) and
the training corpora's languages, weights and tags (``DataConfig``); and the ``tokenizer`` section, how that
text is cut into pieces (``TokenizerConfig``, with subword regularisation's ``SamplingConfig``).

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

from pydantic import Discriminator, Field, StringConstraints, Tag, field_validator
from pydantic import StrictBool as Bool
from pydantic import StrictInt as Int
from pydantic import StrictStr as Str

from ..errors import ConfigError
from .model import PositiveInt, Probability1, Section
from .specials import reserved_because

LangCode = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
Token = Annotated[str, StringConstraints(strict=True, pattern=r"^\S+$")]
Weight = Annotated[float, Field(strict=True, gt=0.0, allow_inf_nan=False)]


class Corpus(Section):
    """What every source may say about itself as a training corpus (``DataConfig``)."""

    src_lang: LangCode | None = None
    """Its source language, default the section's ``src_lang``."""
    tgt_lang: LangCode | None = None
    """Its target language, default the section's ``tgt_lang``; training corpora into more than one make
    the model multilingual (each source starts with its target language's token, ``<2fr>``)."""
    weight: Weight | None = None
    """Training only: its share of an epoch's examples, relative to the other corpora's (default 1 when any
    corpus has one; with none, an epoch is one pass over every pair)."""
    tag: Token | None = None
    """Training only: a token put before each of its sources (e.g. ``<bt>`` for back-translations)."""


class TextSource(Corpus):
    """Two aligned text files, one sentence per line, plain or gzipped."""

    format: Literal["text"] = "text"
    """``text``, the format of a source that names none."""
    src: Path
    """The source side: UTF-8, one sentence a line, plain or gzipped (told by its first bytes); relative
    paths resolve against the config file's folder."""
    tgt: Path
    """The target side, line for line with ``src`` (a different number of lines is an error)."""


class TsvSource(Corpus):
    """One tab-separated file; columns are counted from 0."""

    format: Literal["tsv"]
    """``tsv``."""
    path: Path
    """The file: UTF-8, plain or gzipped; a line with fewer columns than asked for is an error."""
    src_column: Annotated[int, Field(strict=True, ge=0)] = 0
    """The column of the source sentence."""
    tgt_column: Annotated[int, Field(strict=True, ge=0)] = 1
    """The column of the target sentence."""


class JsonlSource(Corpus):
    """One JSON object per line; fields may be dotted (``translation.de``)."""

    format: Literal["jsonl"]
    """``jsonl``."""
    path: Path
    """The file: UTF-8, plain or gzipped, one JSON object a line."""
    src_field: Str
    """The field that holds the source sentence (a string); dotted for a nested one."""
    tgt_field: Str
    """The field that holds the target sentence (a string); dotted for a nested one."""


class HfSource(Corpus):
    """A Hugging Face dataset: a hub name, or a builder (json, csv, parquet, arrow) with local data files."""

    format: Literal["hf"]
    """``hf``."""
    name: Str
    """``datasets.load_dataset``'s first argument: a dataset on the hub, or a builder (``json``, ``csv``,
    ``parquet``, ``arrow``) that reads ``data_files``."""
    data_files: Path | list[Path] | None = None
    """A builder's local files, one path or a list; each must exist."""
    config_name: Str | None = None
    """The dataset's configuration (``load_dataset``'s second argument), when it has several."""
    split: Str = "train"
    """The dataset's split to read (``train``, ``validation``, ``test``, as the dataset names them)."""
    src_field: Str
    """The field that holds the source sentence; dotted for a nested one (``translation.de``)."""
    tgt_field: Str
    """The field that holds the target sentence; dotted for a nested one (``translation.en``)."""


class ToySource(Corpus):
    """The embedded default: generated date-translation pairs (see ``toy.toy_pairs``)."""

    format: Literal["toy"]
    """``toy``."""
    split: Literal["train", "dev", "test"]
    """Which of the task's splits: a hash of the source sentence decides, so no sentence is in two."""
    size: PositiveInt
    """The number of pairs, all different."""
    seed: Int = 1
    """The generator's seed: the same split, size, seed and lang give the same pairs."""
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
    """The source language's code (``en``, ``zh-CN``): a Chinese, Japanese or Korean one changes the
    tokenizer's defaults; any other code is only a name."""
    tgt_lang: Str = "tgt"
    """The target language's code: it also picks BLEU's tokenizer (validation, ``eval``) and a multilingual
    model's default target language."""
    train: Corpora | None = None
    """The training corpus: one source, or a list of them (each with its own languages, weight and tag);
    required to prepare and train (the config of an imported model names none)."""
    dev: Source | None = None
    """The validation corpus, translated every ``train.eval_every`` steps; without it, training never
    validates (no best checkpoint by score, no early stopping)."""
    test: Source | None = None
    """A test corpus, prepared with the others; training never reads it (``attnmt study`` scores on it)."""
    max_len: PositiveInt = 128
    """Pairs with more subword pieces than this on either side are dropped from training."""
    max_ratio: Annotated[float, Field(strict=True, ge=1.0, allow_inf_nan=False)] = 3.0
    """Pairs whose piece counts differ by more than this factor are dropped from training."""
    max_dropped_fraction: Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)] = 0.5
    """Stop with an error when cleaning drops more than this fraction of the training pairs."""
    target_tokens: dict[LangCode, Token] | None = None
    """A model whose target-language tokens are not attnmt's ``<2xx>``: each language it translates into and
    the token that asks for it (an imported multilingual OPUS-MT model's ``>>fra<<``; ``attnmt import``
    writes them into the model's config, and a config that fine-tunes it copies them). Every source then
    starts with its language's token, and ``translate --tgt-lang`` chooses one of these languages."""

    def corpora(self) -> list[Any]:
        """The training corpora, in order (one source or the list; none in an imported model's config)."""
        if self.train is None:
            return []
        return list(self.train) if isinstance(self.train, list) else [self.train]

    def target_languages(self) -> list[str]:
        """The languages the model translates into, sorted: ``target_tokens``' languages, else the training
        corpora's (the section's ``tgt_lang`` without any)."""
        if self.target_tokens:
            return sorted(self.target_tokens)
        return sorted({c.tgt_lang or self.tgt_lang for c in self.corpora()} or {self.tgt_lang})

    @property
    def multilingual(self) -> bool:
        return bool(self.target_tokens) or len(self.target_languages()) > 1

    def token_for(self, lang: str) -> str:
        """The token that asks this model for ``lang``: from ``target_tokens``, else ``<2xx>``."""
        return self.target_tokens[lang] if self.target_tokens else target_token(lang)

    def languages(self) -> tuple[str, ...]:
        """Every language named, the section's first (for the tokenizer's defaults)."""
        named = [self.src_lang, self.tgt_lang]
        named += [lang for c in self.corpora() for lang in (c.src_lang, c.tgt_lang)]
        return tuple(dict.fromkeys(lang for lang in named if lang))

    def source_prefix(self, source: Any) -> str:
        """The control tokens put before each source of ``source`` (a training, dev or test corpus), as text:
        the target language's token in a multilingual model, then the corpus's tag."""
        tokens = [self.token_for(source.tgt_lang or self.tgt_lang)] if self.multilingual else []
        return " ".join(tokens + ([source.tag] if source.tag else []))

    def control_tokens(self) -> list[str]:
        """Every token ``source_prefix`` may put: the tokenizer keeps each as one piece."""
        targets = [self.token_for(lang) for lang in self.target_languages()] if self.multilingual else []
        return targets + sorted({c.tag for c in self.corpora() if c.tag} - set(targets))

    def corpus_keys(self) -> list[str]:
        """Each training corpus's key as messages name it: ``data.train`` (one), ``data.train.N`` (a list)."""
        if not isinstance(self.train, list):
            return [] if self.train is None else ["data.train"]
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
        return self.token_for(lang) if self.multilingual else ""


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
    for key, corpus in zip(data.corpus_keys(), data.corpora(), strict=True):
        lang = corpus.tgt_lang or data.tgt_lang
        if data.target_tokens and lang not in data.target_tokens:
            key = f"{key}.tgt_lang" if corpus.tgt_lang else "data.tgt_lang"
            raise ConfigError(f"{where(key)}: {lang}, which data.target_tokens has no token for "
                              f"({', '.join(sorted(data.target_tokens))})")
    targets = {data.token_for(lang) for lang in langs} if data.multilingual else set()
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


# ------------------------------------------------------------------------------- the tokenizer


class SamplingConfig(Section):
    """Subword regularisation (``subword_sampling.py``): every epoch, the training pairs are segmented anew,
    by unigram sampling (Kudo 2018) among each sentence's n best segmentations, or for a BPE model by
    BPE-dropout (Provilkov et al. 2020); dev, test and decoding keep the one deterministic segmentation.
    Both are drawn by attnmt, seeded by (``train.seed``, epoch, example), so that a run repeats."""

    alpha: Probability1 = 0.1
    """unigram: the inverse temperature, each segmentation's probability raised to alpha (smaller is more
    varied); bpe: the probability of dropping each merge (larger is more varied; 0.1 in the paper)."""
    nbest: Int = 16
    """unigram only: sample among the nbest best segmentations (the cost of a sentence's draw grows with it:
    about 0.14 ms of CPU at 16, 0.35 ms at 64 on Multi30k: bench_sampling.py --draws-only)."""

    @field_validator("nbest")
    @classmethod
    def _some_to_choose_from(cls, nbest: int) -> int:
        if nbest < 2:
            raise ValueError(f"must be at least 2 (the n best segmentations to draw from), got {nbest}")
        return nbest


class TokenizerConfig(Section):
    """The sentencepiece model(s) that cut the text into pieces: trained by ``attnmt prepare`` on the training
    corpora (or given: ``src_model``) and kept in the run folder and in every checkpoint."""

    model_type: Literal["bpe", "unigram"] = "unigram"
    """sentencepiece's algorithm: unigram (Kudo 2018) or bpe; it also decides what ``sampling`` draws."""
    joint: Bool = True
    """One model trained on both sides (one vocabulary), or one per side; ``model.share_embeddings`` needs
    a joint one."""
    vocab_size: Annotated[int, Field(strict=True, ge=8)] = 8000
    """Pieces per model, the special pieces and control tokens included; prepare stops when the corpus
    cannot fill it (unless ``hard_vocab_limit: false``) or its characters need more."""
    character_coverage: Probability1 | None = None
    """Share of the training characters that get pieces of their own; default by language: 0.9995 when a side
    is Chinese, Japanese or Korean (sentencepiece's advice for large character sets), else 1.0."""
    byte_fallback: Bool | None = None
    """Characters without a piece become UTF-8 byte pieces instead of <unk>; default: on when a side is
    CJK."""
    normalization: Literal["nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"] | None = None
    """sentencepiece's rule, kept in the model and applied to every line it encodes; default by language:
    ``identity`` (the text as cleaned, NFC) when a side is CJK, else ``nmt_nfkc``, whose NFKC folds
    full-width punctuation (？，！) into ASCII, so a Chinese target would never get it back."""
    sample_size: PositiveInt = 1_000_000
    """Train sentencepiece on at most this many sentences (sampled) per model."""
    hard_vocab_limit: Bool = True
    """false: vocab_size is only an upper bound, and a corpus too small for it gets fewer pieces instead of
    an error."""
    src_model: Path | None = None
    """An existing sentencepiece model to load instead of training one (joint: the only model)."""
    tgt_model: Path | None = None
    """With ``src_model`` and ``joint: false``: the target side's existing model (required then)."""
    sampling: SamplingConfig | None = None
    """Subword regularisation of the training pairs; off unless given (``sampling: {}``: the defaults)."""
