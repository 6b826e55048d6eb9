"""Target-prefix decoding on a test set: the reference's first N words forced (``translate --prefix``)
beside the free search, BLEU and chrF of the whole outputs against the references (sacrebleu), greedy
and beam.

    python scripts/bench/bench_prefix.py runs/m30k --src ../shared/data/multi30k/test_2016_flickr.de.gz \\
        --ref ../shared/data/multi30k/test_2016_flickr.en.gz --words 3

Forcing the reference's opening words gives the search the right start (and those words for free), so
BLEU should rise; how much it rises after the prefix is what the model makes of a given start.
"""

from __future__ import annotations

import json
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


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__)
    parser.add_argument("model", type=Model(exports=True))
    parser.add_argument("--src", type=InputFile(pipes=True), required=True)
    parser.add_argument("--ref", type=InputFile(pipes=True), required=True)
    parser.add_argument("--words", type=Number(int, low=1), default=3,
                        help="The reference's first N words are forced.")
    parser.add_argument("--beam-sizes", type=Number(int, low=1), nargs="+", default=[1, 5])
    parser.add_argument("--json", type=OutputFile(), help="Write the results here too.")
    return parser


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sources, references = list(read_lines(args.src)), list(read_lines(args.ref))
    if len(sources) != len(references):
        raise DataError(f"{args.src} has {len(sources)} lines, {args.ref} has {len(references)}")
    prefixes = [" ".join(ref.split()[:args.words]) for ref in references]
    rows = []
    for beam in args.beam_sizes:
        translator, _, _ = open_translator(args.model, overrides=DecodeOverrides(beam))
        for name, given in (("free", None), (f"first {args.words} words forced", prefixes)):
            started = time.perf_counter()
            outputs = translator.best(sources) if given is None else [
                t.outputs[0][0] for t in translator.translate(sources, given)]
            seconds = time.perf_counter() - started
            starts = sum(out.startswith(p) for out, p in zip(outputs, prefixes)) / len(outputs)
            rows.append({"beam": beam, "search": name,
                         "bleu": round(sacrebleu.corpus_bleu(outputs, [references]).score, 2),
                         "chrf": round(sacrebleu.corpus_chrf(outputs, [references]).score, 2),
                         "starts_with_reference_prefix": round(starts, 4), "seconds": round(seconds, 1)})
            print(rows[-1], flush=True)
    print("\n| beam | search | BLEU | chrF | outputs that start with the reference's words | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['beam']} | {row['search']} | {row['bleu']} | {row['chrf']} | "
              f"{row['starts_with_reference_prefix']:.1%} | {row['seconds']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
