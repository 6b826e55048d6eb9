"""OPUS-MT into attnmt on the CPU: what each step of "Marian folder -> attnmt checkpoint -> fine-tuned" costs,
with a model of opus-mt-en-de's size and random weights (speed does not depend on the weights); about 15
minutes on 2 cores (``python scripts/bench/bench_opus_mt.py --out FILE``).

1. The folder: a ``MarianMTModel`` of opus-mt-en-de's shape (d_model 512, 6+6 layers, 8 heads, ffn 2048,
   swish, scaled embeddings, 512 positions, ``final_logits_bias``, one vocabulary of 58,101 pieces: eos 0,
   unk 1, pad 58,100 the decoder start) and the hub model's generation config (num_beams 4, bad_words_ids
   [[pad]], max_length 512, renormalize_logits), by ``save_pretrained``; ``MarianTokenizer.save_pretrained``
   on two small sentencepiece models (``--spm-pieces`` unigram pieces, trained on ``--data``'s train.en.gz
   and train.de.gz) and a vocab.json padded with fillers (no segmentation makes them) up to 58,101 pieces.
2. ``python -m attnmt import FOLDER OUT.pt`` in a child process (wall, start-up included), then
   ``marian_io.import_marian`` and ``checkpoint.save_payload`` in this process.
3. ``--sentences`` test_2016_flickr.en.gz lines translated by both engines in this process (malloc tuned as
   ``attnmt translate`` tunes it, torch on ``--threads``) in ``--rounds`` of alternating order (ratio: the
   rounds' median), on the same file-order batches of ``--batch-size`` lines, text to text, at ``--beams``.
   attnmt: ``attnmt translate``'s Translator (``cli.common.open_translator``), a ``translate`` call a batch,
   decode settings forcing ``--length`` N pieces (``min_len`` N, ``max_len_a`` 0, ``max_len_b`` N, length
   penalty 1), then the EOS its search scores. HF: tokenizer, ``generate`` (``min_new_tokens`` N,
   ``max_new_tokens`` N + 1: the EOS that ``forced_eos_token_id`` forces) and ``batch_decode``: the same N + 1
   decoder steps. Checked: every HF output is N pieces and EOS; attnmt's on the warm-up batch are N pieces.
4. Fine-tuning in each of ``--precisions``: ``attnmt train CONFIG`` with ``train.init_from: OUT.pt`` (the
   imported model section repeated), ``--train-pairs`` pairs, ``train.max_tokens`` ``--batch-tokens``, 1 +
   ``--steps`` steps, each logged: seconds per step from metrics.jsonl's ``elapsed_s``, the first left out.
   HF, in a fresh process too (``hf_finetune``): attnmt's batches (``TokenBatchSampler``, the same seed) of
   the pairs as HF segments them, forward, label-smoothed (0.1) cross-entropy, backward, clipping to 1,
   AdamW (betas 0.9, 0.98), bf16 by autocast. Both before the translation, this process holding no model.

Each timing comes with the share of the CPUs other processes took meanwhile (``/proc/stat``). The report: a
Markdown table and ``--out``'s JSON; ``--work`` keeps the folder, checkpoint and runs. ``--smoke`` (CI): a
1+1-layer model of width 32 on the toy task, attnmt's commands in this process.
"""

from __future__ import annotations

import gzip
import io
import json
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO, attnmt, in_process
from scriptargs import InputFolder, Number, OutputFile, OutputFolder, ScriptParser, guarded

from attnmt.errors import ConfigError, DataError

DATA = REPO.parent / "shared" / "data" / "multi30k"  # --data's default
OUT = REPO / "runs" / "bench_opus_mt" / "results.json"  # --out's default
FILES = ("train.en.gz", "train.de.gz", "test_2016_flickr.en.gz")  # what --data must hold

