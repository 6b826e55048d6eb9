"""``attnmt serve`` under load on loopback, beside ``attnmt translate`` on the same sentences in one file.

N concurrent clients (default 1, 8, 32, 128), each sending one sentence per request and the next as soon
as the answer comes, until every sentence of the file has been sent once (bounded in count) or
``--seconds`` pass (bounded in time); per level: sentences/s, p50/p95/p99 latency, errors, and the
server's RSS before and after; greedy unless ``--beam-size``. ``translate`` runs on the same sentences in
one file, timed with its start-up (imports, model load) taken out: the time of the file minus the time
of one sentence. Beside each level, the ceiling of any server that decodes what has arrived: the
translator in this process on the same sentences in consecutive groups of N (N clients that each wait
for their answer never have more than N sentences waiting), in their order and sorted by length first
(about what continuous batching could reach).

    python scripts/bench/bench_serve.py runs/demo --src runs/demo/toy/test.en
    python scripts/bench/bench_serve.py runs/bootstrap_de_en_eflomal/forward \\
        --src ../shared/data/multi30k/test_2016_flickr.de.gz --clients 1 8 32 128
    python scripts/bench/bench_serve.py runs/demo --src runs/demo/toy/test.en --soak 10000 100000 --clients 32

``--soak A B``: RSS after A requests and after B (the goal: B's within 10% of A's), with the clients
cycling through the file.

``--hog N``: a busy machine. Per level of N legitimate clients, ``--seconds`` alone, then as long again
beside N processes that each keep a core busy; the server's start-up alone and beside them; errors,
answers that differ from the same sentence's alone, p50 and p99 (``busy.py``).

    python scripts/bench/bench_serve.py runs/demo --src runs/demo/toy/test.en --hog 2 --clients 64 \\
        --bulk-lines 54 --seconds 20

``--hostile H``: fairness under hostile load. Per level of N legitimate clients (one sentence a request,
the model's own settings, as the page sends them), ``--seconds`` of them alone, then as long again beside
H clients that send, as soon as each answer comes, the most expensive requests the server's limits allow
(read from ``/info``: as many sentences as allowed of as many characters, at the widest beam, as n-best
lists, and sampled). The goal: the legitimate clients' p99 within 2x of their p99 alone, and none of their
requests failing.

    python scripts/bench/bench_serve.py runs/demo --src runs/demo/toy/test.en --hostile 4 --clients 1 8 \\
        --seconds 30
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from busy import hog_report, hog_run
from scriptargs import InputFile, Model, Number, OutputFile, ScriptParser, guarded, require_module

from attnmt.data.readers import read_lines
from attnmt.errors import ConfigError


def rss_mib(pid: int) -> float:
    """The resident memory of the server and its children (the decoder process), MiB."""
    total = 0.0
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text(encoding="ascii").split():
            total += rss_mib(int(child))
    return total


def start_server(model: str, args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """The server, its stderr (the access log) to a file: a pipe this process drains would be read only
    when the clients' event loop lets go of the interpreter, and the server would wait on it."""
    with open(log, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "attnmt", "serve", model, "--port", "0", *args],
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    for _ in range(6000):  # 5 minutes: beside busy processes (--hog) a start-up takes longer
        first = log.read_text(encoding="utf-8").split("\n")[0]
        if first.startswith("attnmt serve: http://") or process.poll() is not None:
            break
        time.sleep(0.05)
    if not first.startswith("attnmt serve: http://"):
        process.kill()
        raise SystemExit(f"the server did not start: {log.read_text(encoding='utf-8')}")
    url = first.split()[2]
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as answer:
                if answer.status == 200:
                    break
        except OSError:
            time.sleep(0.1)
    return process, url


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def costliest(limits: dict, sentences: list[str]) -> list[dict]:
    """The most expensive requests ``limits`` (``/info``'s) allow, made of the corpus's sentences: every
    sentence as long as allowed, at the widest beam, as n-best lists, and sampled."""
    text, k = "", 0
    while len(text) < limits["max_chars"]:
        text += sentences[k % len(sentences)] + " "
        k += 1
    text = text[:limits["max_chars"]]
    lines = [text] * limits["max_sentences"]
    widest = limits["max_beam"]
    return [{"text": lines, "beam_size": widest}, {"text": lines, "beam_size": widest, "nbest": widest},
            {"text": lines, "sampling": True, "nbest": widest, "seed": 1}]


