"""The attention explorer page on 100 synthetic sentences shaped like Multi30k with the toy Transformer's
depth (3 encoder and 3 decoder layers, 4 heads, 10-30 pieces a side): its size with every kind of
attention and with cross-attention only, what makes up the size, and the time headless Chromium takes
from ``driver.get(file://...)`` until the first heatmap is drawn (median of several loads).

    python scripts/bench/bench_explorer.py
    python scripts/bench/bench_explorer.py --sentences 500 --loads 5
    python scripts/bench/bench_explorer.py --page runs/m30k/explorer.html   # a page attnmt plot --html wrote

Two times per load: ``window.explorerReady`` (``performance.now()`` at the first draw, so from the
navigation's start, as the page sees it) and the wall time around ``driver.get`` plus polling for it (adds
WebDriver's round trips). Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them).
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from scriptargs import InputFile, Number, ScriptParser, guarded

from attnmt.errors import ConfigError
from attnmt.insight.explorer import ExplorerSentence, explorer_html, write_explorer

SYLLABLES = ["ein", "mann", "fahr", "rad", "der", "die", "hund", "spiel", "en", "t", "er", "ball", "auf",
             "dem", "gras", "frau", "kind", "lauf", "st", "wasser", "rot", "blau", "s", "ung"]


def pieces(rng: np.random.Generator, n: int) -> list[str]:
    """n - 1 sentencepiece-like pieces (about a third continuing a word) and "</s>"."""
    out = [("▁" if k == 0 or rng.random() < 0.65 else "") + str(rng.choice(SYLLABLES)) for k in range(n - 1)]
    return [*out, "</s>"]


def synthetic(rng: np.random.Generator, number: int, layers: int, heads: int, kinds: tuple[str, ...],
              shortest: int, longest: int) -> ExplorerSentence:
    src = pieces(rng, int(rng.integers(shortest, longest + 1)))
    tgt = pieces(rng, int(rng.integers(shortest, longest + 1)))
    tgt_in = ["<s>", *tgt[:-1]]
    shapes = {"cross": (len(tgt), len(src)), "enc_self": (len(src), len(src)),
              "dec_self": (len(tgt_in), len(tgt_in))}
    # Peaky rows, as trained attention is: a Dirichlet with a small concentration.
    maps = {kind: [rng.dirichlet(np.full(shapes[kind][1], 0.3), size=(heads, shapes[kind][0]))
                   for _ in range(layers)] for kind in kinds}
    return ExplorerSentence(number, src, tgt, tgt_in, maps)


def breakdown(page: str) -> dict[str, int]:
    """Bytes of the page's parts: JSON, base64 weights, quantised weights before deflate, the rest."""
    data = re.search(r'<script id="explorer-data"[^>]*>(.*?)</script>', page, re.S).group(1)
    weights = re.search(r'<script id="explorer-weights"[^>]*data-bytes="(\d+)">(.*?)</script>', page, re.S)
    total = len(page.encode("utf-8"))
    json_bytes, b64 = len(data.encode("utf-8")), len(weights.group(2))
    return {"total": total, "json": json_bytes, "weights_base64": b64, "weights_raw": int(weights.group(1)),
            "code_and_markup": total - json_bytes - b64}


READY = "return window.explorerError ? -1 : (window.explorerReady ?? null)"


def load_times(path: Path, loads: int) -> tuple[list[float], list[float]]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1100"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    in_page, wall = [], []
    try:
        for _ in range(loads + 1):  # the first load warms the browser up and is not counted
            driver.get("about:blank")
            started = time.perf_counter()
            driver.get(path.as_uri())
            ready = None
            while ready is None:
                ready = driver.execute_script(READY)
            if ready < 0:
                raise RuntimeError(driver.execute_script("return window.explorerError"))
            wall.append((time.perf_counter() - started) * 1000)
            in_page.append(float(ready))
    finally:
        driver.quit()
    return in_page[1:], wall[1:]


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=Number(int, low=1), default=100)
    parser.add_argument("--layers", type=Number(int, low=1), default=3)
    parser.add_argument("--heads", type=Number(int, low=1), default=4)
    parser.add_argument("--shortest", type=Number(int, low=1, high=10_000), default=10)
    parser.add_argument("--longest", type=Number(int, low=1, high=10_000), default=30)
    parser.add_argument("--loads", type=Number(int, low=1), default=5)
    parser.add_argument("--seed", type=Number(int, low=0), default=0)
    parser.add_argument("--page", type=InputFile(), nargs="*", default=[],
                        help="measure these pages (written by attnmt plot --html) instead")
    parser.checks.append(check_lengths)
    return parser


def check_lengths(args) -> None:
    if args.shortest > args.longest:
        raise ConfigError(f"--shortest {args.shortest} is more than --longest {args.longest}")


def check_browser() -> None:
    """Checked first: Selenium would otherwise try to download a driver."""
    missing = [p for p in ("/usr/bin/chromium", "/usr/bin/chromedriver") if not Path(p).is_file()]
    if missing:
        raise ConfigError(f"{', '.join(missing)} missing: make test installs chromium and chromium-driver")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    check_browser()
    if args.page:
        print(f"{'page':<40}{'KB':>9}{'first draw ms':>15}{'wall ms':>9}")
        for path in args.page:
            in_page, wall = load_times(path.resolve(), args.loads)
            print(f"{str(path):<40}{path.stat().st_size / 1024:>9.1f}{statistics.median(in_page):>15.0f}"
                  f"{statistics.median(wall):>9.0f}")
        return

    print(f"{args.sentences} sentences, {args.layers} layers, {args.heads} heads, "
          f"{args.shortest}-{args.longest} pieces a side")
    print(f"{'kinds':<26}{'page KB':>9}{'JSON KB':>9}{'weights KB':>12}{'raw KB':>9}{'build s':>9}"
          f"{'first draw ms':>15}{'wall ms':>9}")
    for kinds in (("cross", "enc_self", "dec_self"), ("cross",)):
        rng = np.random.default_rng(args.seed)
        sentences = [synthetic(rng, k + 1, args.layers, args.heads, kinds, args.shortest, args.longest)
                     for k in range(args.sentences)]
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "explorer.html"
            started = time.perf_counter()
            written = write_explorer(path, sentences)
            build = time.perf_counter() - started
            parts = breakdown(explorer_html(sentences))
            assert parts["total"] == written
            in_page, wall = load_times(path, args.loads)
        print(f"{' + '.join(kinds):<26}{written / 1024:>9.1f}{parts['json'] / 1024:>9.1f}"
              f"{parts['weights_base64'] / 1024:>12.1f}{parts['weights_raw'] / 1024:>9.1f}{build:>9.2f}"
              f"{statistics.median(in_page):>15.0f}{statistics.median(wall):>9.0f}")
        deflated = parts["weights_base64"] * 3 / 4 / parts["weights_raw"]
        print(f"  ({written} bytes; deflate keeps {deflated:.0%} of the uint8 bytes, before base64; "
              f"first draw ms of each load: "
              f"{', '.join(f'{t:.0f}' for t in in_page)})")


if __name__ == "__main__":
    main()
