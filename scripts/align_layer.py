"""An alignment layer on a model that exists, in one command: the translation frozen (it goes on translating
bit for bit as before), only the layer learning (``train.alignment.module: layer``, ``translation: frozen``),
taught by eflomal, by a Pharaoh file of yours, or by no teacher at all.

    python scripts/align_layer.py RUN --out DIR [--teacher self|eflomal|FILE] [--reverse REVERSE_RUN]
        [--steps N] [--src TEST_SRC --tgt TEST_TGT --gold TEST_LINKS]

RUN is a trained run folder (``attnmt train``) whose ``data.train`` is one file pair (the teacher aligns
those files, line for line): its resolved config, tokenizer and prepared data are reused, so nothing is
prepared again. Steps, each skipped when its result is already in ``--out`` (run it again to go on after a
stop; an ``--out`` made with another teacher is refused):

1. ``--teacher self`` (the default; Zenkel et al. 2019, 2020): ``OUT/predict``, a layer that learns to
   predict each target piece from the source alone through its own attention (``objective: predict``), then
   ``OUT/train.align``, its links of the training corpus (``attnmt align OUT/predict``); with
   ``--reverse``, a run trained the other way on the same files, ``OUT/predict_reverse`` too, and the links
   are the two directions' symmetrised (``attnmt align OUT/predict --reverse OUT/predict_reverse``,
   grow-diag-final-and: Zenkel et al. 2020's bidirectional route);
   ``--teacher eflomal``: ``OUT/train.align`` by ``scripts/eflomal_align.py``; ``--teacher FILE``: that
   Pharaoh file (one line per line of the training corpus as read).
2. ``OUT/layer``: the layer taught those links (``objective: links``); after ``predict`` it starts from that
   layer's weights (guided self-training on its own links).
3. ``OUT/summary.json``: the teacher, the links taught and the minutes each step took (when it was done);
   with ``--src``/``--tgt``/``--gold`` (a held-out split and reference links, such as eflomal's) also
   precision, recall, F1 and AER of RUN's own reading, of ``predict`` and of ``layer``, each as ``attnmt
   align`` reads it by default (RUN: its cross-attention; the layers: the alignment layer).

Each layer trains ``--steps`` optimizer steps (default 1000) at the run's token budget, validated once at
the end; ``--full-context`` gives the layer the queries of a decoder pass that sees the whole target;
``--shift`` gives the links layer (not ``predict``, which would see the piece it predicts) the queries of
the positions where its pieces are the input (``train.alignment.shift``);
``--set KEY=VALUE`` goes to both trainings.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from scriptargs import InputFile, Model, Number, OutputFolder, ScriptParser, guarded, require_module

from attnmt.config.jsonfile import read_json
from attnmt.errors import CheckpointError, ConfigError

REPO = Path(__file__).resolve().parents[1]
ATTNMT = [sys.executable, "-m", "attnmt"]
MARKER = "align_layer.json"  # in --out: the folder is this script's own


def run(command: list[str]) -> str:
    """Run a command; its stdout, or exit with its own error line and code."""
    result = subprocess.run([str(c) for c in command], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        sys.exit(result.returncode)
    return result.stdout


def trained(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "latest.json").exists()


def layer_config(base: dict, out: Path, init_from: Path, alignment: dict, steps: int) -> Path:
    """RUN's resolved config with the translation frozen under an alignment layer, ``steps`` steps of it,
    validated once (its BLEU cannot move), written to ``out``.yaml."""
    cfg = json.loads(json.dumps(base))
    train = cfg["train"]
    train.pop("run_dir", None)
    train.update(init_from=str(init_from), max_steps=steps, max_minutes=0, max_epochs=10_000,
                 eval_every=steps, save_every=steps, keep_last=2, average_last=0,
                 warmup_steps=min(100, max(steps // 10, 1)), patience=0,
                 alignment={"module": "layer", "translation": "frozen", **alignment})
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def train_layer(args: argparse.Namespace, base: dict, name: str, init_from: Path, alignment: dict,
                run_dir: Path | None = None) -> None:
    """Train one frozen-translation layer into ``OUT/name``, on the prepared data of RUN (or of
    ``run_dir``, whose resolved config ``base`` is), copied in."""
    folder, source = args.out / name, run_dir or args.run
    if not (folder / "config.yaml").exists():  # copied last: without it, a copy stopped halfway
        for part in ("data", "tokenizer"):
            shutil.copytree(source / part, folder / part, dirs_exist_ok=True)
        shutil.copy(source / "config.yaml", folder / "config.yaml")
    config = layer_config(base, args.out / name, init_from, alignment, args.steps)
    sets = [x for s in args.sets for x in ("--set", s)]
    run([*ATTNMT, "train", config, "--run-dir", folder, *sets])


def score(model: Path, args: argparse.Namespace) -> dict:
    """``attnmt align MODEL`` on the held-out split against its reference links, as it reads by default."""
    found = json.loads(run([*ATTNMT, "align", model, "--src", args.src, "--tgt", args.tgt, "--gold",
                            args.gold, "--json"]))
    precision, recall = found["precision"], found["recall"]
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": round(f1, 6), "aer": found["aer"],
            "layer": found["layer"]}


def check_options(args: argparse.Namespace) -> None:
    """The test options come together; ``--teacher`` is one this script knows; ``--out`` is new, empty or
    this script's own for the same teacher (its steps' results would be taken as this call's)."""
    given = [name for name in ("src", "tgt", "gold") if getattr(args, name) is not None]
    if given and len(given) != 3:
        raise ConfigError(f"--{given[0]} needs --src, --tgt and --gold together (a split and its links)")
    if args.teacher == "eflomal":
        require_module("eflomal", "--teacher eflomal needs eflomal: pip install -e '.[align]'")
    elif args.teacher != "self" and not Path(args.teacher).is_file():
        raise ConfigError(f"--teacher {args.teacher}: expected self, eflomal or a Pharaoh file")
    if args.shift and args.full_context:
        raise ConfigError("--shift goes with the causal pass's queries, not with --full-context")
    if args.reverse is not None and args.teacher != "self":
        raise ConfigError(f"--reverse goes with --teacher self (the two directions' links symmetrised), not "
                          f"with --teacher {args.teacher}")
    marker = args.out / MARKER
    if args.out.is_dir() and any(args.out.iterdir()) and not marker.is_file():
        raise ConfigError(f"--out {args.out} holds files this script did not write; give a new or empty "
                          "folder")
    if marker.is_file():
        made = read_json(marker, ConfigError).get("teacher")
        if made != made_by(args):
            raise ConfigError(f"--out {args.out} was made with --teacher {made}; give another folder for "
                              f"--teacher {made_by(args)}")


