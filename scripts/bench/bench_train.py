"""Training throughput of the Multi30k recipes, side by side with JoeyNMT 2.3.0 in one run.

    python scripts/bench/bench_train.py                 # attnmt Transformer and LSTM, 40 timed steps each
    python scripts/bench/bench_train.py --joey 240      # ... and JoeyNMT for 240 s each
                                                        # (needs ../shared/peers/setup.sh)
    python scripts/bench/bench_train.py --device cuda --archs transformer --steps 300   # on a GPU: bf16
    python scripts/bench/bench_train.py --precision bf16 --compile off on   # torch.compile against eager
    python scripts/bench/bench_train.py --parts         # a step's pieces against what they replaced
    python scripts/bench/bench_train.py --profile --archs transformer --steps 10   # where a step's time goes
    python scripts/bench/bench_train.py --against /tmp/old --archs transformer --precision bf16 --rounds 3
                                                        # this checkout against another, alternating

For each recipe, in a fresh child process: prepare the data (not timed), run 5 warm-up steps, then time
``--steps`` optimizer steps and report source + target non-pad tokens per second, target tokens per second,
peak resident memory, and model FLOP utilisation: the FLOPs of one measured training step
(``torch.utils.flop_counter.FlopCounterMode``, forward + backward) times steps per second, over the matmul
peak of the precision used (fp32 or bf16), measured in the same run (``torch.mm`` on 2048 x 2048, as
``../shared/peers/matmul_peak.py`` does). JoeyNMT runs the peers' configs (same dims, batch 4096 tokens) under
``../shared/peers/run_joey.sh`` and its logged target tokens/s is compared with ours. ``--smoke`` is CI's
smoke run (``tests/scripts/test_scripts_smoke.py``), its numbers meaningless: each recipe's smallest model and
a 100-piece vocabulary, the matmul peak on 128 x 128, ``--parts`` each piece once at the smallest sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO, benchmark_in, smoke_settings
from scriptargs import InputFolder, Number, ScriptParser, guarded
from train_profile import profile_steps, report

from attnmt.errors import DataError

PEERS = REPO.parent / "shared" / "peers"
RECIPES = {"transformer": "configs/multi30k_de_en_transformer.yaml",
           "lstm": "configs/multi30k_de_en_lstm.yaml"}
JOEY_NAMES = {"transformer": "transformer", "lstm": "rnn"}


def matmul_peak(threads: int, dtype: str = "fp32", n: int = 2048) -> float:
    import torch

    torch.set_num_threads(threads)
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b, c = (torch.randn(n, n, dtype=kind), torch.randn(n, n, dtype=kind), torch.empty(n, n, dtype=kind))
    for _ in range(3):
        torch.mm(a, b, out=c)
    times = []
    for _ in range(10):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


@contextlib.contextmanager
def recipe_trainer(arch: str, threads: int, data: Path | None, device: str, precision: str, compile_: bool,
                   smoke: bool = False):
    """The recipe's ``Trainer``, set up in a temporary run folder (``train.precision``, ``train.compile``,
    ``--data`` and ``--smoke`` set on it), and its first epoch's steps (each a list of micro-batches)."""
    import torch

    from attnmt.config.schema import load_config
    from attnmt.runfiles import RunDir
    from attnmt.training.runlog import quiet
    from attnmt.training.trainer import Trainer

    torch.set_num_threads(threads)
    overrides = [f"train.device={device}", f"train.precision={precision}",
                 f"train.compile={str(compile_).lower()}"]
    if data:
        for split, name in (("train", "train"), ("dev", "val"), ("test", "test_2016_flickr")):
            overrides += [f"data.{split}.src={data}/{name}.de.gz", f"data.{split}.tgt={data}/{name}.en.gz"]
    if smoke:  # the recipe's smallest model, a small vocabulary and batches (the steps: --steps)
        keep = ("model.", "tokenizer.", "train.max_tokens")
        overrides += [f"{key}={value}" for key, value in smoke_settings(arch).items() if key.startswith(keep)]
    cfg = load_config(REPO / RECIPES[arch], overrides)
    with tempfile.TemporaryDirectory() as tmp:
        cfg.train.run_dir = Path(tmp)
        trainer = Trainer(cfg, RunDir(Path(tmp)), quiet)
        trainer.setup(resume=False)
        batches = trainer.sampler.batches(0)
        accum = cfg.train.accum_steps
        yield trainer, [batches[i : i + accum] for i in range(0, len(batches), accum)]