# The Marian model: opus-mt-en-de's sizes (its shared vocabulary: eos 0, unk 1, pad, the decoder start)
SHAPE = {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab": 58101, "positions": 512}
SMOKE_SHAPE = {"d_model": 32, "layers": 1, "heads": 2, "ffn": 64, "vocab": 400, "positions": 128}


def cpu_mark() -> tuple[float, float, float]:
    """Now: wall seconds, busy CPU seconds (/proc/stat), this process's and its ended children's CPU."""
    ticks = [int(x) for x in Path("/proc/stat").read_text(encoding="utf-8").split("\n", 1)[0].split()[1:9]]
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    own = sum(u.ru_utime + u.ru_stime for u in usage)
    return time.perf_counter(), (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), own


def others(mark: tuple[float, float, float]) -> float:
    """The share of the CPUs that other processes (others' tests) took since ``mark``: they slow timings."""
    wall, busy, own = (b - a for a, b in zip(mark, cpu_mark()))
    return round(max(0.0, busy - own) / (wall * (os.cpu_count() or 1)), 3)


def corpus(args) -> tuple[list[str], list[str], list[str]]:
    """The training sources and targets (the sentencepiece models', the first --train-pairs fine-tune) and
    the test sources: --data's, or with --smoke the toy task's."""
    if args.smoke:
        from attnmt.data.toy import toy_pairs

        train, test = toy_pairs("train", 300, seed=1), toy_pairs("test", args.sentences, seed=2)
        return [p[0] for p in train], [p[1] for p in train], [p[0] for p in test]
    data = args.data or DATA
    src, tgt, test = (gzip.decompress((data / n).read_bytes()).decode("utf-8").splitlines() for n in FILES)
    if len(src) != len(tgt):
        raise DataError(f"{data}: {FILES[0]} has {len(src)} lines, {FILES[1]} {len(tgt)}")
    return src, tgt, test[:args.sentences]


def build_folder(folder: Path, shape: dict, src: list[str], tgt: list[str], pieces: int,
                 threads: int) -> dict:
    """The Marian folder (module docstring, 1); what it took and what it holds."""
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    start = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    models = {}
    for name, lines in (("source.spm", src), ("target.spm", tgt)):
        out = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=pieces,
                                       model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                       minloglevel=2, num_threads=threads)
        models[name] = out.getvalue()
    spm_s = time.perf_counter() - start
    known: dict[str, None] = {}
    for name, blob in models.items():
        (folder / name).write_bytes(blob)
        sp = spm.SentencePieceProcessor(model_proto=blob)
        known.update((sp.id_to_piece(i), None) for i in range(3, sp.get_piece_size()))
    real = ["</s>", "<unk>"] + [p for p in known if p not in ("</s>", "<unk>")]
    size = shape["vocab"]
    if len(real) >= size:
        raise ConfigError(f"the sentencepiece models have {len(real)} pieces, over the vocabulary's {size}")
    fillers = [f"zzzfiller{i}" for i in range(size - 1 - len(real))]  # pieces no segmentation makes
    vocab = {p: i for i, p in enumerate(real + fillers + ["<pad>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    pad, layers, heads, ffn = size - 1, shape["layers"], shape["heads"], shape["ffn"]
    torch.manual_seed(1)
    config = MarianConfig(
        vocab_size=size, decoder_vocab_size=size, d_model=shape["d_model"], encoder_layers=layers,
        decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, activation_function="swish", scale_embedding=True,
        max_position_embeddings=shape["positions"], pad_token_id=pad, eos_token_id=0, bos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=True, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)
    model = MarianMTModel(config).eval()
    torch.nn.init.normal_(model.final_logits_bias, 0, 0.1)
    model.generation_config.update(num_beams=4, max_length=512, bad_words_ids=[[pad]],
                                   renormalize_logits=True)
    model.save_pretrained(folder)
    MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                    source_lang="en", target_lang="de").save_pretrained(folder)
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    return {"path": str(folder), "bytes": sum(files.values()), "files": files, "shape": shape,
            "real_pieces": len(real), "filler_pieces": len(fillers), "spm_s": round(spm_s, 2),
            "parameters": model.num_parameters(), "build_s": round(time.perf_counter() - start, 2)}


def import_step(folder: Path, ckpt: Path) -> dict:
    """``attnmt import`` in a child process (with --smoke: in this one), then its two parts here."""
    from attnmt.models.checkpoint import save_payload
    from attnmt.models.marian_io import import_marian

    times = [time.perf_counter()]
    attnmt("import", folder, ckpt)
    times.append(time.perf_counter())
    payload = import_marian(folder)
    times.append(time.perf_counter())
    save_payload(payload, ckpt.with_name("again.pt"))
    times.append(time.perf_counter())
    ckpt.with_name("again.pt").unlink()
    wall, read_s, save_s = (round(b - a, 2) for a, b in zip(times, times[1:]))
    return {"command": f"python -m attnmt import {folder} {ckpt}", "wall_s": wall, "import_marian_s": read_s,
            "save_payload_s": save_s, "checkpoint_bytes": ckpt.stat().st_size}


def load_engines(folder: Path, ckpt: Path, lines: list[str], batch_size: int, length: int):
    """Both engines, loaded as their users load them (attnmt's Translator: ``translator``; HF: ``hf``,
    ``hf_tok``), the ``batches`` they translate and the forced ``length``."""
    import transformers
    from transformers import MarianMTModel, MarianTokenizer

    from attnmt.cli.common import open_translator
    from attnmt.config.choices import Device

    start = time.perf_counter()
    translator, _, _ = open_translator(ckpt, Device.cpu)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    hf, hf_tok = MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(folder)
    hf_s = time.perf_counter() - start
    transformers.logging.set_verbosity_error()  # not a warning per batch: max_new_tokens over max_length
    same = sum(len(a) + 1 == len(b) for a, b in zip(translator.encode(lines).ids, hf_tok(lines)["input_ids"]))
    batches = [lines[i:i + batch_size] for i in range(0, len(lines), batch_size)]
    return SimpleNamespace(translator=translator, hf=hf, hf_tok=hf_tok, batches=batches, length=length,
                           load_s={"attnmt_open_translator_s": round(ours_s, 2), "hf_from_pretrained_s":
                                   round(hf_s, 2), "same_source_lengths": f"{same}/{len(lines)}"})


def ours_pass(translator, batches: list[list[str]], length: int | None = None) -> None:
    """attnmt: one ``translate`` call a batch; with ``length``, its outputs' lengths checked after."""
    import torch

    with torch.inference_mode():
        for batch in batches:
            assert len(translator.translate(batch)) == len(batch)
        if length is not None:
            found = {len(h[0].tokens) for h in translator.search(translator.encode(batches[0]).ids)}
            assert found == {length}, f"attnmt's outputs have {sorted(found)} pieces, not {length}"


def hf_pass(e, beam: int, batches: list[list[str]]) -> None:
    """HF: N pieces then the forced EOS for every output of every batch (checked)."""
    import torch

    n, eos = e.length, e.hf.config.eos_token_id
    with torch.inference_mode():
        for batch in batches:
            inputs = e.hf_tok(batch, return_tensors="pt", padding=True)
            out = e.hf.generate(**inputs, num_beams=beam, do_sample=False, min_new_tokens=n,
                                max_new_tokens=n + 1, length_penalty=1.0, num_return_sequences=1)
            new = out[:, 1:]
            assert new.shape == (len(batch), n + 1) and bool((new[:, -1] == eos).all()) \
                and not bool((new[:, :-1] == eos).any()), f"HF outputs of shape {tuple(new.shape)}"
            assert len(e.hf_tok.batch_decode(out, skip_special_tokens=True)) == len(batch)


def translate_step(e, beams: list[int], rounds: int) -> list[dict]:
    n, rows = sum(len(b) for b in e.batches), []
    for beam in beams:  # attnmt's decode settings force the length; a batch a call (a budget none reaches)
        mine = e.translator.with_settings(e.translator.decode.model_copy(update={
            "beam_size": beam, "nbest": 1, "length_penalty": 1.0, "min_len": e.length, "max_len_a": 0.0,
            "max_len_b": e.length, "max_tokens": 10**9}))
        ours_pass(mine, e.batches[:1], e.length)  # the warm-ups, checked
        hf_pass(e, beam, e.batches[:1])
        found, busy = {"attnmt": [], "hf": []}, []  # sentences/s; other processes' share of the CPUs
        for r in range(rounds):
            for engine in ["attnmt", "hf"] if r % 2 == 0 else ["hf", "attnmt"]:
                mark = cpu_mark()
                ours_pass(mine, e.batches) if engine == "attnmt" else hf_pass(e, beam, e.batches)
                found[engine].append(n / (time.perf_counter() - mark[0]))
                busy.append(others(mark))
            print(f"beam {beam} round {r + 1}/{rounds}: attnmt {found['attnmt'][-1]:.1f}, "
                  f"HF {found['hf'][-1]:.1f} sentences/s", flush=True)
        rows.append({"beam": beam, "sentences": n, "batch_size": len(e.batches[0]), "new_pieces": e.length,
                     **{f"{k}_sents_per_s": round(statistics.median(v), 2) for k, v in found.items()},
                     "ratio": round(statistics.median(a / h for a, h in zip(*found.values())), 3),
                     "rounds": {k: [round(x, 2) for x in v] for k, v in found.items()}, "others_cpu": busy})
    return rows


def attnmt_finetune(work: Path, ckpt: Path, pairs: list[tuple[str, str]], args, precision: str) -> dict:
    """``attnmt train`` from the imported checkpoint: 1 + --steps steps, each logged."""
    from attnmt.models.checkpoint import model_spec

    (data := work / "finetune_data").mkdir(exist_ok=True)
    for side, name in ((0, "train.en"), (1, "train.de")):
        (data / name).write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    steps = 1 + args.steps
    config = {
        "data": {"src_lang": "en", "tgt_lang": "de", "max_ratio": 1000.0,  # every pair kept, as HF's
                 "train": {"src": str(data / "train.en"), "tgt": str(data / "train.de")}},
        "model": model_spec(ckpt).cfg.model.model_dump(mode="json"),
        "train": {"init_from": str(ckpt), "device": "cpu", "precision": precision, "lr": 2e-5,
                  "schedule": "constant", "warmup_steps": 0, "max_tokens": args.batch_tokens,
                  "max_steps": steps, "max_epochs": 1000, "log_every": 1, "eval_every": 10**6,
                  "save_every": 10**6, "seed": 1}}
    path, run = work / f"finetune_{precision}.yaml", work / f"finetune_{precision}"
    path.write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(run, ignore_errors=True)
    attnmt("train", path, "--run-dir", run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    train = [r for r in records if r["event"] == "train"]
    assert [r["step"] for r in train] == list(range(1, steps + 1)), [r["step"] for r in train]
    seconds = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(train, train[1:])]
    return {"command": f"python -m attnmt train {path} --run-dir {run}", "config_train": config["train"],
            **step_stats(seconds, [r["tokens_per_s"] * s for r, s in zip(train[1:], seconds)])}


def finetune_step(work: Path, ckpt: Path, folder: Path, pairs: list[tuple[str, str]], args) -> list[dict]:
    """attnmt's and HF's steps at each precision, each in a fresh process while this one holds no model (a
    child's steps ran up to 1.5 times slower beside a parent that had trained: this VM's memory?)."""
    rows = []
    for precision in args.precisions:
        found = {"precision": precision, "batch_tokens": args.batch_tokens, "pairs": len(pairs)}
        for engine in ("attnmt", "hf"):
            mark = cpu_mark()
            if engine == "attnmt":
                found[engine] = attnmt_finetune(work, ckpt, pairs, args, precision)
            else:
                with multiprocessing.get_context("spawn").Pool(1) as pool:
                    found[engine] = pool.apply(hf_finetune, (folder, pairs, args, precision))
            found[engine]["others_cpu"] = others(mark)
        rows.append(found)
        print(f"fine-tune {precision}: attnmt {found['attnmt']['s_per_step']}, HF {found['hf']['s_per_step']}"
              " s/step", flush=True)
    return rows


def step_stats(seconds: list[float], tokens: list[float]) -> dict:
    """The timed steps' (the warm-up left out) seconds and tokens (source + target, EOS included)."""
    return {"s_per_step": round(statistics.median(seconds), 3), "steps_s": [round(s, 2) for s in seconds],
            "steps_tokens": [round(t) for t in tokens], "tokens_per_step": round(statistics.mean(tokens)),
            "tokens_per_s": round(sum(tokens) / sum(seconds), 1)}


def hf_batches(tok, pairs: list[tuple[str, str]], budget: int, count: int) -> list[dict]:
    """attnmt's first ``count`` training batches (``batching.TokenBatchSampler``, train.seed 1, epoch after
    epoch) of the pairs as HF tokenizes them: the same batches where both segment alike (checked above)."""
    import torch

    from attnmt.data.batching import TokenBatchSampler

    enc = tok([p[0] for p in pairs], text_target=[p[1] for p in pairs])
    src, tgt = enc["input_ids"], enc["labels"]  # both with their EOS
    sampler = TokenBatchSampler([max(len(s), len(t)) for s, t in zip(src, tgt)], budget, seed=1)
    chunks = [b for epoch in range(count) for b in sampler.batches(epoch)][:count]
    pad, out = tok.pad_token_id, []
    for chunk in chunks:
        s, t = max(len(src[i]) for i in chunk), max(len(tgt[i]) for i in chunk)
        ids = torch.tensor([src[i] + [pad] * (s - len(src[i])) for i in chunk])
        labels = torch.tensor([tgt[i] + [-100] * (t - len(tgt[i])) for i in chunk])
        start = torch.full((len(chunk), 1), pad)
        decoder = torch.cat([start, labels[:, :-1].masked_fill(labels[:, :-1] == -100, pad)], 1)
        out.append({"input_ids": ids, "attention_mask": ids != pad, "decoder_input_ids": decoder,
                    "labels": labels, "tokens": int((ids != pad).sum() + (labels != -100).sum())})
    return out


def hf_finetune(folder: Path, pairs: list[tuple[str, str]], args, precision: str) -> dict:
    """The same steps in transformers: forward, label-smoothed loss, backward, clipping, AdamW."""
    import torch
    import torch.nn.functional as F
    from transformers import MarianMTModel, MarianTokenizer

    torch.set_num_threads(args.threads)
    model = MarianMTModel.from_pretrained(folder).train()
    batches = hf_batches(MarianTokenizer.from_pretrained(folder), pairs, args.batch_tokens, 1 + args.steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.98), weight_decay=0.0)
    seconds, tokens = [], []
    for step, batch in enumerate(batches):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(**{k: v for k, v in batch.items() if k not in ("labels", "tokens")}).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                                   label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:  # the first is the warm-up
            seconds.append(time.perf_counter() - start)
            tokens.append(batch["tokens"])
    return {"what": "forward, F.cross_entropy(label_smoothing=0.1), backward, clip_grad_norm_(1.0), AdamW"
            + (" under torch.autocast(bf16)" if precision == "bf16" else ""), **step_stats(seconds, tokens)}


def table(r: dict) -> str:
    """The report: seconds, sentences/s or tokens/s; attnmt's speed over HF's; the share of the CPUs that
    other processes took meanwhile (the most of a row's passes)."""
    f, imp, load = r["folder"], r["import"], r["load"]
    rows = [("step", "attnmt", "HF transformers", "attnmt / HF (speed)", "others' CPU"), ("---",) * 5,
            (f"folder: 2 spm models, init, save_pretrained ({f['bytes'] / 1e6:.1f} MB on disk, "
             f"{f['parameters']:,} parameters)", "-", f"{f['build_s']:.1f} s", "-", "-"),
            ("`attnmt import FOLDER OUT.pt` (a child process, wall)", f"{imp['wall_s']:.2f} s", *"---"),
            (f"import_marian + save_payload in process (checkpoint {imp['checkpoint_bytes'] / 1e6:.1f} MB)",
             f"{imp['import_marian_s']:.2f} + {imp['save_payload_s']:.2f} s", *"---"),
            ("load for translation (open_translator; from_pretrained + tokenizer)",
             f"{load['attnmt_open_translator_s']:.2f} s", f"{load['hf_from_pretrained_s']:.2f} s",
             f"{load['hf_from_pretrained_s'] / load['attnmt_open_translator_s']:.2f}", "-")]
    for t in r["translate"]:
        rows.append((f"translate {t['sentences']} sentences, beam {t['beam']}, batches of {t['batch_size']}, "
                     f"{t['new_pieces']} pieces + EOS each: sentences/s", f"{t['attnmt_sents_per_s']:.1f}",
                     f"{t['hf_sents_per_s']:.1f}", f"{t['ratio']:.2f}", f"{max(t['others_cpu']):.0%}"))
    for t in r["train"]:
        a, h = t["attnmt"], t["hf"]
        rows.append((f"fine-tune, {t['precision']}, train.max_tokens {t['batch_tokens']}: s/step "
                     "(tokens/step, tokens/s)", *(f"{x['s_per_step']:.2f} s ({x['tokens_per_step']}, "
                                                  f"{x['tokens_per_s']:.0f})" for x in (a, h)),
                     f"{a['tokens_per_s'] / h['tokens_per_s']:.2f}",
                     f"{max(a['others_cpu'], h['others_cpu']):.0%}"))
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def machine(threads: int) -> dict:
    import torch
    import transformers

    lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    flags = info.get("flags", "").split()
    return {"cpu": info.get("model name", platform.processor()), "avx512_bf16": "avx512_bf16" in flags,
            "amx_bf16": "amx_bf16" in flags, "threads": threads, "torch": torch.__version__,
            "transformers": transformers.__version__}


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("--data", type=InputFolder(), help=f"holds {', '.join(FILES)} (default: {DATA})")
    ap.add_argument("--out", type=OutputFile(), help=f"the JSON report (default: {OUT})")
    ap.add_argument("--work", type=OutputFolder(), help="keep the folder, checkpoint, runs here")
    ap.add_argument("--sentences", type=Number(int, low=1), default=1000, help="test sentences translated")
    ap.add_argument("--batch-size", type=Number(int, low=1), default=64, help="sentences per batch")
    ap.add_argument("--length", type=Number(int, low=1, high=400), default=30, help="pieces an output has")
    ap.add_argument("--beams", type=Number(int, low=1, high=16), nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=Number(int, low=1), default=1, help="timed passes of each engine")
    ap.add_argument("--spm-pieces", type=Number(int, low=50, high=50000), default=8000, help="per spm model")
    ap.add_argument("--train-pairs", type=Number(int, low=1), default=400, help="fine-tuning pairs")
    ap.add_argument("--batch-tokens", type=Number(int, low=64), default=2048, help="train.max_tokens")
    ap.add_argument("--steps", type=Number(int, low=1), default=4, help="timed steps (after a warm-up one)")
    ap.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), help="default: fp32, bf16 if native")
    ap.add_argument("--threads", type=Number(int, low=1, high=1024), default=2)
    ap.add_argument("--smoke", action="store_true", help="CI: a 1+1-layer model of width 32 on the toy task")
    ap.checks.append(check_data)
    return ap


