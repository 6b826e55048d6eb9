"""``bench_serve.py --hog N``: the server beside N busy processes, as on a machine that other work loads.

``hogs(n)`` starts N processes that each keep a core busy (plain Python arithmetic at the default priority,
as any ordinary job would; each stops by itself after ``limit`` seconds, and is killed on the way out).
``hog_run`` starts the server on a quiet machine and times its start-up, then, per level of ``--clients``,
sends ``--seconds`` of legitimate requests (one sentence each, the model's settings, each client sending
its next as soon as its answer comes) alone, then as long again beside the hogs; and finally starts the
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


@contextlib.contextmanager
def hogs(n: int, limit: float = 3600) -> Iterator[list[subprocess.Popen]]:
    """N busy processes while the block runs."""
    started = [subprocess.Popen([sys.executable, "-c", BUSY.format(limit=limit)]) for _ in range(n)]
    try:
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait()


async def phase(url: str, sentences: list[str], clients: int, seconds: float, seen: dict[str, str],
                learn: bool) -> dict:
    """``clients`` legitimate clients for ``seconds``; ``seen``: each sentence's translation alone, checked,
    and with ``learn`` (the quiet phase) filled where missing."""
    import aiohttp

    record: dict[int, list[float]] = {}
    wrong = unchecked = 0
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=600)) as client:
        until = time.perf_counter() + seconds

        async def worker(k: int) -> None:
            nonlocal wrong, unchecked
            while time.perf_counter() < until:
                text = sentences[k % len(sentences)]
                k += clients
                t0 = time.perf_counter()
                try:
                    async with client.post("/translate", json={"text": text}) as answer:
                        status, body = answer.status, await answer.json(content_type=None)
                except (aiohttp.ClientError, ValueError):
                    status, body = 0, None
                record.setdefault(status, []).append(time.perf_counter() - t0)
                if status != 200:
                    continue
                found = body["translations"][0]["outputs"][0]["text"]
                if text in seen:
                    wrong += seen[text] != found
                elif learn:
                    seen[text] = found
                else:
                    unchecked += 1

        await asyncio.gather(*(worker(k) for k in range(clients)))
    return {"record": record, "wrong": wrong, "unchecked": unchecked}


def summary(result: dict, percentile) -> dict:
    record = result["record"]
    answered = record.get(200, [])
    return {"requests": sum(len(times) for times in record.values()),
            "errors": {str(status): len(times) for status, times in sorted(record.items()) if status != 200},
            "wrong": result["wrong"], "unchecked": result["unchecked"],
            **{f"p{q}_ms": round(percentile(answered, q) * 1000, 1) for q in (50, 99)}}


def hog_run(model: str, args, sentences: list[str], start_server, stop, percentile, log) -> dict:
    """``--hog``: start-up alone, each level alone then beside the hogs, start-up beside them."""
    serve_args = args.serve_args.split()
    out: dict = {"hogs": args.hog, "levels": []}
    t0 = time.perf_counter()
    process, url = start_server(model, serve_args, log)
    out["startup_alone_s"] = round(time.perf_counter() - t0, 1)
    seen: dict[str, str] = {}
    try:
        for clients in args.clients:
            quiet = asyncio.run(phase(url, sentences, clients, args.seconds, seen, learn=True))
            with hogs(args.hog):
                time.sleep(1)
                busy = asyncio.run(phase(url, sentences, clients, args.seconds, seen, learn=False))
            level = {"clients": clients, "alone": summary(quiet, percentile),
                     "beside": summary(busy, percentile)}
            out["levels"].append(level)
            print(level, flush=True)
        stop(process)
    finally:
        if process.poll() is None:
            process.kill()
    with hogs(args.hog):
        time.sleep(1)
        t0 = time.perf_counter()
        process, url = start_server(model, serve_args, log)
        out["startup_beside_s"] = round(time.perf_counter() - t0, 1)
        stop(process)
    return out


def hog_report(out: dict) -> None:
    print(f"\nlegitimate clients alone, then beside {out['hogs']} busy process(es); server start-up "
          f"{out['startup_alone_s']} s alone, {out['startup_beside_s']} s beside them")
    print("| clients | requests alone / beside | errors alone / beside | wrong beside "
          "| p50 ms alone / beside | p99 ms alone / beside |")
    print("| --- | --- | --- | --- | --- | --- |")
    for level in out["levels"]:
        alone, beside = level["alone"], level["beside"]
        errors = f"{sum(alone['errors'].values())} / {sum(beside['errors'].values())}"
        errors += f" {beside['errors']}" if beside["errors"] else ""
        print(f"| {level['clients']} | {alone['requests']} / {beside['requests']} | {errors} | "
              f"{beside['wrong']} | {alone['p50_ms']} / {beside['p50_ms']} | {alone['p99_ms']} / "
              f"{beside['p99_ms']} |")
