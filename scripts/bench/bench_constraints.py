"""Lexical constraints on a test set (``translate --constraints``): phrases taken from the reference, as
Post & Vilar (2018) and Hu et al. (2019) do, beside the free search: the share of phrases the outputs
hold, BLEU and chrF (sacrebleu), per beam size and number of phrases per sentence.

    python scripts/bench/bench_constraints.py runs/m30k \\
        --src ../shared/data/multi30k/test_2016_flickr.de.gz \\
        --ref ../shared/data/multi30k/test_2016_flickr.en.gz --phrases 1 2 --beam-sizes 5

Each sentence's phrases are spans of 1 to ``--max-words`` words of its reference, chosen at random
(``--seed``) without overlapping, with the punctuation at their ends taken off; a sentence whose
reference is too short for them gets fewer. A phrase is met when the output's text holds it.
"""

from __future__ import annotations

import json
import random
import string
import sys
import time
from pathlib import Path

import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from scriptargs import InputFile, Model, Number, OutputFile, ScriptParser, guarded

from attnmt.cli.common import open_translator
from attnmt.data.readers import read_lines
from attnmt.decoding.translator import DecodeOverrides
from attnmt.errors import DataError


def reference_phrases(reference: str, count: int, max_words: int, rng: random.Random) -> list[str]:
    """Up to ``count`` non-overlapping spans of 1..max_words words of ``reference``, in reference order."""
    words = reference.split()
    free, spans = set(range(len(words))), []
    for _ in range(count):
        length = rng.randint(1, max_words)
        starts = [i for i in range(len(words) - length + 1) if all(j in free for j in range(i, i + length))]
        if not starts:
            continue
        start = rng.choice(starts)
        free -= set(range(start, start + length))
        phrase = " ".join(words[start:start + length]).strip(string.punctuation + " ")
        if phrase:
            spans.append((start, phrase))
    return [phrase for _, phrase in sorted(spans)]


def run(translator, sources: list[str], references: list[str],
        phrases: list[list[str]] | None) -> tuple[dict, list[str]]:
    started = time.perf_counter()
    found = translator.translate(sources, constraints=phrases)
    seconds = time.perf_counter() - started
    outputs = [t.outputs[0][0] for t in found]
    wanted = [p for line in phrases for p in line] if phrases else []
    met = sum(p in out for out, line in zip(outputs, phrases or []) for p in line)
    return {"bleu": round(sacrebleu.corpus_bleu(outputs, [references]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(outputs, [references]).score, 2),
            "phrases": len(wanted), "met": round(met / len(wanted), 4) if wanted else None,
            "seconds": round(seconds, 1)}, outputs


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__)
    parser.add_argument("model", type=Model(exports=True))
    parser.add_argument("--src", type=InputFile(pipes=True), required=True)
    parser.add_argument("--ref", type=InputFile(pipes=True), required=True)
    parser.add_argument("--phrases", type=Number(int, low=1), nargs="+", default=[1, 2],
                        help="Phrases per sentence.")
    parser.add_argument("--max-words", type=Number(int, low=1), default=3, help="Words per phrase, at most.")
    parser.add_argument("--beam-sizes", type=Number(int, low=1), nargs="+", default=[5])
    parser.add_argument("--seed", type=Number(int), default=1)
    parser.add_argument("--json", type=OutputFile(), help="Write the results here too.")
    return parser


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sources, references = list(read_lines(args.src)), list(read_lines(args.ref))
    if len(sources) != len(references):
        raise DataError(f"{args.src} has {len(sources)} lines, {args.ref} has {len(references)}")
    rows = []
    for beam in args.beam_sizes:
        translator, _, _ = open_translator(args.model, overrides=DecodeOverrides(beam))
        free, outputs = run(translator, sources, references, None)
        rows.append({"beam": beam, "search": "free", **free})
        print(rows[-1], flush=True)
        for count in args.phrases:
            rng = random.Random(args.seed)
            phrases = [reference_phrases(ref, count, args.max_words, rng) for ref in references]
            # The free search's share of the same phrases: how many it holds without being told.
            held = sum(p in out for out, line in zip(outputs, phrases) for p in line)
            total = sum(len(line) for line in phrases)
            found, _ = run(translator, sources, references, phrases)
            rows.append({"beam": beam, "search": f"{count} reference phrase(s) per sentence",
                         "free_met": round(held / total, 4), **found})
            print(rows[-1], flush=True)
    print("\n| beam | search | phrases | held by the free search | held | BLEU | chrF | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        free_met = f"{row['free_met']:.1%}" if "free_met" in row else ""
        met = f"{row['met']:.1%}" if row["met"] is not None else ""
        print(f"| {row['beam']} | {row['search']} | {row['phrases'] or ''} | {free_met} | {met} | "
              f"{row['bleu']} | {row['chrf']} | {row['seconds']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
