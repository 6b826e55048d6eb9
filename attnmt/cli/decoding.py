"""Commands that decode and score: ``translate``, ``eval`` and ``score``."""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from ..config.choices import BleuTokenizer
from ..errors import ConfigError, ConstraintError, DataError
from .app import command
from .common import FileProgress, open_translator, sentences_or_input
from .contract import Output
from .options import (
    BeamOpt,
    ConstraintsOpt,
    DeviceOpt,
    InputOpt,
    Int8Opt,
    LengthPenaltyOpt,
    MaxTokensOpt,
    Metrics,
    ModelArg,
    NbestOpt,
    PrefixOpt,
    ScoresOpt,
    SentencesArg,
    ShortlistOpt,
    TgtLangOpt,
)

CHUNK_LINES = 1000
MarkupOpt = Annotated[bool, typer.Option("--markup", help="Each input line is markup: its inline tags (<b>, "
                                         "<a href=...>, <br/>, nested) and entities are taken out, the text "
                                         "translated, and each tag put back around the words the model "
                                         "aligns with the words it wrapped (as align reads it); the output "
                                         "is escaped markup. A line that is not well-formed is an error "
                                         "naming it, before it is translated.")]


@command(inputs=("model", "input_", "ensemble", "prefix", "constraints", "shortlist"),
         outputs={"output": Output()})
def translate(
    model: ModelArg,
    sentences: SentencesArg = None,
    input_: InputOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o",
                                                help="Write here (atomically) instead of stdout.")] = None,
    beam_size: BeamOpt = None,
    nbest: NbestOpt = 1,
    max_tokens: MaxTokensOpt = None,
    length_penalty: LengthPenaltyOpt = None,
    ensemble: Annotated[list[Path] | None, typer.Option("--ensemble", help="Another model to average with "
                                                        "MODEL step by step (repeat for more; one "
                                                        "tokenizer).", show_default=False)] = None,
    sampling: Annotated[bool, typer.Option("--sampling", help="Draw each translation at random from the "
                                           "model instead of searching (--nbest N: N samples).")] = False,
    temperature: Annotated[float | None, typer.Option("--temperature", help="With --sampling: divide the "
                                                      "log-probabilities by this (default 1).",
                                                      show_default=False)] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="With --sampling: draw from the K most "
                                              "probable pieces only (default 0: all).",
                                              show_default=False)] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="With --sampling: draw from the smallest "
                                                "set of pieces whose probability reaches P (nucleus; "
                                                "default 1: all).", show_default=False)] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0, max=2**64 - 1, help="With --sampling: the "
                                             "random seed (default 1); the same seed and input give the "
                                             "same samples.", show_default=False)] = None,
    scores: ScoresOpt = None,
    prefix: PrefixOpt = None,
    constraints: ConstraintsOpt = None,
    tgt_lang: TgtLangOpt = None,
    markup: MarkupOpt = False,
    int8: Int8Opt = False,
    shortlist: ShortlistOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Translate sentences, a file or stdin; one output line per input line, in input order.

    With --nbest N (or --sampling --nbest N): N lines per input, "index<TAB>score<TAB>translation".
    """
    from ..data.readers import count_lines
    from ..decoding.translator import DecodeOverrides

    draw = _sampling(sampling, beam_size, temperature, top_k, top_p, seed)
    total = count_lines(input_) if input_ is not None else 0  # None for a pipe: progress without a total
    lines = sentences_or_input(sentences, input_)
    count = len(sentences) if sentences else total if input_ else None
    lines, prefixes, phrases = _controls(lines, count, prefix, constraints, draw is not None,
                                         stdin_input=not sentences and (input_ is None or str(input_) == "-"))
    lines, tags = _Tags.read(lines, model, sentences, input_) if markup else (lines, None)
    overrides = DecodeOverrides(beam_size, nbest, length_penalty, max_tokens, draw, tgt_lang=tgt_lang,
                                int8=int8 or None)
    translator, cfg, checkpoint = open_translator(model, device, overrides, ensemble=ensemble,
                                                  shortlist=shortlist)
    with FileProgress(total, "translating", show=input_ is not None and str(input_) != "-") as progress:
        chunks = translator.translate_stream(lines, CHUNK_LINES, prefixes, scores is not None, phrases)
        chunks = tags.carried(chunks, translator, cfg, checkpoint) if tags else chunks
        try:
            truncated = _write_translations(chunks, nbest, output, progress)
        except ConstraintError as e:
            raise DataError(f"--constraints {constraints} {e}") from None
    if truncated:
        sys.stderr.write(f"warning: {truncated} line(s) "
                         "longer than decode.max_src_len pieces were truncated\n")


class _Tags:
    """``translate --markup``: each input line parsed (``data.markup.parse_markup``) as it is read, and its
    text translated; each chunk's outputs (every one of the n-best) get their line's tags back
    (``insight.reading.carry_markup``, links read as ``align`` reads the model by default). A line that is
    not well-formed is a DataError naming the input and the line: the arguments' and a file's lines are all
    checked before any work, a stream's as they arrive, before the chunk that holds them is translated."""

    def __init__(self, model: Path, sentences: list[str] | None, input_: Path | None) -> None:
        from ..data.readers import STDIN_NAME, is_regular_file, read_lines
        from ..decoding.ctranslate import is_export

        if is_export(model):
            raise ConfigError(f"--markup puts tags back where the model's attention links the words, and "
                              f"{model} is a CTranslate2 export, which has none: use its checkpoint")
        name = STDIN_NAME if input_ is None or str(input_) == "-" else str(input_)
        self.where = (lambda n: f"sentence {n}") if sentences else (lambda n: f"{name}:{n}")
        self.waiting: deque = deque()  # the parsed lines whose outputs have not come back yet
        if sentences or (input_ is not None and is_regular_file(input_)):  # lines that can be read twice
            deque(self._parsed(sentences or read_lines(input_)), maxlen=0)

    def _parsed(self, lines: Iterable[str]):
        from ..data.markup import MarkupError, parse_markup

        for n, line in enumerate(lines, 1):
            try:
                yield parse_markup(line)
            except MarkupError as e:
                raise DataError(f"{self.where(n)}: {e}") from None

    @classmethod
    def read(cls, lines: Iterable[str], model: Path, sentences: list[str] | None,
             input_: Path | None) -> tuple[Iterator[str], _Tags]:
        """(the texts of ``lines``, to translate; what puts their tags back)."""
        tags = cls(model, sentences, input_)
        return tags._texts(lines), tags

    def _texts(self, lines: Iterable[str]) -> Iterator[str]:
        for marked in self._parsed(lines):
            self.waiting.append(marked)
            yield marked.text

    def carried(self, chunks, translator, cfg, checkpoint: Path):
        from ..insight.reading import carry_markup, default_align_options

        options = default_align_options(cfg, checkpoint)
        for results in chunks:
            sources = [self.waiting.popleft() for _ in results]
            marked = [source for source, result in zip(sources, results) for _ in result.outputs]
            tagged = iter(carry_markup(translator, marked, [text for r in results for text, _ in r.outputs],
                                       options))
            for result in results:
                result.outputs = [(next(tagged), score) for _, score in result.outputs]
            yield results


