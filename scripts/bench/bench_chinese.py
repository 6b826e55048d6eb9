"""Tatoeba English <-> Chinese: attnmt beside JoeyNMT 2.3.0 on the same data, tokenization, model dims and
training budget, one after the other; test BLEU (sacrebleu's zh tokenizer for a Chinese target, 13a for
English) and chrF, greedy and beam 5, of each engine's best checkpoint by dev BLEU.

    python scripts/bench/bench_chinese.py --direction en-zh --minutes 30
    python scripts/bench/bench_chinese.py --direction zh-en --minutes 30 \\
        --attnmt-run runs/tatoeba_zh_en_transformer

attnmt trains ``configs/tatoeba_<src>_<tgt>_transformer.yaml`` with ``train.max_minutes`` (or an existing
run folder is scored as it is). JoeyNMT then trains on exactly the training pairs attnmt kept (its prepared
``data/train`` split, cleaned and length-filtered) with attnmt's sentencepiece models (JoeyNMT reads the
same pieces), the same dims (layers, width, heads, feed-forward size, dropout, which embeddings are tied)
and the same token budget per batch; its optimiser settings are the peers' template's
(``../shared/peers/joey_transformer.yaml``). JoeyNMT has no wall-clock limit, so it is stopped with SIGINT
after the budget (as ``../shared/peers/run_joey.sh`` does; the budget covers start-up and validations, as
attnmt's ``max_minutes`` covers its validations). Its test translations come from the peers'
``../shared/peers/joey_decode.py`` and are scored here, with attnmt's metrics (the same sacrebleu). Needs
the peers' environment: ``bash ../shared/peers/setup.sh``; ``--no-joey`` leaves JoeyNMT out (attnmt's rows
alone: CI's smoke run, on any run folder with a test set).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO
from scriptargs import Model, Number, OutputFolder, ScriptParser, guarded

from attnmt.errors import ConfigError

PEERS = REPO.parent / "shared" / "peers"
ANCHORS = Path(os.environ.get("ANCHORS_DIR", Path.home() / ".cache" / "attnmt-anchors"))
JOEY_PY = ANCHORS / "venv" / "bin" / "python"
ATTNMT = [sys.executable, "-m", "attnmt"]


def attnmt_train(direction: str, minutes: float, run: Path) -> None:
    src, tgt = direction.split("-")
    config = REPO / "configs" / f"tatoeba_{src}_{tgt}_transformer.yaml"
    started = time.perf_counter()
    subprocess.run([*ATTNMT, "train", str(config), "--run-dir", str(run), "--set",
                    f"train.max_minutes={minutes}"], check=True, cwd=REPO)
    print(f"attnmt trained in {(time.perf_counter() - started) / 60:.1f} min of wall time", flush=True)


def export(run: Path, work: Path) -> dict:
    """The run's training pairs and the dev/test sets as plain files for JoeyNMT, its sentencepiece model,
    and a JoeyNMT vocabulary file (the pieces in id order)."""
    from attnmt.config.schema import load_config
    from attnmt.data.batching import load_split
    from attnmt.data.readers import read_corpus
    from attnmt.data.tokenizer import load_tokenizer
    from attnmt.runfiles import RunDir

    cfg = load_config(RunDir(run).config)
    src, tgt = cfg.data.src_lang, cfg.data.tgt_lang
    work.mkdir(parents=True, exist_ok=True)
    train = load_split(RunDir(run), "train")  # the pairs prepare kept, cleaned, as the run trained on them
    files = {"train": (train.src_text, train.tgt_text)}
    for split in ("dev", "test"):
        corpus = read_corpus(getattr(cfg.data, split), split)
        files[split] = (corpus.src, corpus.tgt)
    for split, (sources, targets) in files.items():
        (work / f"{split}.{src}").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
        (work / f"{split}.{tgt}").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
    tokenizer = load_tokenizer(RunDir(run).tokenizer)
    sides = {"src": (tokenizer.src_model, tokenizer.src_pieces(list(range(tokenizer.src_vocab_size)))),
             "trg": (tokenizer.tgt_model, tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size))))}
    for side, (model, pieces) in sides.items():
        (work / f"{side}.spm.model").write_bytes(model)
        (work / f"{side}.vocab.txt").write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    return {"cfg": cfg, "src": src, "tgt": tgt, "work": work, "joint": tokenizer.joint}


def joey_config(info: dict) -> Path:
    """The peers' JoeyNMT template with this data, attnmt's recipe dims and batch budget."""
    cfg, work, src, tgt = info["cfg"], info["work"], info["src"], info["tgt"]
    joey = yaml.safe_load((PEERS / "joey_transformer.yaml").read_text(encoding="utf-8"))
    joey["name"] = f"tatoeba_{src}_{tgt}"
    joey["model_dir"] = str(work / "model")
    joey["data"].update(train=str(work / "train"), dev=str(work / "dev"), test=str(work / "test"))
    for side, lang in (("src", src), ("trg", tgt)):
        joey["data"][side].update(lang=lang, voc_file=str(work / f"{side}.vocab.txt"),
                                  tokenizer_cfg={"model_file": str(work / f"{side}.spm.model")})
    joey["testing"]["sacrebleu_cfg"]["tokenize"] = "zh" if tgt.startswith("zh") else "13a"
    m = cfg.model
    # As attnmt's model: source and target embeddings shared only over one joint vocabulary; the output
    # layer tied to the target embeddings.
    joey["model"]["tied_embeddings"] = bool(info["joint"] and m.share_embeddings)
    joey["model"]["tied_softmax"] = bool(m.tie_output)
    for part in ("encoder", "decoder"):
        layers = m.enc_layers if part == "encoder" else m.dec_layers
        joey["model"][part].update(num_layers=layers, num_heads=m.n_heads, hidden_size=m.d_model,
                                   ff_size=m.d_ff, dropout=m.dropout, layer_norm=m.norm)
        joey["model"][part]["embeddings"].update(embedding_dim=m.d_model, dropout=m.dropout)
    joey["training"].update(batch_size=cfg.train.max_tokens, validation_freq=cfg.train.eval_every,
                            overwrite=True)
    path = work / "joey.yaml"
    path.write_text(yaml.safe_dump(joey, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def joey_train(config: Path, minutes: float) -> float:
    started = time.perf_counter()
    with open(config.with_name("joey_train.out"), "w", encoding="utf-8") as log:
        subprocess.run(["timeout", "-s", "INT", "-k", "300", str(int(minutes * 60)), str(JOEY_PY), "-m",
                        "joeynmt", "train", str(config), "--skip-test"], stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    print(f"JoeyNMT trained for {seconds / 60:.1f} min of wall time", flush=True)
    return seconds


def score(info: dict, hyps: list[str], metrics=("bleu", "chrf")) -> dict:
    from attnmt.decoding.metrics import corpus_scores

    refs = (info["work"] / f"test.{info['tgt']}").read_text(encoding="utf-8").splitlines()
    scores = corpus_scores(hyps, [refs], metrics, tgt_lang=info["tgt"])
    return {name: {"score": round(s.score, 2), "signature": s.signature} for name, s in scores.items()}


def joey_test(info: dict, config: Path, beam: int) -> dict:
    model = info["work"] / "model"
    ckpt = model / "best.ckpt" if (model / "best.ckpt").exists() else model / "latest.ckpt"
    out = info["work"] / f"joey.test.beam{beam}.{info['tgt']}"
    subprocess.run([str(JOEY_PY), str(PEERS / "joey_decode.py"), str(config), "--ckpt", str(ckpt), "--split",
                    "test", "--beam", str(beam), "--batch-size", "64", "--threads", "2", "--out", str(out)],
                   check=True, capture_output=True, text=True)
    hyps = out.read_text(encoding="utf-8").splitlines()
    return {"engine": "JoeyNMT 2.3.0", "beam": beam, "checkpoint": ckpt.resolve().name, **score(info, hyps)}


def attnmt_test(info: dict, run: Path, beam: int) -> dict:
    work = info["work"]
    hyps = work / f"attnmt.test.beam{beam}.{info['tgt']}"
    subprocess.run([*ATTNMT, "translate", str(run), "-i", str(work / f"test.{info['src']}"), "-o", str(hyps),
                    "--beam-size", str(beam)], check=True, cwd=REPO)
    return {"engine": "attnmt", "beam": beam, **score(info, hyps.read_text(encoding="utf-8").splitlines())}


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("--direction", choices=["en-zh", "zh-en"], required=True)
    ap.add_argument("--minutes", type=Number(float, above=0), default=30)
    ap.add_argument("--attnmt-run", type=Model(checkpoints=False),
                    help="score this run folder instead of training one")
    ap.add_argument("--work", type=OutputFolder(),
                    help="JoeyNMT's folder (default: $ANCHORS_DIR/tatoeba_<direction>)")
    ap.add_argument("--no-joey", action="store_true", help="attnmt alone: no JoeyNMT (nor its environment)")
    return ap


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if not JOEY_PY.exists() and not args.no_joey:
        raise ConfigError(f"no JoeyNMT environment at {JOEY_PY}: bash {PEERS}/setup.sh (or --no-joey)")
    src, tgt = args.direction.split("-")
    # absolute: attnmt runs in the repository
    run = (args.attnmt_run or REPO / "runs" / f"tatoeba_{src}_{tgt}_transformer").resolve()
    if args.attnmt_run is None:
        attnmt_train(args.direction, args.minutes, run)
    info = export(run, (args.work or ANCHORS / f"tatoeba_{args.direction}").resolve())
    config = None if args.no_joey else joey_config(info)
    joey = "JoeyNMT left out" if config is None else \
        f"JoeyNMT ran {joey_train(config, args.minutes) / 60:.1f}"
    rows = [attnmt_test(info, run, beam) for beam in (1, 5)]
    rows += [joey_test(info, config, beam) for beam in (1, 5)] if config is not None else []
    for row in rows:
        print("RESULT " + json.dumps(row, ensure_ascii=False), flush=True)
    print(f"\n{args.direction}, {args.minutes:g} minutes each ({joey}):")
    print(f"{'engine':<16}{'beam':>5}{'BLEU':>8}{'chrF':>8}")
    for row in rows:
        print(f"{row['engine']:<16}{row['beam']:>5}{row['bleu']['score']:>8.2f}{row['chrf']['score']:>8.2f}")
    print(f"\nBLEU {rows[0]['bleu']['signature']}\nchrF {rows[0]['chrf']['signature']}")


if __name__ == "__main__":
    main()