async def hostile_level(url: str, sentences: list[str], clients: int, hostile: int, seconds: float) -> dict:
    """``clients`` legitimate clients for ``seconds`` alone, then beside ``hostile`` clients sending
    ``costliest`` requests in turn; each client sends its next request when its answer comes."""
    import aiohttp

    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients + hostile),
                                     timeout=aiohttp.ClientTimeout(total=600)) as client:
        async with client.get("/info") as answer:
            heavy = costliest((await answer.json())["limits"], sentences)

        async def run(workers: int, bodies: list[dict], until: float, record: dict) -> None:
            sent = 0
            while time.perf_counter() < until:
                body = bodies[sent % len(bodies)]
                sent += workers
                t0 = time.perf_counter()
                try:
                    async with client.post("/translate", json=body) as answer:
                        await answer.read()
                        status = answer.status
                except aiohttp.ClientError:
                    status = 0
                record.setdefault(status, []).append(time.perf_counter() - t0)

        legit = [{"text": line} for line in sentences]
        quiet: dict = {}
        await asyncio.gather(*(run(clients, legit[k:] + legit[:k], time.perf_counter() + seconds, quiet)
                               for k in range(clients)))
        mixed: dict = {}
        attacked: dict = {}
        until = time.perf_counter() + seconds
        await asyncio.gather(*(run(clients, legit[k:] + legit[:k], until, mixed) for k in range(clients)),
                             *(run(1, heavy[k:] + heavy[:k], until, attacked) for k in range(hostile)))
    return {"clients": clients, "hostile": hostile, "quiet": summary(quiet), "mixed": summary(mixed),
            "hostile_answers": {str(status): len(times) for status, times in sorted(attacked.items())}}


def summary(record: dict) -> dict:
    """Requests, failures and latency percentiles of one phase's legitimate clients."""
    answered = record.get(200, [])
    return {"requests": sum(len(times) for times in record.values()),
            "errors": sum(len(times) for status, times in record.items() if status != 200),
            **{f"p{q}_ms": round(percentile(answered, q) * 1000, 1) for q in (50, 95, 99)}}


