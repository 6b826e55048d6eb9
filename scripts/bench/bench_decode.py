"""Decoding speed: attnmt's search on trained models, and side by side with Hugging Face and CTranslate2.

    python scripts/bench/bench_decode.py --models runs/multi30k_de_en_transformer runs/multi30k_de_en_lstm
    python scripts/bench/bench_decode.py --equal-work --peers      # + HF generate and CTranslate2 in one run
    python scripts/bench/bench_decode.py --equal-work --ct2 --cli  # + CTranslate2 on attnmt's random weights
    python scripts/bench/bench_decode.py --parts                   # the decoder's pieces, old against new
    python scripts/bench/bench_decode.py --equal-work --against 14964ad   # this tree against a commit,
                                                                         # alternating
    python scripts/bench/bench_decode.py --picture --models TEACHER STUDENT --figure F.png  # BLEU and speed:
                                              # fp32, --int8, --shortlist, CTranslate2 (decode_picture.py)

Part 1 (``--models``): sentences/s and generated tokens/s of greedy and beam-5 search on the 1,000
test_2016_flickr sentences, batches of 64 in file order, with each trained model.

Part 2 (``--equal-work``): equal work for every engine, as ``../shared/peers/decode_speed.py`` measures
the peers: random weights, 3+3 layers, d_model 256, 4 heads, ff 1024, vocabulary 8,000, tied
embeddings, the same 1,000 sentences in the same batches of 64, and every output forced to exactly 30
new tokens (attnmt: ``min_len = 30`` and the limit ``max_len_a = 0, max_len_b = 30``; attnmt's search
then takes one more step to score the forced EOS, which the peers' forced lengths do not, so attnmt
does 31/30 of their work). ``--peers`` runs that script in the peers' virtual environment
(``bash ../shared/peers/setup.sh``) in the same invocation, in rounds that alternate with attnmt: each
round is one timed pass of every engine, and ratios are the median of the per-round ratios.

``--ct2`` (with ``--equal-work``; ``--peers`` may join) adds CTranslate2 on the very same random weights,
in the same rounds (the engines in the reverse order every other round, each pass after a warm-up batch
of its own, and each in a fresh process of its own, attnmt's too: CTranslate2 brings its own OpenMP
runtime, whose idle threads keep spinning after a call and slowed attnmt's pass in the same process by
up to a third): the model is written as a checkpoint (its decode section forcing the 30 tokens,
checked by loading it back) and exported with ``ctranslate.export_ctranslate2`` as float32 and int8.
``CTranslate2 Q (raw)``: ``ctranslate2.Translator(intra_threads=--threads, inter_threads=1)
.translate_batch`` on the same batches of 64 as source pieces (the export adds the EOS), min = max
decoding length 30. ``attnmt -> CTranslate2 Q``: ``ctranslate.Ct2Translator`` over the text lines,
``.translate`` as ``attnmt translate EXPORT -i FILE`` runs it after start-up (cleaning, encoding, its
own batches by ``decode.max_tokens``, sorted by length, detokenising). Before the rounds each wrapper
searches once untimed: every output is 30 tokens, and it says how many sentences it decoded a second time
(an output holding PAD or BOS: a random tied model copies its start BOS everywhere, so all of them, unless
``--zero-bos`` zeroes BOS's embedding row for every engine, which leaves attnmt's and the raw engines' work
as it was). ``CTranslate2 Q (raw, the wrapper's batches)``: the raw engine on the wrapper's own batches
(sorted by length, ``decode.max_tokens``), so that wrapper / it is the wrapper's own cost; ``attnmt
Translator``: attnmt's ``Translator.translate`` on the same text path and batches (what ``attnmt
translate CKPT`` runs after start-up). Ratios: attnmt / CT2 float32 (raw), each wrapper / its raw
engine on both batchings, and attnmt's Translator / the float32 wrapper. ``--cli`` also times
``attnmt translate MODEL -i FILE -o /dev/null --beam-size B`` in a fresh process each round, on the int8
export and on the checkpoint: wall seconds, start-up included.

Part 3 (``--equal-work --against REV``): the equal-work pass of this tree and of commit REV (checked out
into a temporary git worktree, whose own benchmark runs there: ``scripts/bench/bench_decode.py``, or the one
in its ``scripts/`` in a commit from before the benchmarks moved) in alternating rounds, each a fresh
process, the two taking turns to go first; ratios are the median of the per-round ratios, as for the peers.

Each configuration: one warm-up batch, then the median of ``--runs`` full passes. ``--threads`` (2)
torch threads everywhere. The sentences are ``--data``'s test_2016_flickr.de.gz (default
``../shared/data/multi30k``), the random-weight model's tokenizer ``--tokenizer`` (default the Multi30k
run's, ``runs/multi30k_de_en_transformer/tokenizer``; the model's vocabulary is the tokenizer's);
``--limit N`` takes the first N sentences, ``--beams`` the beam widths (1 and 5), ``--quantizations`` the
exports (float32 and int8). ``--smoke``, for CI: a 1+1-layer model of width 32, one call of each of
``--parts``' pieces, and ``--ct2``'s checks and passes all in one child process instead of one each
(``tests/scripts/test_scripts_smoke.py`` runs every part this way on the toy task).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO, benchmark_in
from scriptargs import InputFolder, Model, Number, OutputFile, ScriptParser, guarded

from attnmt.errors import ConfigError, DataError

SHARED = REPO.parent / "shared"
DATA = SHARED / "data" / "multi30k"  # --data's default
TEST_NAME = "test_2016_flickr.de.gz"  # the sentences, in --data
TOKENIZER = REPO / "runs" / "multi30k_de_en_transformer" / "tokenizer"  # --tokenizer's default
QUANTIZATIONS = ("float32", "int8")


def read_sources(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


def search_pass(model, id_batches, beam: int, **limits) -> int:
    """One pass of attnmt's own search over ``id_batches``; returns the tokens generated (EOS left out)."""
    from attnmt.data.batching import collate
    from attnmt.decoding.search import beam_search, greedy_search

    generated = 0
    for ids in id_batches:
        batch = collate(ids)
        if beam == 1:
            hyps = [[h] for h in greedy_search(model, batch.src, batch.src_mask, **limits)]
        else:
            hyps = beam_search(model, batch.src, batch.src_mask, beam_size=beam, nbest=1,
                               length_penalty=1.0, **limits)
        generated += sum(len(h[0].tokens) for h in hyps)
    return generated