def teacher_name(teacher: str) -> str:
    """How the marker records a teacher: ``self``, ``eflomal`` or the file's absolute path."""
    return teacher if teacher in ("self", "eflomal") else str(Path(teacher).resolve())


def made_by(args: argparse.Namespace) -> str:
    """The teacher as the marker records it, with ``--reverse``'s run."""
    reverse = f" --reverse {Path(args.reverse).resolve()}" if args.reverse is not None else ""
    return teacher_name(args.teacher) + reverse


def check_run(run: Path) -> dict:
    """Before any work: RUN is a trained run folder with its prepared data, trained on one file pair (the
    teacher aligns that corpus's files, line for line); its resolved config, as a dict."""
    from attnmt.config.schema import load_config

    for part in ("config.yaml", "data", "tokenizer"):
        if not (run / part).exists():
            raise ConfigError(f"RUN {run}: not a run folder this script can reuse ({part} is missing)")
    if not trained(run):
        raise CheckpointError(f"RUN {run}: no checkpoint yet (checkpoints/latest.json); train it first")
    corpora = load_config(run / "config.yaml").data.corpora()
    where = f"RUN {run}: data.train"
    if len(corpora) != 1:
        raise ConfigError(f"{where}: {len(corpora)} corpora; the teacher aligns one, given as data.train.src "
                          "and .tgt files")
    if corpora[0].format != "text":
        raise ConfigError(f"{where}: format {corpora[0].format} is not a file pair; the teacher aligns the "
                          "training corpus given as data.train.src and .tgt files")
    return yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))