async def load(url: str, sentences: list[str], clients: int, total: int, seconds: float, beam: int) -> dict:
    """``clients`` workers over one connection pool (aiohttp: httpx's pool, not the server, capped this at
    about 230 requests/s with 128 connections); each takes the next sentence until ``total`` are sent or
    ``seconds`` pass."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    sent = 0
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=300)) as client:
        async with client.get("/info") as answer:
            before = (await answer.json())["batching"]
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal sent, errors
            while sent < total and time.perf_counter() - started < seconds:
                text = sentences[sent % len(sentences)]
                sent += 1
                t0 = time.perf_counter()
                try:
                    async with client.post("/translate", json={"text": text, "beam_size": beam}) as answer:
                        await answer.read()
                        ok = answer.status == 200
                except aiohttp.ClientError:
                    ok = False
                latencies.append(time.perf_counter() - t0)
                errors += not ok

        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - started
        async with client.get("/info") as answer:
            after = (await answer.json())["batching"]
    batches = after["batches"] - before["batches"]
    return {"clients": clients, "requests": len(latencies), "errors": errors, "seconds": round(elapsed, 2),
            "sentences_per_s": round(len(latencies) / elapsed, 1),
            **{f"p{q}_ms": round(percentile(latencies, q) * 1000, 1) for q in (50, 95, 99)},
            "mean_batch": round((after["sentences"] - before["sentences"]) / max(batches, 1), 1)}


def translate_rate(model: str, src: Path, lines: int, beam: int) -> dict:
    """``attnmt translate`` on the file, its start-up taken out (the time of one sentence)."""
    def timed(*args: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "attnmt", "translate", model, "--beam-size", str(beam), *args],
                       check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t0

    one = timed("a")
    whole = timed("-i", str(src))
    return {"sentences": lines, "seconds": round(whole, 2), "startup_s": round(one, 2),
            "sentences_per_s": round(lines / max(whole - one, 1e-9), 1)}


def group_rates(model: str, sentences: list[str], sizes: list[int], beam: int) -> dict[str, dict[int, float]]:
    """The ceiling of a server that decodes what has arrived: the translator in this process on the same
    sentences, in consecutive groups of N (N concurrent clients can have at most N sentences waiting),
    in their order ("arrival") and sorted by length first ("sorted": about what continuous batching,
    which keeps N rows decoding whatever their lengths, could reach)."""
    from attnmt.cli.common import open_translator
    from attnmt.decoding.translator import DecodeOverrides

    translator, _, _ = open_translator(Path(model), overrides=DecodeOverrides(beam))
    translator.translate(sentences[:8])  # warm
    pieces = [len(ids) for ids in translator.tokenizer.encode_src(sentences)]
    orders = {"arrival": sentences,
              "sorted": [sentences[i] for i in sorted(range(len(sentences)), key=pieces.__getitem__)]}
    rates: dict[str, dict[int, float]] = {name: {} for name in orders}
    for size in sizes:
        for name, ordered in orders.items():
            started = time.perf_counter()
            for k in range(0, len(ordered), size):
                translator.translate(ordered[k:k + size])
            rates[name][size] = round(len(ordered) / (time.perf_counter() - started), 1)
    return rates


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__)
    parser.add_argument("model", type=Model(exports=True))
    parser.add_argument("--src", type=InputFile(pipes=True), required=True,
                        help="Sentences, one per line (plain or .gz).")
    parser.add_argument("--limit", type=Number(int, low=1), default=1000,
                        help="The first N sentences of --src.")
    parser.add_argument("--clients", type=Number(int, low=1), nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--beam-size", type=Number(int, low=1), default=1,
                        help="Every request's, and translate's.")
    parser.add_argument("--seconds", type=Number(float, above=0), default=120,
                        help="At most this long per level.")
    parser.add_argument("--soak", type=Number(int, low=1), nargs=2, metavar=("A", "B"),
                        help="RSS after A and B requests.")
    parser.add_argument("--hostile", type=Number(int, low=1, high=1024),
                        help="Fairness: this many clients sending the costliest requests the limits allow, "
                        "beside the legitimate ones (see above).")
    parser.add_argument("--hog", type=Number(int, low=1, high=64),
                        help="A busy machine: each level alone, then beside this many busy processes; "
                        "start-up alone and beside them (see busy.py).")
    parser.add_argument("--hog-torch", action="store_true",
                        help="With --hog: the busy processes run torch's matrix products on every core.")
    parser.add_argument("--bulk-lines", type=Number(int, low=0, high=10_000), default=0,
                        help="With --hog: one more client sending this many sentences a request.")
    parser.add_argument("--serve-args", default="", help="More options for attnmt serve.")
    parser.add_argument("--json", type=OutputFile(), help="Write the results here too.")
    parser.checks.append(check_soak)
    return parser


def check_soak(args) -> None:
    if args.soak and args.soak[0] >= args.soak[1]:
        raise ConfigError(f"--soak {args.soak[0]} {args.soak[1]}: A must be less than B (RSS after A "
                          "requests, then after B)")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    require_module("aiohttp", "bench_serve needs aiohttp: pip install 'attnmt[serve]'")
    model = str(args.model)
    sentences = [line for line in read_lines(args.src) if line.strip()][: args.limit]
    src = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_serve_{os.getpid()}.txt"
    src.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    out: dict = {"model": model, "sentences": len(sentences), "cpu": os.cpu_count(),
                 "beam_size": args.beam_size}
    if args.hog:
        out["hog"] = hog_run(model, args, sentences, start_server, stop, percentile, src.with_suffix(".log"))
        src.unlink(missing_ok=True)
        src.with_suffix(".log").unlink(missing_ok=True)
        hog_report(out["hog"])
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        return
    if args.hostile:
        out["hostile"] = hostile_run(model, args, src)
        src.unlink(missing_ok=True)
        hostile_report(out)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        return
    try:
        if not args.soak:
            out["translate"] = translate_rate(model, src, len(sentences), args.beam_size)
            print(f"attnmt translate: {out['translate']}", flush=True)
            out["groups"] = group_rates(model, sentences, args.clients, args.beam_size)
            print(f"in-process groups of N: {out['groups']}", flush=True)
        process, url = start_server(model, args.serve_args.split(), src.with_suffix(".log"))
        try:
            out["rss_start_mib"] = round(rss_mib(process.pid), 1)
            out["levels"] = []
            if args.soak:
                first, second = args.soak
                for clients in args.clients:
                    asyncio.run(load(url, sentences, clients, first, 1e9, args.beam_size))
                    out["rss_after_a_mib"] = round(rss_mib(process.pid), 1)
                    level = asyncio.run(load(url, sentences, clients, second - first, 1e9, args.beam_size))
                    out["rss_after_b_mib"] = round(rss_mib(process.pid), 1)
                    out["levels"].append(level)
                    print(f"soak: {out}", flush=True)
            else:
                for clients in args.clients:
                    level = asyncio.run(load(url, sentences, clients, len(sentences), args.seconds,
                                                    args.beam_size))
                    level["rss_after_mib"] = round(rss_mib(process.pid), 1)
                    out["levels"].append(level)
                    print(level, flush=True)
            out["server_exit"] = stop(process)
        finally:
            if process.poll() is None:
                process.kill()
    finally:
        src.unlink(missing_ok=True)
        src.with_suffix(".log").unlink(missing_ok=True)
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


def hostile_run(model: str, args, src: Path) -> list[dict]:
    """``--hostile``: each level of ``--clients``, quiet then beside the hostile clients, on one server."""
    sentences = src.read_text(encoding="utf-8").splitlines()
    process, url = start_server(model, args.serve_args.split(), src.with_suffix(".log"))
    levels = []
    try:
        for clients in args.clients:
            levels.append(asyncio.run(hostile_level(url, sentences, clients, args.hostile, args.seconds)))
            print(levels[-1], flush=True)
        stop(process)
    finally:
        if process.poll() is None:
            process.kill()
        src.with_suffix(".log").unlink(missing_ok=True)
    return levels


def hostile_report(out: dict) -> None:
    print(f"\n{out['sentences']} sentences, {out['cpu']} CPU(s); legitimate clients alone, then beside "
          f"{out['hostile'][0]['hostile'] if out['hostile'] else 0} hostile ones")
    print("| clients | requests alone / mixed | errors alone / mixed | p50 ms alone / mixed | "
          "p99 ms alone / mixed | p99 mixed / alone | hostile answers |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for level in out["hostile"]:
        quiet, mixed = level["quiet"], level["mixed"]
        print(f"| {level['clients']} | {quiet['requests']} / {mixed['requests']} | {quiet['errors']} / "
              f"{mixed['errors']} | {quiet['p50_ms']} / {mixed['p50_ms']} | {quiet['p99_ms']} / "
              f"{mixed['p99_ms']} | {mixed['p99_ms'] / quiet['p99_ms']:.2f} | {level['hostile_answers']} |")


def stop(process: subprocess.Popen) -> int:
    process.terminate()
    return process.wait(120)


def report(out: dict) -> None:
    base = out.get("translate", {}).get("sentences_per_s")
    print(f"\n{out['sentences']} sentences, {out['cpu']} CPU(s); "
          f"server RSS at start {out['rss_start_mib']} MiB")
    if base:
        print(f"attnmt translate on one file: {base} sentences/s (start-up {out['translate']['startup_s']} s "
              "taken out)")
    print("| clients | requests | errors | sentences/s | x translate | in-process groups of N, x translate "
          "| sorted groups of N, x translate | p50 ms | p95 ms | p99 ms | mean batch | RSS after MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for level in out["levels"]:
        ratio = f"{level['sentences_per_s'] / base:.2f}" if base else "-"
        ceilings = []
        for order in ("arrival", "sorted"):
            group = out.get("groups", {}).get(order, {}).get(level["clients"])
            ceilings.append(f"{group} ({group / base:.2f})" if base and group else "-")
        print(f"| {level['clients']} | {level['requests']} | {level['errors']} | "
              f"{level['sentences_per_s']} | {ratio} | {' | '.join(ceilings)} | {level['p50_ms']} | "
              f"{level['p95_ms']} | "
              f"{level['p99_ms']} | {level['mean_batch']} | "
              f"{level.get('rss_after_mib', out.get('rss_after_b_mib'))} |")
    if "rss_after_a_mib" in out:
        a, b = out["rss_after_a_mib"], out["rss_after_b_mib"]
        print(f"RSS after the first requests {a} MiB, after all {b} MiB: {b / a - 1:+.1%}")
    print(f"server exit code after SIGTERM: {out.get('server_exit')}")


if __name__ == "__main__":
    main()