def child(arch: str, steps: int, threads: int, data: Path | None, device: str, precision: str,
          compile_: bool, smoke: bool = False) -> dict:
    """One recipe in this process: returns its measurements."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from attnmt.data.batching import gather

    with recipe_trainer(arch, threads, data, device, precision, compile_, smoke) as (trainer, groups):
        start = time.perf_counter()
        for group in groups[:5]:
            trainer.train_step(group)
        warmup_seconds = time.perf_counter() - start  # with compile: the compilation, mostly
        with FlopCounterMode(display=False) as counter:
            trainer.train_step(groups[5])
        flops_per_token = counter.get_total_flops() / sum(
            gather(trainer.train_data, i).n_tgt_tokens + gather(trainer.train_data, i).n_src_tokens
            for i in groups[5]
        )
        measured = groups[6 : 6 + steps]
        start = time.perf_counter()
        tokens = tgt_tokens = 0
        for group in measured:
            result = trainer.train_step(group)
            tokens += result.tokens
            tgt_tokens += result.tgt_tokens
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return {
        "device": device,
        "precision": precision,
        "compile": compile_,
        "warmup_seconds": warmup_seconds,
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
        "arch": arch,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "steps": len(measured),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "tgt_tokens_per_s": tgt_tokens / seconds,
        "flops_per_token": flops_per_token,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def parts(threads: int, smoke: bool = False) -> None:
    """The pieces of a training step that the profile of a Multi30k Transformer step put on top, each
    against what it replaced, forward + backward, in this one process (median of 10 after 2 warm-ups).
    ``smoke``: each piece once, at the smallest sizes (CI's smoke run)."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO))
    from attnmt.config.schema import load_config
    from attnmt.models import build_model
    from attnmt.models.dropout import dropout
    from attnmt.models.kernels import math_attention
    from attnmt.models.loss import label_smoothed_nll
    from attnmt.training.optim import make_optimizer

    torch.set_num_threads(threads)
    warmups, calls = (0, 1) if smoke else (2, 10)
    rows_, width = (64, 64) if smoke else (4096, 1024)  # a feed-forward activation
    pieces, vocabulary = (64, 100) if smoke else (3500, 8000)  # a batch's target pieces x the vocabulary
    shape = (4, 2, 5, 8) if smoke else (150, 4, 27, 64)  # attention's (batch, heads, length, d_head)
    recipe = [f"{k}={v}" for k, v in smoke_settings("transformer").items() if k.startswith("model.")] \
        if smoke else []

    def ms(f) -> float:
        for _ in range(warmups):
            f()
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return 1000 * statistics.median(times)

    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows_, width, dtype=dtype, requires_grad=True)
        ours = ms(lambda x=x: dropout(x, 0.2).sum().backward())
        rows.append((f"dropout 0.2 on {rows_}x{width} {str(dtype)[6:]}", "F.dropout (bernoulli_)",
                     ms(lambda x=x: F.dropout(x, 0.2, True).sum().backward()), "attnmt (SFC64 words)", ours))
        rand_mask = lambda x=x: x * (torch.rand(x.shape) >= 0.2).to(x.dtype).mul_(1.25)  # noqa: E731
        rows.append((f"dropout 0.2 on {rows_}x{width} {str(dtype)[6:]}", "torch.rand mask",
                     ms(lambda f=rand_mask: f().sum().backward()), "attnmt (SFC64 words)", ours))
    logits = torch.randn(1, pieces, vocabulary, requires_grad=True)
    target = torch.randint(1, vocabulary, (1, pieces))

    def two_cross_entropies():
        flat, flat_target = logits.flatten(0, 1), target.flatten()
        loss = F.cross_entropy(flat, flat_target, reduction="sum", label_smoothing=0.1)
        with torch.no_grad():
            F.cross_entropy(flat, flat_target, reduction="sum")
        loss.backward()

    rows.append((f"loss + nll, {pieces} x {vocabulary}", "F.cross_entropy twice", ms(two_cross_entropies),
                 "one log_softmax", ms(lambda: label_smoothed_nll(logits, target, 0, 0.1).loss.backward())))
    q, k, v = (torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mask = torch.ones(shape[0], 1, 1, shape[2], dtype=torch.bool)
    mask[::2, :, :, shape[2] * 3 // 4:] = False
    rows.append((f"attention bf16 {shape}", "SDPA (fused CPU kernel)",
                 ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()),
                 "math, softmax in fp32", ms(lambda: math_attention(q, k, v, mask)[0].sum().backward())))
    cfg = load_config(REPO / RECIPES["transformer"], recipe)
    model = build_model(cfg.model, vocabulary, vocabulary)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fused = make_optimizer(model, cfg.train)
    count = sum(p.numel() for p in model.parameters())
    rows.append((f"AdamW step, {count / 1e6:.1f}M parameters", "per-tensor loop", ms(plain.step), "fused",
                 ms(fused.step)))
    print(f"{'piece':<34}{'before':<26}{'ms':>8}   {'now':<24}{'ms':>8}{'speed-up':>10}")
    for piece, old, old_ms, new, new_ms in rows:
        print(f"{piece:<34}{old:<26}{old_ms:>8.1f}   {new:<24}{new_ms:>8.1f}{old_ms / new_ms:>9.2f}x")


def run_joey(arch: str, budget: int) -> dict | None:
    anchors = Path(os.environ.get("ANCHORS_DIR", Path.home() / ".cache" / "attnmt-anchors"))
    if not (anchors / "venv" / "bin" / "python").exists():
        print(f"JoeyNMT: no venv at {anchors}/venv; run bash {PEERS}/setup.sh and prepare_data.sh first",
              file=sys.stderr)
        return None
    env = {**os.environ, "VALIDATION_FREQ": "100000", "LOGGING_FREQ": "10", "TAG": "_bench"}
    out = subprocess.run(["bash", str(PEERS / "run_joey.sh"), JOEY_NAMES[arch], str(budget)],
                         env=env, capture_output=True, text=True)
    match = re.search(r'"target_tokens_per_s_median":\s*([\d.]+)', out.stdout)
    if not match:
        print(f"JoeyNMT {arch}: no throughput in its log:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}",
              file=sys.stderr)
        return None
    return {"arch": arch, "tgt_tokens_per_s": float(match.group(1))}


def _child(tree: Path, args, arch: str, precision: str, compile_: str, extra: tuple = ()) -> dict:
    """One measuring child, run from the checkout ``tree`` (its script, its attnmt)."""
    cmd = [sys.executable, str(benchmark_in(tree, "bench_train.py")), "--child", arch, *extra,
           "--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device,
           "--precision", precision,
           "--compile", compile_]
    cmd += (["--data", str(args.data.resolve())] if args.data else []) + (["--smoke"] if args.smoke else [])
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"{tree}: {arch} {precision} compile {compile_} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[7:])


def against(args) -> None:
    """This checkout against ``args.against``, alternating child by child: tokens/s of each, their ratio."""
    trees = {"this": REPO, "against": args.against.resolve()}
    for arch in args.archs:
        for precision in args.precision:
            speeds: dict[str, list[float]] = {name: [] for name in trees}
            for round_ in range(args.rounds):
                for name, tree in (trees.items() if round_ % 2 == 0 else reversed(trees.items())):
                    speeds[name].append(_child(tree, args, arch, precision, args.compile[0])["tokens_per_s"])
                    print(f"{arch} {precision} round {round_ + 1} {name}: {speeds[name][-1]:,.0f} tokens/s",
                          flush=True)
            this, other = (statistics.median(speeds[name]) for name in trees)
            print(f"{arch} {precision}: this {this:,.0f} tokens/s, {trees['against']} {other:,.0f}: "
                  f"{this / other:.3f}x (medians of {args.rounds} rounds)")


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("--steps", type=Number(int, low=1), default=40)
    ap.add_argument("--threads", type=Number(int, low=1), default=2)
    ap.add_argument("--archs", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--data", type=InputFolder(),
                    help="folder with Multi30k {train,val,test_2016_flickr}.{de,en}.gz "
                         "(default: the recipes' paths)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"],
                    help="train.precision values to measure, each in its own child (fp16: CUDA only)")
    ap.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on"],
                    help="train.compile values to measure (on: torch.compile; its compile time is reported "
                         "apart, as warm-up seconds)")
    ap.add_argument("--joey", type=Number(int, low=0), default=0, metavar="SECONDS",
                    help="also run JoeyNMT for this many seconds per arch")
    ap.add_argument("--parts", action="store_true",
                    help="time the pieces of a step against what they replaced, and nothing else")
    ap.add_argument("--profile", action="store_true",
                    help="where a step's time goes (scripts/bench/train_profile.py): each --archs recipe in "
                         "each --precision, --steps profiled steps, a table by category")
    ap.add_argument("--against", type=InputFolder(), metavar="CHECKOUT",
                    help="another attnmt checkout (say, git worktree add /tmp/old HEAD~3): its children and "
                         "this one's alternate, --rounds times, and the ratio of their median tokens/s is "
                         "printed")
    ap.add_argument("--rounds", type=Number(int, low=1), default=3)
    ap.add_argument("--smoke", action="store_true",
                    help="CI's smoke run (its numbers mean nothing): each recipe's smallest model and a "
                    "100-piece vocabulary, the matmul peak on 128 x 128, --parts each piece once at the "
                    "smallest sizes")
    ap.add_argument("--child", choices=list(RECIPES), help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    ap.checks.append(check_folders)
    return ap


def check_folders(args) -> None:
    """--data holds the three splits' files; --against is an attnmt checkout (its children run its own
    scripts/bench/bench_train.py, or the one in its scripts/ folder in a checkout from before the move)."""
    names = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]
    missing = [name for name in names if args.data and not (args.data / name).is_file()]
    if missing:
        raise DataError(f"--data {args.data}: no {', '.join(missing)} in it")
    if args.against and benchmark_in(args.against, "bench_train.py") is None:
        raise DataError(f"--against {args.against}: no scripts/bench/bench_train.py in it; give an attnmt "
                        "checkout")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.against:
        against(args)
        return
    if args.parts:
        parts(args.threads, args.smoke)
        return
    if args.child and args.profile_child:
        with recipe_trainer(args.child, args.threads, args.data, args.device, args.precision[0],
                            args.compile[0] == "on", args.smoke) as (trainer, groups):
            print("RESULT " + json.dumps(profile_steps(trainer, groups, args.steps)))
        return
    if args.profile:
        for arch in args.archs:
            print(f"\n{arch} ({RECIPES[arch]}), {args.steps} profiled steps, {args.threads} threads")
            report({precision: _child(REPO, args, arch, precision, args.compile[0], ["--profile-child"])
                    for precision in args.precision})
        return
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.steps, args.threads, args.data, args.device,
                                           args.precision[0], args.compile[0] == "on", args.smoke)))
        return

    on_cpu, n = args.device == "cpu", 128 if args.smoke else 2048
    peaks = {dtype: matmul_peak(args.threads, dtype, n) for dtype in ("fp32", "bf16")} if on_cpu else {}
    for dtype, peak in peaks.items():
        print(f"{dtype} matmul peak (torch.mm {n}, {args.threads} threads): {peak:.1f} GFLOP/s")
    if not peaks:
        print("on CUDA: MFU is not computed (no measured peak); see peak GPU memory instead")
    rows = []
    for arch in args.archs:
        joey = run_joey(arch, args.joey) if args.joey else None
        for precision in args.precision:
            for compile_ in args.compile:
                cmd = [sys.executable, __file__, "--child", arch, "--steps", str(args.steps),
                       "--threads", str(args.threads), "--device", args.device, "--precision", precision,
                       "--compile", compile_]
                cmd += (["--data", str(args.data)] if args.data else []) + (["--smoke"] if args.smoke else [])
                out = subprocess.run(cmd, capture_output=True, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"{arch} {precision} compile {compile_} failed:\n{out.stderr[-3000:]}")
                result = json.loads(line[7:])
                # MFU against the matmul peak of the precision the products ran in.
                peak = peaks.get("bf16" if precision == "bf16" else "fp32", float("nan"))
                result["mfu"] = result["flops_per_token"] * result["tokens_per_s"] / (peak * 1e9)
                result["joey"] = joey
                rows.append(result)

    print(f"\n{'recipe':<12}{'precision':>10}{'compile':>8}{'warm-up s':>10}{'params':>11}"
          f"{'tok/s (src+tgt)':>17}{'tgt tok/s':>11}{'peak MiB':>10}{'MFU':>7}{'JoeyNMT tgt tok/s':>19}"
          f"{'ratio':>7}")
    for r in rows:
        joey = r["joey"]["tgt_tokens_per_s"] if r["joey"] else None
        joey_text = f"{joey:,.0f}" if joey else "-"
        ratio_text = f"{r['tgt_tokens_per_s'] / joey:.2f}x" if joey else "-"
        compiled = "on" if r["compile"] else "off"
        print(f"{r['arch']:<12}{r['precision']:>10}{compiled:>8}{r['warmup_seconds']:>10.1f}{r['parameters']:>11,}"
              f"{r['tokens_per_s']:>17,.0f}{r['tgt_tokens_per_s']:>11,.0f}"
              f"{r['peak_rss_mib']:>10,.0f}{r['mfu']:>7.1%}{joey_text:>19}{ratio_text:>7}")
    print("\n" + json.dumps(rows))


if __name__ == "__main__":
    main()