def time_search(model, id_batches, beam: int, runs: int, **limits) -> dict:
    """Median seconds of a full pass over ``id_batches`` (file-order batches), after one warm-up batch."""
    import torch

    with torch.inference_mode():
        search_pass(model, id_batches[:1], beam, **limits)
        times, generated = [], 0
        for _ in range(runs):
            start = time.perf_counter()
            generated = search_pass(model, id_batches, beam, **limits)
            times.append(time.perf_counter() - start)
    n = sum(len(b) for b in id_batches)
    median = statistics.median(times)
    return {"beam": beam, "median_s": round(median, 3), "runs_s": [round(t, 3) for t in times],
            "sents_per_s": round(n / median, 1), "gen_tokens_per_s": round(generated / median, 1),
            "gen_tokens": generated}


@dataclass(frozen=True)
class Setup:
    """What the passes read and how they run (the command line's options): the sentences (``--data``'s
    test_2016_flickr.de.gz), the tokenizer that segments them for the random-weight model, and the sizes."""

    source: Path
    tokenizer: Path
    batch_size: int = 64
    length: int = 30
    threads: int = 2
    limit: int | None = None  # the first N sentences
    zero_bos: bool = False
    beams: tuple[int, ...] = (1, 5)
    quantizations: tuple[str, ...] = QUANTIZATIONS  # the CTranslate2 exports (--ct2)
    smoke: bool = False  # a 1+1-layer model of width 32 (CI's smoke run)

    def options(self) -> list[str]:
        """The options that give a child process this set-up."""
        found = ["--data", str(self.source.parent), "--tokenizer", str(self.tokenizer), "--threads",
                 str(self.threads), "--length", str(self.length), "--batch-size", str(self.batch_size),
                 "--beams", *map(str, self.beams), "--quantizations", *self.quantizations]
        flags = [flag for flag, on in (("--zero-bos", self.zero_bos), ("--smoke", self.smoke)) if on]
        return found + (["--limit", str(self.limit)] if self.limit else []) + flags