def check_reverse(reverse: Path, corpus: dict) -> dict:
    """``--reverse``: a run folder like RUN's, trained on RUN's training files the other way round; its
    resolved config, as a dict."""
    base = check_run(reverse)
    theirs = base["data"]["train"]
    if (Path(theirs["src"]).resolve(), Path(theirs["tgt"]).resolve()) != (Path(corpus["tgt"]).resolve(),
                                                                        Path(corpus["src"]).resolve()):
        raise ConfigError(f"--reverse {reverse}: trained on {theirs['src']} -> {theirs['tgt']}, not on RUN's "
                          f"training files the other way ({corpus['tgt']} -> {corpus['src']})")
    return base


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("run", type=Model(checkpoints=False), help="a trained run folder")
    ap.add_argument("--out", type=OutputFolder(), required=True, help="folder for the layers and summary")
    ap.add_argument("--teacher", default="self",
                    help="self (no teacher: predict, then its own links), eflomal, or a Pharaoh file")
    ap.add_argument("--reverse", type=Model(checkpoints=False), help="--teacher self: a run trained the "
                    "other way on the same files; the links are both directions' symmetrised")
    ap.add_argument("--steps", type=Number(int, low=1), default=1000, help="optimizer steps of each layer")
    ap.add_argument("--full-context", action="store_true", help="queries from a pass that sees the whole "
                    "target")
    ap.add_argument("--shift", action="store_true", help="the links layer's query for a piece is the "
                    "decoder's state where that piece is the input (train.alignment.shift; not predict's)")
    ap.add_argument("--src", type=InputFile(), help="held-out sources to score on")
    ap.add_argument("--tgt", type=InputFile(), help="their targets")
    ap.add_argument("--gold", type=InputFile(), help="their reference links (Pharaoh)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every training (repeatable)")
    ap.checks += [check_options]
    return ap


def teach(args: argparse.Namespace, base: dict, step) -> Path:
    """Steps 1 and 2: the teacher's links of the training corpus, then the layer taught them; the links'
    file."""
    corpus = base["data"]["train"]
    context = {"full_context": True} if args.full_context else {}
    links, start = args.out / "train.align", args.run
    if args.teacher == "self":
        step("predict", trained(args.out / "predict"), train_layer, args, base, "predict", start,
             {"objective": "predict", **context})
        both = []
        if args.reverse is not None:
            step("predict_reverse", trained(args.out / "predict_reverse"), train_layer, args,
                 check_reverse(args.reverse, corpus), "predict_reverse", args.reverse,
                 {"objective": "predict", **context}, args.reverse)
            both = ["--reverse", args.out / "predict_reverse"]
        step("align", links.exists(), run, [*ATTNMT, "align", args.out / "predict", "--src", corpus["src"],
                                            "--tgt", corpus["tgt"], *both, "-o", links])
        start = args.out / "predict"
    elif args.teacher == "eflomal":
        step("align", links.exists(), run, [sys.executable, REPO / "scripts" / "eflomal_align.py", "--src",
                                            corpus["src"], "--tgt", corpus["tgt"], "-o", links])
    else:
        links = Path(args.teacher)
    shift = {"shift": True} if args.shift else {}
    step("layer", trained(args.out / "layer"), train_layer, args, base, "layer", start,
         {"objective": "links", "path": str(links), **context, **shift})
    return links


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # Absolute paths: the attnmt commands run in the repository, not in the caller's folder.
    for name in ("run", "reverse", "out", "src", "tgt", "gold"):
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    args.teacher = teacher_name(args.teacher)
    base = check_run(args.run)
    if args.reverse is not None:
        check_reverse(args.reverse, base["data"]["train"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / MARKER).write_text(json.dumps({"teacher": made_by(args)}) + "\n", encoding="utf-8")
    done_before = args.out / "summary.json"
    minutes: dict[str, float] = {}
    if done_before.is_file():  # the minutes of steps an earlier call did
        minutes = read_json(done_before, ConfigError).get("minutes", {})

    def step(name: str, done: bool, work, *how) -> None:
        if done:
            return
        print(f"align_layer: {name}", flush=True)
        started = time.perf_counter()
        work(*how)
        minutes[name] = round((time.perf_counter() - started) / 60, 2)

    links = teach(args, base, step)
    summary: dict = {"teacher": args.teacher, "links": str(links), "minutes": minutes}
    if args.reverse is not None:
        summary["reverse"] = str(args.reverse)
    if args.gold is not None:
        summary["run"] = score(args.run, args)
        for name in ("predict", "layer"):
            if trained(args.out / name):
                summary[name] = score(args.out / name, args)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