def _write_translations(chunks, nbest: int, output: Path | None, progress: FileProgress) -> int:
    """``translate``'s output: each chunk's translations to stdout as soon as they come, or all of them to
    ``output`` (atomically) at the end; the best one a line, or with --nbest "index<TAB>score<TAB>text".
    Returns how many sources were truncated."""
    from ..runfiles import atomic_write_text

    written: list[str] = []
    truncated = index = 0
    for results in chunks:
        text = []
        for result in results:
            truncated += result.truncated
            if result.words is not None:
                text.append(json.dumps(result.as_json(digits=6), ensure_ascii=False) + "\n")
            elif nbest == 1:
                text.append(result.outputs[0][0] + "\n")
            else:
                text.extend(f"{index}\t{score:.4f}\t{out}\n" for out, score in result.outputs)
            index += 1
        progress.advance(len(results))
        if output is None:
            sys.stdout.write("".join(text))
            sys.stdout.flush()  # per chunk, so that a pipe sees results as they come
        else:
            written.extend(text)
    if output is not None:
        atomic_write_text(output, "".join(written))
    return truncated


def _scored_lines(translator, sources: list[str], targets: list[str], as_json: bool, words: bool,
                  progress: FileProgress) -> list[str]:
    """``score``'s lines: TSV, or JSON with ``--json`` (and the words' probabilities with ``--words``)."""
    from ..data.words import word_scores
    from ..decoding.translator import Scored

    lines = []
    for start in range(0, len(sources), CHUNK_LINES):
        src_ids, tgt_ids = translator.encode_pairs(sources[start:start + CHUNK_LINES],
                                                   targets[start:start + CHUNK_LINES])
        for ids, logprobs in zip(tgt_ids, translator.piece_logprobs(src_ids, tgt_ids)):
            s = Scored.of(logprobs, translator.decode.length_penalty)
            record = {"logprob": round(s.logprob, 6), "tokens": s.tokens, "per_token": round(s.per_token, 6),
                      "normalized": round(s.normalized, 6)}
            if words:
                record.update(word_scores(translator.tokenizer.tgt_pieces(ids), logprobs).as_json())
            lines.append(json.dumps(record, ensure_ascii=False) if as_json or words else
                         f"{s.logprob:.6f}\t{s.tokens}\t{s.per_token:.6f}\t{s.normalized:.6f}")
        progress.advance(len(src_ids))
    return lines