def trained(paths: list[Path], runs: int, setup: Setup) -> list[dict]:
    from attnmt.data.readers import clean
    from attnmt.decoding import fastpath
    from attnmt.models.checkpoint import load_model

    rows = []
    lines = read_sources(setup.source)[:setup.limit]
    for path in paths:
        model, tokenizer, cfg, ckpt = load_model(path)
        fastpath.apply(model)  # as the decoding commands do
        ids = tokenizer.encode_src([clean(x) for x in lines])
        batches = [ids[i : i + setup.batch_size] for i in range(0, len(ids), setup.batch_size)]
        d = cfg.decode
        for beam in setup.beams:
            result = time_search(model, batches, beam, runs, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
            rows.append({"engine": f"attnmt {cfg.model.arch} ({ckpt.name})", **result})
            print("RESULT " + json.dumps(rows[-1]), flush=True)
    return rows


@dataclass
class Work:
    """The equal-work set-up (module docstring, part 2): the random-weight model, its config, the
    tokenizer and the sentences, as text, as piece ids and as file-order batches of those ids."""

    model: Any  # fastpath applied, as the decoding commands do
    model_cfg: Any  # its config.TransformerConfig
    state: dict  # its state dict, taken before the fast path (which leaves it as it is)
    tokenizer: Any
    lines: list[str]
    ids: list[list[int]]
    batches: list[list[list[int]]]


def equal_work_setup(setup: Setup) -> Work:
    """The model's vocabulary is the tokenizer's (the Multi30k one: 8,000 pieces, joint). With
    ``setup.zero_bos``, BOS's row of the (tied) embedding is zeroed: a random tied model otherwise copies
    the BOS it starts from into every output position (attnmt's search never outputs BOS, so its work is
    the same either way; ``Ct2Translator`` decodes every such output a second time with BOS suppressed)."""
    import torch

    from attnmt.config.schema import TransformerConfig
    from attnmt.data.readers import clean
    from attnmt.data.tokenizer import BOS_ID, load_tokenizer
    from attnmt.decoding import fastpath
    from attnmt.models import build_model

    if not setup.tokenizer.exists():  # any 8,000-piece segmentation of similar length does the same work
        sys.exit(f"no Multi30k tokenizer at {setup.tokenizer}: "
                 "run attnmt prepare configs/multi30k_de_en_transformer.yaml")
    tokenizer = load_tokenizer(setup.tokenizer)
    torch.manual_seed(0)
    sizes = dict(d_model=32, n_heads=2, enc_layers=1, dec_layers=1, d_ff=64) if setup.smoke else \
        dict(d_model=256, n_heads=4, enc_layers=3, dec_layers=3, d_ff=1024)
    cfg = TransformerConfig(arch="transformer", **sizes, dropout=0.1, share_embeddings=True, tie_output=True)
    model = build_model(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size).eval()
    if setup.zero_bos:
        with torch.no_grad():
            model.src_embed.weight[BOS_ID].zero_()  # shared with tgt_embed and the output projection
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    fastpath.apply(model)  # as the decoding commands do
    lines = read_sources(setup.source)[:setup.limit]
    ids = tokenizer.encode_src([clean(x) for x in lines])
    size = setup.batch_size
    batches = [ids[i : i + size] for i in range(0, len(ids), size)]
    return Work(model, cfg, state, tokenizer, lines, ids, batches)


def equal_work(runs: int, setup: Setup) -> list[dict]:
    work, length = equal_work_setup(setup), setup.length
    rows = []
    for beam in setup.beams:
        result = time_search(work.model, work.batches, beam, runs, max_len_a=0.0, max_len_b=length,
                             min_len=length)
        # exactly `length` tokens, EOS forced after
        assert result["gen_tokens"] == length * len(work.lines), result
        rows.append({"engine": "attnmt (random weights)", **result})
        print("RESULT " + json.dumps(rows[-1]), flush=True)
    return rows


# ------------------------------------------------------------------------ --ct2: CTranslate2 rows

OURS = "attnmt (random weights)"
OURS_INT8 = "attnmt --int8 (random weights)"
CT2_RAW = "CTranslate2 {} (raw)"
CT2_OURS = "attnmt -> CTranslate2 {}"
CT2_RAW_SORTED = "CTranslate2 {} (raw, the wrapper's batches)"
OURS_TRANSLATOR = "attnmt Translator (random weights)"
CLI_CT2 = "CLI: attnmt translate EXPORT {}"
CLI_CKPT = "CLI: attnmt translate CKPT"
CHILD_SEP = " | "  # between the passes of one child (--smoke: all of them); no engine's name holds it


@dataclass
class Pass:
    """One engine at one beam width: ``run(True)`` is a warm-up (the first batch), ``run(False)`` one
    timed pass over all the sentences; both return the tokens generated."""

    engine: str
    beam: int
    run: Callable[[bool], int]


def random_checkpoint(work: Work, path: Path, length: int, source: Path) -> None:
    """The random-weight model as a checkpoint file at ``path``: what ``checkpoint.load_model`` reads
    (config, tokenizer fingerprint and bytes, weights), with a decode section that forces ``length``
    tokens (so that ``attnmt translate`` on it or on its export does the equal work), checked by loading
    it back."""
    import torch

    from attnmt import __version__
    from attnmt.config.schema import config_from_dict
    from attnmt.models import checkpoint

    data = {
        "data": {"src_lang": "de", "tgt_lang": "en", "train": {"src": str(source), "tgt": str(source)}},
        "tokenizer": {"model_type": "unigram", "joint": True, "vocab_size": work.tokenizer.src_vocab_size},
        "model": work.model_cfg.model_dump(mode="json"),
        "train": {"run_dir": str(path.parent / "run")},
        "decode": {"beam_size": 5, "nbest": 1, "length_penalty": 1.0, "min_len": length, "max_len_a": 0.0,
                   "max_len_b": length},
    }
    cfg = config_from_dict(data, source="bench_decode.py (random weights)")
    tokenizer = work.tokenizer
    payload = {
        "format": checkpoint.FORMAT,
        "attnmt_version": __version__,
        "torch_version": str(torch.__version__),
        "model": work.state,
        "optimizer": None, "schedule": None, "scaler": None,
        "progress": {"step": 0},
        "fingerprint": checkpoint.fingerprint(cfg, 1, tokenizer, []),
        "config": cfg.to_dict(),
        "tokenizer": {name: checkpoint.bytes_tensor(blob) for name, blob in tokenizer.files().items()},
        "tokenizer_meta": tokenizer.meta(cfg.tokenizer.model_dump(mode="json")),
    }  # fmt: skip
    checkpoint.save_payload(payload, path)
    loaded, loaded_tokenizer, loaded_cfg, _ = checkpoint.load_model(path)
    theirs = loaded.state_dict()
    assert theirs.keys() == work.state.keys(), sorted(theirs.keys() ^ work.state.keys())
    assert all(torch.equal(theirs[k], v) for k, v in work.state.items()), "weights differ after loading"
    assert loaded_tokenizer.fingerprint() == tokenizer.fingerprint()
    assert loaded_cfg.decode.min_len == length and loaded_cfg.decode.max_len_b == length


def ct2_raw_pass(translator, piece_batches, beam: int, length: int) -> int:
    """One pass of CTranslate2's own ``translate_batch`` over the batches (source pieces without EOS:
    the export's config adds it), every output forced to ``length`` tokens (checked)."""
    generated = 0
    for pieces in piece_batches:
        results = translator.translate_batch(
            pieces, beam_size=beam, max_batch_size=0, min_decoding_length=length, max_decoding_length=length,
            return_end_token=True, length_penalty=1.0, max_input_length=0)
        for result in results:
            hyp = result.hypotheses[0]
            assert len(hyp) == length and "</s>" not in hyp, (len(hyp), hyp[-3:])
            generated += len(hyp)
    return generated


def ct2_setup(work: Work, tmp: Path, setup: Setup) -> tuple[Path, dict[str, Path]]:
    """The random-weight checkpoint and its exports (float32 and int8) in ``tmp`` (made once; the
    processes that time them find them there)."""
    from attnmt.decoding.ctranslate import export_ctranslate2

    ckpt, folders = tmp / "random.pt", {q: tmp / f"ct2_{q}" for q in setup.quantizations}
    if not ckpt.exists():
        random_checkpoint(work, ckpt, setup.length, setup.source)
        for quantization, folder in folders.items():
            start = time.perf_counter()
            export_ctranslate2(ckpt, folder, quantization)
            print(f"exported {quantization} in {time.perf_counter() - start:.1f}s", flush=True)
    return ckpt, folders


def ct2_engines(setup: Setup) -> list[tuple[str, int]]:
    """(engine, beam) of every CTranslate2 pass, in the order of a round."""
    return [(name.format(q), beam) for q in setup.quantizations for beam in setup.beams
            for name in (CT2_RAW, CT2_OURS, CT2_RAW_SORTED)] + [(OURS_TRANSLATOR, b) for b in setup.beams]


def ct2_pass(work: Work, tmp: Path, setup: Setup, engine: str, beam: int) -> Pass:
    """One CTranslate2 engine (or attnmt's Translator) at one beam width on the random weights of
    ``ct2_setup``. Each runs in a process of its own: CTranslate2 brings its own OpenMP runtime, whose
    idle threads keep spinning after a call and slow whatever else the process then runs (attnmt's
    equal-work pass fell from about 108 to 73-93 sentences/s after one CTranslate2 call, even with the
    translator deleted)."""
    import ctranslate2
    import torch

    from attnmt.data.batching import token_batches
    from attnmt.decoding.ctranslate import Ct2Translator, read_export
    from attnmt.decoding.translator import DecodeOverrides, Translator

    length, threads, size = setup.length, setup.threads, setup.batch_size
    _, folders = ct2_setup(work, tmp, setup)
    # a CTranslate2 engine's own export; attnmt's Translator reads only the decode settings of the first
    quantization = next((q for q in folders if q in engine), next(iter(folders)))
    folder = folders[quantization]
    _, cfg, _ = export = read_export(folder)
    decode = DecodeOverrides(beam_size=beam, nbest=1).apply(cfg.decode, work.tokenizer.tgt_vocab_size)
    assert (decode.min_len, decode.max_len_a, decode.max_len_b) == (length, 0.0, length), decode
    if engine == OURS_TRANSLATOR:  # attnmt's own Translator on the same text path and batches
        own = Translator(work.model, work.tokenizer, decode)

        def translated(warm: bool) -> int:
            todo = work.lines[:size] if warm else work.lines
            with torch.inference_mode():
                assert len(own.translate(todo)) == len(todo)
            return length * len(todo)

        return Pass(engine, beam, translated)
    if engine == CT2_OURS.format(quantization):
        translator = Ct2Translator(folder, decode, threads=threads, export=export)

        def wrapped(warm: bool) -> int:
            todo = work.lines[:size] if warm else work.lines
            out = translator.translate(todo)
            assert len(out) == len(todo)
            return length * len(todo)  # checked by ct2_check through .search

        return Pass(engine, beam, wrapped)
    raw = ctranslate2.Translator(str(folder), device="cpu", compute_type="default", intra_threads=threads,
                                 inter_threads=1)
    if engine == CT2_RAW.format(quantization):
        batches = [[work.tokenizer.src_pieces(ids) for ids in batch] for batch in work.batches]
    else:
        # The wrapper's own batches (sorted by length, decode.max_tokens), as pieces: what is left
        # between the two is the wrapper's own cost (cleaning, encoding, detokenising, its Python).
        # Ct2Translator encodes as Translator does: its own method, not a stand-in that can fall behind.
        ids = Translator(work.model, work.tokenizer, decode).encode(work.lines).ids
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        batches = [[work.tokenizer.src_pieces(ids[i]) for i in chunk]
                   for chunk in token_batches([len(x) + 1 for x in ids], order, decode.max_tokens,
                                              rows_per_example=beam)]
    return Pass(engine, beam, lambda warm: ct2_raw_pass(raw, batches[:1] if warm else batches, beam, length))


def ct2_check(work: Work, tmp: Path, setup: Setup) -> None:
    """Outside the timing, in a process of its own: each wrapper's outputs are exactly ``length``
    tokens, how many sentences it decodes a second time (outputs holding PAD or BOS, or past their own
    limit), and whether its greedy outputs are attnmt's on the first batch."""
    import torch

    from attnmt.data.batching import collate
    from attnmt.decoding.ctranslate import Ct2Translator, read_export
    from attnmt.decoding.search import greedy_search
    from attnmt.decoding.translator import DecodeOverrides

    length = setup.length
    _, folders = ct2_setup(work, tmp, setup)
    with torch.inference_mode():
        first = collate(work.batches[0])
        ours = [h.tokens for h in greedy_search(work.model, first.src, first.src_mask, max_len_a=0.0,
                                                max_len_b=length, min_len=length)]
    n = len(work.lines)
    for quantization, folder in folders.items():
        export = read_export(folder)
        for beam in setup.beams:
            decode = DecodeOverrides(beam_size=beam).apply(export[1].decode, work.tokenizer.tgt_vocab_size)
            translator = Ct2Translator(folder, decode, threads=setup.threads, export=export)
            decoded: list[int] = []
            run = translator._run

            def counted(pieces, *rest, run=run, decoded=decoded, **options):
                decoded.append(len(pieces))
                return run(pieces, *rest, **options)

            translator._run = counted
            hyps = translator.search(translator.encode(work.lines).ids)
            assert all(len(h[0].tokens) == length for h in hyps), "an output is not exactly `length` tokens"
            note = f"{quantization} beam {beam}: {sum(decoded) - n} of {n} sentences decoded again"
            if beam == 1:
                same = sum(h[0].tokens == t for h, t in zip(hyps, ours))
                note += f"; greedy outputs identical to attnmt's on the first batch: {same}/{len(ours)}"
            print(note, flush=True)


def int8_model(work: Work):
    """The random-weight model as ``--int8`` decodes it (``decoding.quantize``), made once per process."""
    if not hasattr(work, "quantized"):
        import copy

        from attnmt.decoding.quantize import quantize_int8

        work.quantized = copy.deepcopy(work.model)
        quantize_int8(work.quantized)
    return work.quantized


def ours_pass(work: Work, beam: int, length: int, int8: bool = False) -> Pass:
    """attnmt's search on the random weights (with ``int8``: as ``--int8`` decodes them), every output
    forced to ``length`` tokens."""
    import torch

    limits = {"max_len_a": 0.0, "max_len_b": length, "min_len": length}
    model = int8_model(work) if int8 else work.model

    def ours(warm: bool) -> int:
        with torch.inference_mode():
            generated = search_pass(model, work.batches[:1] if warm else work.batches, beam, **limits)
        assert warm or generated == length * len(work.lines), generated  # EOS forced after `length`
        return generated

    return Pass(OURS_INT8 if int8 else OURS, beam, ours)


def run_pass(p: Pass, n: int) -> dict:
    """A warm-up batch, then one timed pass."""
    p.run(True)
    start = time.perf_counter()
    generated = p.run(False)
    seconds = time.perf_counter() - start
    return {"engine": p.engine, "beam": p.beam, "median_s": round(seconds, 3),
            "sents_per_s": round(n / seconds, 1), "gen_tokens_per_s": round(generated / seconds, 1)}


def child_command(args: list[str]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def cli_runs(ckpt: Path, folders: dict[str, Path], src: Path,
             beams: tuple[int, ...]) -> list[tuple[str, int, list[str]]]:
    """``attnmt translate`` as a user runs it, start-up included: on the int8 export (the other one when
    there is no int8) and on the checkpoint, beam 1 and 5 (the decode section forces the equal work)."""
    attnmt = Path(sys.executable).parent / "attnmt"
    base = [str(attnmt)] if attnmt.exists() else [sys.executable, "-m", "attnmt"]
    quantization = "int8" if "int8" in folders else next(iter(folders))
    return [(name, beam, [*base, "translate", str(model), "-i", str(src), "-o", "/dev/null",
                          "--beam-size", str(beam), "--device", "cpu"])
            for name, model in ((CLI_CT2.format(quantization), folders[quantization]), (CLI_CKPT, ckpt))
            for beam in beams]


def parts(reps: int, calls: int = 20) -> list[dict]:
    """The pieces the decoder chose against what they replace, side by side in this process, at the
    equal-work sizes (batch 64 x beam 5 = 320 rows, d_model 256, 4 heads, 16 cached positions, 20
    source pieces): median microseconds per call (of ``calls``) over ``reps`` rounds, alternating the
    two."""
    import torch
    import torch.nn.functional as F

    from attnmt.decoding.fastpath import PackedLinear
    from attnmt.models.kernels import math_attention, sdpa_attention

    def timed(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6

    torch.manual_seed(0)
    N, B, H, dh, t, S = 320, 64, 4, 64, 16, 20
    cases = []
    for d_in, d_out in ((256, 256), (256, 1024), (1024, 256), (256, 8000)):
        layer = PackedLinear(d_in, d_out, bias=d_out != 8000)
        x = torch.randn(N, d_in)
        cases.append((f"linear {N}x{d_in} -> {d_out}", "F.linear (MKL)",
                      lambda x=x, m=layer: F.linear(x, m.weight, m.bias),
                      "fastpath.PackedLinear (oneDNN)", lambda x=x, m=layer: m(x)))
    q, k, v = torch.randn(N, H, 1, dh), torch.randn(N, H, t, dh), torch.randn(N, H, t, dh)
    cases.append((f"self-attention step {N}x{H}x1 over {t}", "sdpa", lambda: sdpa_attention(q, k, v),
                  "math (step kernel)", lambda: math_attention(q, k, v)))
    qc, kc, vc = torch.randn(B, H, 5, dh), torch.randn(B, H, S, dh), torch.randn(B, H, S, dh)
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
    mask[::2, ..., S // 2 :] = False
    cases.append((f"cross-attention step {B}x{H}x5 over {S}, padded", "sdpa",
                  lambda: sdpa_attention(qc, kc, vc, mask),
                  "math (step kernel)", lambda: math_attention(qc, kc, vc, mask)))
    rows = []
    with torch.inference_mode():
        for name, old_name, old, new_name, new in cases:
            olds, news = [], []
            for _ in range(reps):
                olds.append(timed(old))
                news.append(timed(new))
            row = {"part": name, "old": old_name, "old_us": round(statistics.median(olds)), "new": new_name,
                   "new_us": round(statistics.median(news))}
            row["speedup"] = round(row["old_us"] / row["new_us"], 2)
            rows.append(row)
            print("PART " + json.dumps(row), flush=True)
    return rows


def peers(runs: int, batch_size: int, length: int, threads: int) -> list[dict]:
    anchors = Path(os.environ.get("ANCHORS_DIR", Path.home() / ".cache" / "attnmt-anchors"))
    python = anchors / "venv" / "bin" / "python"
    if not python.exists():
        print(f"peers: no venv at {anchors}/venv (bash {SHARED}/peers/setup.sh)", file=sys.stderr)
        return []
    out = subprocess.run(
        [str(python), str(SHARED / "peers" / "decode_speed.py"), "--runs", str(runs),
         "--batch-size", str(batch_size), "--length", str(length), "--threads", str(threads)],
        capture_output=True, text=True,
    )
    rows = [json.loads(m.group(1)) for m in re.finditer(r"^RESULT (\{.*\})$", out.stdout, re.M)]
    if not rows:
        print(f"peers failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}", file=sys.stderr)
    return rows


def ratio_line(per_round: list[dict], beam: int, ours: str, theirs: str) -> None:
    """``beam B: OURS / THEIRS = x`` from the per-round ratios of sentences/s (their median), and as JSON."""
    if (ours, beam) not in per_round[0] or (theirs, beam) not in per_round[0]:
        return
    ratios = [found[(ours, beam)]["sents_per_s"] / found[(theirs, beam)]["sents_per_s"]
              for found in per_round]
    print(f"beam {beam}: {ours} / {theirs} = {statistics.median(ratios):.2f}x "
          f"(per round: {', '.join(f'{x:.2f}' for x in ratios)})")
    print("RATIO " + json.dumps({"beam": beam, "numerator": ours, "denominator": theirs,
                                 "ratio": round(statistics.median(ratios), 3),
                                 "rounds": [round(x, 3) for x in ratios]}), flush=True)


def interleaved(rounds: int, setup: Setup, with_peers: bool = True, ct2: bool = False,
                cli: bool = False) -> list[dict]:
    """attnmt and the other engines in alternation: each round times one pass of every engine (attnmt
    here; with ``ct2`` the CTranslate2 engines here too, in the reverse order every other round; then,
    with ``with_peers``, the peers' script with ``--runs 1``), so a slow spell on the shared machine falls
    on all of them. Each pass here follows a warm-up batch of its own. Per engine: the median over rounds;
    per pair: the median of the per-round ratios. With ``cli``: ``attnmt translate`` in a fresh process
    each round too, timed as wall seconds, start-up included."""
    import tempfile


    work = equal_work_setup(setup)
    n, length, threads, batch_size = len(work.lines), setup.length, setup.threads, setup.batch_size
    passes = [ours_pass(work, beam, length, int8) for beam in setup.beams for int8 in (False, True)]
    per_round: list[dict[tuple[str, int], dict]] = []
    cli_walls: list[dict[tuple[str, int], float]] = []
    with tempfile.TemporaryDirectory(prefix="attnmt-bench-ct2-") as tmp:
        commands, engines = [], [(p.engine, p.beam) for p in passes]
        if ct2:
            # Every pass in a process of its own (``ct2_pass``), attnmt's too, so that no engine runs
            # beside another's idle threads; the checks in one more.
            ckpt, folders = ct2_setup(work, Path(tmp), setup)
            common = ["--equal-work", "--ct2", *setup.options(), "--child-dir", tmp]
            if not setup.smoke:  # --smoke: the checks first in the passes' one child (below)
                check = subprocess.run(child_command([*common, "--child", "check"]), capture_output=True,
                                       text=True)
                if check.returncode:
                    sys.exit(f"the checks failed:\n{check.stdout[-2000:]}\n{check.stderr[-2000:]}")
                print(check.stdout.strip(), flush=True)
            engines += ct2_engines(setup)
            if cli:
                src = Path(tmp) / "src.de"
                src.write_text("".join(line + "\n" for line in work.lines), encoding="utf-8")
                commands = cli_runs(ckpt, folders, src, setup.beams)
        for r in range(rounds):
            found = {}
            ordered = engines if r % 2 == 0 else engines[::-1]
            # --smoke: every pass in one child (its numbers mean nothing; the child's protocol runs)
            for group in [ordered] if ct2 and setup.smoke else [[one] for one in ordered]:
                if not ct2:
                    found[group[0]] = run_pass(next(p for p in passes if (p.engine, p.beam) == group[0]), n)
                    continue
                checks = ["check"] if setup.smoke and r == 0 else []
                out = subprocess.run(child_command([*common, "--child", CHILD_SEP.join(
                    checks + [f"{e}@{b}" for e, b in group])]), capture_output=True, text=True)
                rows = [json.loads(m.group(1)) for m in re.finditer(r"^PASS (\{.*\})$", out.stdout, re.M)]
                if out.returncode or len(rows) != len(group):
                    sys.exit(f"{', '.join(checks + [f'{e} beam {b}' for e, b in group])} failed:\n"
                             f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
                if checks:
                    said = [x for x in out.stdout.splitlines() if not x.startswith("PASS ")]
                    print("\n".join(said), flush=True)
                found.update({(row["engine"], row["beam"]): row for row in rows})
            walls = {}
            for name, beam, command in commands if r % 2 == 0 else commands[::-1]:
                start = time.perf_counter()
                out = subprocess.run(command, capture_output=True, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": str(threads)})
                walls[(name, beam)] = time.perf_counter() - start
                if out.returncode:
                    sys.exit(f"{' '.join(command)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
            cli_walls.append(walls)
            if with_peers:
                theirs = peers(1, batch_size, length, threads)
                if not theirs:
                    sys.exit("peers failed: see above")
                found.update({(row["engine"], row["beam"]): row for row in theirs})
            order = {key: i for i, key in enumerate(engines)}  # then the peers, per beam
            per_round.append({key: found[key]
                              for key in sorted(found, key=lambda k: (k[1], order.get(k, len(order))))})
            print(f"round {r + 1}/{rounds}: "
                  + ", ".join(f"{e} b{b} {row['sents_per_s']}" for (e, b), row in per_round[-1].items())
                  + "".join(f", {e} b{b} {s:.2f}s" for (e, b), s in walls.items()), flush=True)
    rows = []
    for key in per_round[0]:
        rates = [found[key]["sents_per_s"] for found in per_round]
        tokens = [found[key]["gen_tokens_per_s"] for found in per_round]
        median = statistics.median(rates)
        rows.append({"engine": key[0], "beam": key[1], "sents_per_s": median,
                     "gen_tokens_per_s": statistics.median(tokens),
                     "median_s": statistics.median(found[key]["median_s"] for found in per_round),
                     "rounds_sents_per_s": rates})
        print("RESULT " + json.dumps(rows[-1]), flush=True)
    for beam in setup.beams:
        if with_peers:
            for engine, b in per_round[0]:
                if b == beam and engine != OURS and not engine.startswith(("CTranslate2 ", "attnmt")):
                    ratio_line(per_round, beam, OURS, engine)
                    if "int8" in engine:
                        ratio_line(per_round, beam, OURS_INT8, engine)
        if ct2:
            ratio_line(per_round, beam, OURS, CT2_RAW.format("float32"))
            ratio_line(per_round, beam, OURS_INT8, CT2_RAW.format("int8"))
            ratio_line(per_round, beam, CT2_OURS.format("int8"), CT2_RAW.format("int8"))
            ratio_line(per_round, beam, CT2_OURS.format("float32"), CT2_RAW.format("float32"))
            ratio_line(per_round, beam, CT2_OURS.format("int8"), CT2_RAW_SORTED.format("int8"))
            ratio_line(per_round, beam, CT2_OURS.format("float32"), CT2_RAW_SORTED.format("float32"))
            ratio_line(per_round, beam, OURS_TRANSLATOR, CT2_OURS.format("float32"))
            if with_peers:  # this export against the peers' conversion of their own random model
                ratio_line(per_round, beam, CT2_RAW.format("float32"), "ct2_float32")
                ratio_line(per_round, beam, CT2_RAW.format("int8"), "ct2_int8")
    if commands:
        print(f"\nattnmt translate MODEL -i FILE -o /dev/null --beam-size B, {n} sentences, "
              f"OMP_NUM_THREADS={threads}: wall seconds, start-up included (median of {rounds})")
        for name, beam, command in commands:
            walls = [w[(name, beam)] for w in cli_walls]
            row = {"engine": name, "beam": beam, "wall_s": round(statistics.median(walls), 3),
                   "sents_per_s_with_startup": round(n / statistics.median(walls), 1),
                   "rounds_wall_s": [round(w, 3) for w in walls], "command": " ".join(command[1:])}
            print(f"{name:<44}{beam:>5}{row['wall_s']:>9.2f}s{row['sents_per_s_with_startup']:>9.1f} sent/s")
            print("CLI " + json.dumps(row), flush=True)
    return rows


def against(rev: str, rounds: int, threads: int) -> list[dict]:
    """This tree's equal-work pass and REV's, alternating (see the module docstring, part 3)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="attnmt-against-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            (tree / "runs").symlink_to(REPO / "runs")  # the Multi30k tokenizer both passes segment with
            (tree.parent / "shared").symlink_to(SHARED)  # and the test sentences, beside the tree as here
            trees = {"this tree": REPO, rev: tree}
            per_round: list[dict[tuple[str, int], float]] = []
            for r in range(rounds):
                found = {}
                # ABBA: neither always goes first
                order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
                for name, root in order:
                    out = subprocess.run(
                        [sys.executable, str(benchmark_in(root, "bench_decode.py")),
                         "--equal-work", "--runs", "1", "--threads", str(threads)],
                        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                    )  # fmt: skip
                    rows = [json.loads(m.group(1))
                            for m in re.finditer(r"^RESULT (\{.*\})$", out.stdout, re.M)]
                    if not rows:
                        sys.exit(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
                    found.update({(name, row["beam"]): row["sents_per_s"] for row in rows})
                per_round.append(found)
                print(f"round {r + 1}/{rounds}: "
                      + ", ".join(f"{n} b{b} {v}" for (n, b), v in found.items()), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
    rows = []
    for beam in (1, 5):
        ratios = [found[("this tree", beam)] / found[(rev, beam)] for found in per_round]
        row = {"beam": beam,
               "this_tree_sents_per_s": statistics.median(f[("this tree", beam)] for f in per_round),
               "rev": rev, "rev_sents_per_s": statistics.median(f[(rev, beam)] for f in per_round),
               "ratio": round(statistics.median(ratios), 3), "rounds": [round(x, 3) for x in ratios]}
        rows.append(row)
        print("AGAINST " + json.dumps(row), flush=True)
        print(f"beam {beam}: this tree / {rev} = {row['ratio']:.3f}x "
              f"(per round: {', '.join(f'{x:.3f}' for x in ratios)})")
    return rows


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("--models", nargs="*", type=Model(), default=[])
    ap.add_argument("--equal-work", action="store_true")
    ap.add_argument("--peers", action="store_true",
                    help="with --equal-work: also HF generate and CTranslate2")
    ap.add_argument("--ct2", action="store_true",
                    help="with --equal-work: CTranslate2 on the same random weights, raw and through attnmt")
    ap.add_argument("--cli", action="store_true",
                    help="with --ct2: also `attnmt translate` on the export and the checkpoint, "
                    "start-up included")
    ap.add_argument("--zero-bos", action="store_true",
                    help="with --ct2: zero BOS's (tied) embedding row, so that the random model does not "
                    "output BOS and Ct2Translator decodes nothing twice")
    ap.add_argument("--data", type=InputFolder(),
                    help=f"the folder of test_2016_flickr.de.gz, the sentences (default: {DATA})")
    ap.add_argument("--tokenizer", type=InputFolder(),
                    help=f"the tokenizer folder of the random-weight model (default: {TOKENIZER})")
    ap.add_argument("--beams", type=Number(int, low=1), nargs="+", default=[1, 5], help="beam widths")
    ap.add_argument("--quantizations", nargs="+", choices=QUANTIZATIONS, default=list(QUANTIZATIONS),
                    help="with --ct2: the exports")
    ap.add_argument("--smoke", action="store_true",
                    help="CI's smoke run (its numbers mean nothing): the random-weight model 1+1 layers of "
                    "width 32, --parts one call of each piece, once, --ct2's checks and passes in one child "
                    "process")
    ap.add_argument("--limit", type=Number(int, low=1), help="the first N sentences only")
    # with --ct2: one pass "ENGINE@BEAM", or "check" (--smoke: the checks and every pass, CHILD_SEP between)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    # where ct2_setup wrote the models
    ap.add_argument("--child-dir", type=InputFolder(), help=argparse.SUPPRESS)
    ap.add_argument("--parts", action="store_true", help="the decoder's pieces against what they replace")
    ap.add_argument("--picture", action="store_true",
                    help="BLEU and sentences/s of --models (the first the teacher) in fp32, int8 and int8 "
                         "with a shortlist, and CTranslate2 float32 and int8 of the first")
    ap.add_argument("--figure", type=OutputFile(), help="with --picture: BLEU against sentences/s drawn")
    ap.add_argument("--picture-child", help=argparse.SUPPRESS)
    ap.add_argument("--against", metavar="REV",
                    help="with --equal-work: this tree against commit REV, alternating rounds")
    ap.add_argument("--no-malloc-tuning", action="store_true", help="leave glibc's malloc at its defaults")
    ap.add_argument("--runs", type=Number(int, low=1), default=3,
                    help="passes per configuration (with --peers: rounds)")
    ap.add_argument("--batch-size", type=Number(int, low=1), default=64)
    ap.add_argument("--length", type=Number(int, low=1), default=30)
    ap.add_argument("--threads", type=Number(int, low=1), default=2)
    ap.checks.append(check_together)
    return ap


def check_together(args) -> None:
    """The options that only go with others."""
    if args.ct2 and not args.equal_work:
        raise ConfigError("--ct2 goes with --equal-work")
    if args.limit and not (args.equal_work or args.models or args.picture_child):
        raise ConfigError("--limit goes with --equal-work or --models")
    if args.picture and not args.models:
        raise ConfigError("--picture needs --models (the first is the teacher)")
    if args.figure and not args.picture:
        raise ConfigError("--figure goes with --picture")
    if args.picture and args.data and not (args.data / "test_2016_flickr.en.gz").is_file():
        raise DataError(f"--data {args.data}: no test_2016_flickr.en.gz (the references) in it")
    if (args.cli or args.zero_bos) and not args.ct2:
        raise ConfigError("--cli and --zero-bos go with --ct2")
    if args.limit and (args.peers or args.against):
        raise ConfigError("--limit: the peers and --against always do all the sentences")
    if args.against and (args.data or args.tokenizer):
        raise ConfigError("--against: both trees read the default --data and --tokenizer")
    if args.data and not (args.data / TEST_NAME).is_file():
        raise DataError(f"--data {args.data}: no {TEST_NAME} in it")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)

    import torch

    from attnmt.cli.runtime import keep_freed_memory

    torch.set_num_threads(args.threads)
    # As `attnmt translate` and `attnmt eval` do (attnmt/cli/runtime.py); --no-malloc-tuning measures without.
    tuned = not args.no_malloc_tuning and keep_freed_memory()
    print(f"malloc tuning: {'on' if tuned else 'off'}", flush=True)
    if args.parts:
        print(f"\n{'part':<46}{'old':>32}{'us':>8}{'new':>32}{'us':>8}{'speedup':>9}")
        for r in parts(1, 1) if args.smoke else parts(max(args.runs, 5)):
            print(f"{r['part']:<46}{r['old']:>32}{r['old_us']:>8}{r['new']:>32}{r['new_us']:>8}{r['speedup']:>8.2f}x")
    setup = Setup((args.data or DATA) / TEST_NAME, args.tokenizer or TOKENIZER, args.batch_size, args.length,
                  args.threads, args.limit, args.zero_bos, tuple(args.beams), tuple(args.quantizations),
                  args.smoke)
    if args.picture or args.picture_child:
        import decode_picture

        data = args.data or DATA
        if args.picture_child:
            decode_picture.child(args.picture_child, data / TEST_NAME, data / decode_picture.REF_NAME,
                                 args.threads, args.limit)
        else:
            decode_picture.picture(args.models, data, args.beams, args.runs, args.threads, args.limit,
                                   args.figure, Path(__file__).resolve())
        return
    if args.child:  # one pass of --ct2's rounds, in a process of its own (see interleaved)
        work = equal_work_setup(setup)
        for spec in args.child.split(CHILD_SEP):  # the checks or one pass; --smoke: the checks, every pass
            if spec == "check":
                ct2_check(work, args.child_dir, setup)
                continue
            engine, beam = spec.rsplit("@", 1)
            one = ours_pass(work, int(beam), args.length, engine == OURS_INT8) \
                if engine in (OURS, OURS_INT8) else ct2_pass(work, args.child_dir, setup, engine, int(beam))
            print("PASS " + json.dumps(run_pass(one, len(work.lines))), flush=True)
        return
    if args.equal_work and args.against:
        against(args.against, args.runs, args.threads)
        return
    rows = trained(args.models, args.runs, setup) if args.models else []
    if args.equal_work and not (args.peers or args.ct2):
        rows += equal_work(args.runs, setup)
    if args.equal_work and (args.peers or args.ct2):
        rows += interleaved(args.runs, setup, args.peers, args.ct2, args.cli)
    if not rows:
        return
    print(f"\n{'engine':<44}{'beam':>5}{'sent/s':>9}{'tok/s':>10}{'median s':>10}")
    for r in rows:
        print(f"{r['engine']:<44}{r['beam']:>5}{r['sents_per_s']:>9.1f}{r['gen_tokens_per_s']:>10.1f}{r['median_s']:>10.2f}")


if __name__ == "__main__":
    main()