def check_data(args) -> None:
    data = args.data or DATA
    missing = [name for name in FILES if not (data / name).is_file()]
    if not args.smoke and missing:
        raise DataError(f"--data {data}: no {missing[0]} in it (a Multi30k folder: {', '.join(FILES)})")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)

    import torch

    from attnmt.cli.runtime import keep_freed_memory

    torch.set_num_threads(args.threads)
    in_process(args.smoke)
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    result = {"machine": machine(args.threads), "command": " ".join(["python", *sys.argv])}
    native = result["machine"]["avx512_bf16"] or result["machine"]["amx_bf16"]
    args.precisions = args.precisions or ["fp32"] + (["bf16"] if native else [])
    src, tgt, test = corpus(args)
    start = cpu_mark()
    with tempfile.TemporaryDirectory(prefix="bench-opus-mt-") as tmp:
        work = args.work.resolve() if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        folder, ckpt = work / "opus-mt-en-de-random", work / "opus-mt-en-de-random.pt"
        shutil.rmtree(folder, ignore_errors=True)
        result["folder"] = build_folder(folder, shape, src, tgt, 100 if args.smoke else args.spm_pieces,
                                        args.threads)
        result["import"] = import_step(folder, ckpt)
        result["train"] = finetune_step(work, ckpt, folder, list(zip(src, tgt))[:args.train_pairs], args)
        keep_freed_memory()  # as attnmt translate does; the process is both engines'
        engines = load_engines(folder, ckpt, test, args.batch_size, args.length)
        result["load"] = engines.load_s
        result["translate"] = translate_step(engines, args.beams, args.rounds)
    result["others_cpu"] = others(start)
    report = table(result) + f"\n\nOther processes took {result['others_cpu']:.0%} of the CPUs in the run."
    print("\n" + report)
    (out := args.out or OUT).parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "table": report}, indent=1) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