def _controls(lines: Iterable[str], count: int | None, prefix: Path | None, constraints: Path | None,
              sampling: bool, stdin_input: bool
              ) -> tuple[Iterable[str], list[str] | None, list[list[str]] | None]:
    """``translate --prefix`` and ``--constraints``: the input lines (checked against both files' line
    counts, ``_per_line``), the prefixes and each line's phrases (tab-separated). ConfigError where two of
    the input and these files would read stdin, and for constraints with sampling."""
    if sampling and constraints is not None:
        raise ConfigError("--constraints needs a search: it cannot be used with --sampling")
    readers = (["the input"] if stdin_input else []) + [
        f"{flag} -" for flag, path in (("--prefix", prefix), ("--constraints", constraints))
        if path is not None and str(path) == "-"]
    if len(readers) > 1:
        both = "both" if len(readers) == 2 else "all"
        raise ConfigError(f"{' and '.join(readers)} would {both} read stdin: give all but one of them as "
                          "files")
    prefixes = phrases = None
    if prefix is not None:
        lines, prefixes = _per_line(lines, prefix, count, "--prefix")
    if constraints is not None:
        lines, rows = _per_line(lines, constraints, count, "--constraints")
        phrases = [row.split("\t") if row else [] for row in rows]
    return lines, prefixes, phrases


def _per_line(lines, path: Path, count: int | None, option: str) -> tuple[Iterable[str], list[str]]:
    """``translate --prefix`` or ``--constraints``: the file's lines, and the input lines checked to be as
    many (DataError, before any work when the input's lines are counted ahead; for a pipe, as soon as it
    runs out)."""
    from ..data.readers import read_lines

    prefixes = list(read_lines(path))

    def mismatch(n: int | str) -> DataError:
        return DataError(f"{option} {path} has {len(prefixes)} lines, but the input has {n}")

    if count is not None and count != len(prefixes):
        raise mismatch(count)

    def checked() -> Iterator[str]:
        n = 0
        for line in lines:
            if n == len(prefixes):
                raise mismatch("more")
            n += 1
            yield line
        if n != len(prefixes):
            raise mismatch(n)

    return checked(), prefixes


