"""``bench_serve.py --hog N``: the server beside N busy processes, as on a machine that other work loads.

``hogs(n)`` starts N processes that each keep a core busy (plain Python arithmetic at the default priority,
as any ordinary job would; with ``--hog-torch`` matrix products on torch's threads, as a training job;
each stops by itself after ``limit`` seconds, and is killed on the way out).
``hog_run`` starts the server on a quiet machine and times its start-up, then, per level of ``--clients``,
sends ``--seconds`` of legitimate requests (one sentence each, the model's settings, each client sending
its next as soon as its answer comes; with ``--bulk-lines K``, one more client sending K sentences a
request, which the bulk lane decodes) alone, then as long again beside the hogs; and finally starts the
server again beside the hogs, for the start-up time there. An answer is correct when it is 200 and its
translation is the one the same sentence got alone (a sentence first sent beside the hogs is checked
against nothing, and counted apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

BUSY = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    sum(range(1000))\n"
# A training job's kind of work: matrix products on torch's threads, one per core, which spin while they wait.
BUSY_TORCH = ("import time, torch\nend = time.monotonic() + {limit}\na = torch.randn(256, 256)\n"
              "while time.monotonic() < end:\n    a = torch.tanh(a @ a * 0.01)\n")


@contextlib.contextmanager
def hogs(n: int, limit: float = 3600, torch: bool = False) -> Iterator[list[subprocess.Popen]]:
    """N busy processes while the block runs (``torch``: each multithreaded, as a training job)."""
    code = (BUSY_TORCH if torch else BUSY).format(limit=limit)
    started = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    try:
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait()


async def phase(url: str, sentences: list[str], clients: int, seconds: float, seen: dict[str, str],
                learn: bool, bulk: int = 0) -> dict:
    """``clients`` legitimate clients of one sentence a request for ``seconds``, and with ``bulk`` one more
    that sends ``bulk`` sentences a request (the bulk lane's); ``seen``: each sentence's translation
    alone, checked, and with ``learn`` (the quiet phase) filled where missing."""
    import aiohttp

    records: dict[str, dict[int, list[float]]] = {"one": {}, "bulk": {}}
    counts = {"wrong": 0, "unchecked": 0}
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients + 1),
                                     timeout=aiohttp.ClientTimeout(total=600)) as client:
        until = time.perf_counter() + seconds

        async def worker(k: int, size: int, record: dict[int, list[float]]) -> None:
            while time.perf_counter() < until:
                texts = [sentences[(k + j) % len(sentences)] for j in range(size)]
                k += clients * size
                t0 = time.perf_counter()
                try:
                    async with client.post("/translate", json={"text": texts}) as answer:
                        status, body = answer.status, await answer.json(content_type=None)
                except (aiohttp.ClientError, ValueError):
                    status, body = 0, None
                record.setdefault(status, []).append(time.perf_counter() - t0)
                if status == 200:
                    check(texts, [t["outputs"][0]["text"] for t in body["translations"]])

        def check(texts: list[str], found: list[str]) -> None:
            for text, translation in zip(texts, found):
                if text in seen:
                    counts["wrong"] += seen[text] != translation
                elif learn:
                    seen[text] = translation
                else:
                    counts["unchecked"] += 1

        await asyncio.gather(*(worker(k, 1, records["one"]) for k in range(clients)),
                             *([worker(0, bulk, records["bulk"])] if bulk else []))
    return {"record": records["one"], "bulk": records["bulk"], **counts}


def summary(result: dict, percentile) -> dict:
    def of(record: dict[int, list[float]]) -> dict:
        answered = record.get(200, [])
        return {"requests": sum(len(times) for times in record.values()),
                "errors": {str(status): len(times) for status, times in sorted(record.items())
                           if status != 200},
                **{f"p{q}_ms": round(percentile(answered, q) * 1000, 1) for q in (50, 99)}}

    return {**of(result["record"]), "wrong": result["wrong"], "unchecked": result["unchecked"],
            "bulk": of(result["bulk"])}


def hog_run(model: str, args, sentences: list[str], start_server, stop, percentile, log) -> dict:
    """``--hog``: start-up alone, each level alone then beside the hogs, start-up beside them."""
    serve_args = args.serve_args.split()
    out: dict = {"hogs": args.hog, "torch": args.hog_torch, "bulk_lines": args.bulk_lines, "levels": []}
    t0 = time.perf_counter()
    process, url = start_server(model, serve_args, log)
    out["startup_alone_s"] = round(time.perf_counter() - t0, 1)
    seen: dict[str, str] = {}
    try:
        for clients in args.clients:
            quiet = asyncio.run(phase(url, sentences, clients, args.seconds, seen, True, args.bulk_lines))
            with hogs(args.hog, torch=args.hog_torch):
                time.sleep(1)
                busy = asyncio.run(phase(url, sentences, clients, args.seconds, seen, False, args.bulk_lines))
            level = {"clients": clients, "alone": summary(quiet, percentile),
                     "beside": summary(busy, percentile)}
            out["levels"].append(level)
            print(level, flush=True)
        stop(process)
    finally:
        if process.poll() is None:
            process.kill()
    with hogs(args.hog, torch=args.hog_torch):
        time.sleep(1)
        t0 = time.perf_counter()
        process, url = start_server(model, serve_args, log)
        out["startup_beside_s"] = round(time.perf_counter() - t0, 1)
        stop(process)
    return out


def hog_report(out: dict) -> None:
    kind = "torch" if out["torch"] else "Python"
    print(f"\nlegitimate clients alone, then beside {out['hogs']} busy {kind} process(es); server start-up "
          f"{out['startup_alone_s']} s alone, {out['startup_beside_s']} s beside them")
    print("| clients | requests alone / beside | errors alone / beside | wrong beside "
          "| p50 ms alone / beside | p99 ms alone / beside |")
    print("| --- | --- | --- | --- | --- | --- |")
    for level in out["levels"]:
        for kind in ("one", "bulk"):
            alone = level["alone"] if kind == "one" else level["alone"]["bulk"]
            beside = level["beside"] if kind == "one" else level["beside"]["bulk"]
            if not alone["requests"]:
                continue
            who = level["clients"] if kind == "one" else f"1 of {out['bulk_lines']} sentences"
            errors = f"{sum(alone['errors'].values())} / {sum(beside['errors'].values())}"
            errors += f" {beside['errors']}" if beside["errors"] else ""
            wrong = level["beside"]["wrong"] if kind == "one" else "(with the above)"
            print(f"| {who} | {alone['requests']} / {beside['requests']} | {errors} | {wrong} | "
                  f"{alone['p50_ms']} / {beside['p50_ms']} | {alone['p99_ms']} / {beside['p99_ms']} |")