def _sampling(sampling: bool, beam_size: int | None, temperature: float | None, top_k: int | None,
              top_p: float | None, seed: int | None):
    """``translate``'s sampling options as a ``decode.Sampling`` (None without --sampling), checked."""
    from ..decoding.search import Sampling, check_sampling

    given = {"--temperature": temperature, "--top-k": top_k, "--top-p": top_p, "--seed": seed}
    if not sampling:
        named = [flag for flag, value in given.items() if value is not None]
        if named:
            raise ConfigError(f"{named[0]} is a sampling option: add --sampling")
        return None
    if beam_size is not None and beam_size > 1:
        raise ConfigError(f"--sampling draws instead of searching: it cannot be used with --beam-size "
                          f"{beam_size}")
    values = (1.0 if temperature is None else temperature, top_k or 0, 1.0 if top_p is None else top_p,
              1 if seed is None else seed)
    try:  # the library's one rule, each option named as the command line spells it
        check_sampling(*values, named=lambda name: "--" + name.replace("_", "-"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return Sampling(*values)


EVAL_INPUTS = ("model", "src", "hyp", "ref", "ensemble", "shortlist")  # the paths eval reads (contract.py)


@command("eval", inputs=EVAL_INPUTS, outputs={"hyp_out": Output()})
def eval_(
    model: Annotated[Path | None, typer.Argument(help="A checkpoint or run folder; omit with --hyp.",
                                                 show_default=False)] = None,
    src: Annotated[Path | None, typer.Option("--src", help="Source file to translate and score.")] = None,
    hyp: Annotated[Path | None, typer.Option("--hyp", help="Existing translations to score "
                                             "(instead of MODEL --src).")] = None,
    ref: Annotated[list[Path] | None, typer.Option("--ref", help="Reference file "
                                                   "(repeat for several references).")] = None,
    metrics: Annotated[Metrics, typer.Option("--metrics", parser=Metrics.parse, metavar="LIST",
                                             help="Comma-separated: bleu, chrf, ter.")] = "bleu,chrf,ter",
    lowercase: Annotated[bool, typer.Option("--lowercase", "-lc", help="Case-insensitive scores.")] = False,
    tokenize: Annotated[BleuTokenizer | None, typer.Option(
        "--tokenize", help="BLEU tokenizer (default: from the target language, else 13a).")] = None,
    tgt_lang: Annotated[str | None, typer.Option("--tgt-lang", help="Target language code (picks BLEU's "
                                                 "tokenizer, e.g. zh; and a multilingual model's "
                                                 "output language).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    ensemble: Annotated[list[Path] | None, typer.Option("--ensemble", help="Another model to average with "
                                                        "MODEL step by step (repeat for more; one "
                                                        "tokenizer).", show_default=False)] = None,
    hyp_out: Annotated[Path | None, typer.Option("--hyp-out",
                                                 help="Also write the translations here.")] = None,
    beam_size: BeamOpt = None,
    max_tokens: MaxTokensOpt = None,
    length_penalty: LengthPenaltyOpt = None,
    int8: Int8Opt = False,
    shortlist: ShortlistOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Score translations with sacrebleu: translate --src with MODEL, or score --hyp; against --ref."""
    from ..data.arrival import chunks
    from ..data.readers import read_lines
    from ..decoding.metrics import bleu_tokenize, read_references, score_corpus
    from ..errors import ConfigError
    from ..runfiles import atomic_write_text

    if not ref:
        raise ConfigError("--ref is required")
    if (hyp is None) == (model is None or src is None):
        raise ConfigError("give either MODEL --src FILE, or --hyp FILE")
    bleu = tokenize.value if tokenize is not None else None
    if bleu is not None or hyp is not None:
        bleu_tokenize(tgt_lang, bleu)  # a scorer that cannot run is refused before any work
    references = read_references(ref)
    if hyp is not None:
        hypotheses, name, lang = list(read_lines(hyp)), str(hyp), tgt_lang
    else:
        from ..decoding.translator import DecodeOverrides

        overrides = DecodeOverrides(beam_size, 1, length_penalty, max_tokens, tgt_lang=tgt_lang,
                                    int8=int8 or None)
        translator, cfg, _ = open_translator(model, device, overrides, ensemble=ensemble, shortlist=shortlist)
        lang = tgt_lang or cfg.data.tgt_lang
        bleu_tokenize(lang, bleu)  # a scorer that cannot run is refused before the translating
        sources, hypotheses, name = list(read_lines(src)), [], f"translations of {src}"
        with FileProgress(len(sources), "translating") as progress:
            for chunk in chunks(sources, CHUNK_LINES):
                hypotheses += translator.best(chunk)
                progress.advance(len(chunk))
        if hyp_out is not None:
            atomic_write_text(hyp_out, "".join(h + "\n" for h in hypotheses))
    scores = score_corpus(hypotheses, name, references, metrics.names, tgt_lang=lang, tokenize=bleu,
                          lowercase=lowercase)
    if json_:
        typer.echo(json.dumps([s.as_dict() for s in scores.values()], ensure_ascii=False))
    else:
        from .reporting import print_scores

        print_scores(scores)


@command(inputs=("model", "src", "tgt"), outputs={"output": Output()})
def score(
    model: ModelArg,
    src: Annotated[Path, typer.Option("--src", help="Source sentences, one per line.", show_default=False)],
    tgt: Annotated[Path, typer.Option("--tgt", help="The translations to score, one per source line.",
                                      show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o",
                                                help="Write here (atomically) instead of stdout.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of TSV.")] = False,
    words: Annotated[bool, typer.Option("--words", help="Each translation's words with their "
                                        "probabilities too, and the end's (JSON lines).")] = False,
    max_tokens: MaxTokensOpt = None,
    length_penalty: LengthPenaltyOpt = None,
    tgt_lang: TgtLangOpt = None,
    int8: Int8Opt = False,
    device: DeviceOpt = "auto",
) -> None:
    """The model's log-probability of each given translation, under teacher forcing, in input order.

    One line per pair: the sum of the log-probabilities of its pieces (EOS included), the pieces counted
    (EOS included), the mean per piece, and the sum over the GNMT length penalty (decode.length_penalty,
    or --length-penalty): the score beam search ranks by and translate --nbest prints. TSV, or --json;
    --words adds each word's probability and the end's (JSON).
    """
    from ..runfiles import atomic_write_text
    from .common import read_pairs, write_output

    sources, targets = read_pairs(src, tgt)
    from ..decoding.translator import DecodeOverrides

    overrides = DecodeOverrides(None, 1, length_penalty, max_tokens, tgt_lang=tgt_lang, int8=int8 or None)
    translator, _, _ = open_translator(model, device, overrides)
    with FileProgress(len(sources), "scoring") as progress:
        lines = _scored_lines(translator, sources, targets, json_, words, progress)
    text = "".join(line + "\n" for line in lines)
    if output is not None:
        atomic_write_text(output, text)
    else:
        write_output(None, text)
