"""The docs site's pictures (``docs/img/*.png``), made by the project from the toy demo model.

    python scripts/docs_figures.py                      # every picture into docs/img
    python scripts/docs_figures.py --only serve heads   # some of them
    python scripts/docs_figures.py --smoke              # the smallest model and sizes, never into docs/img

It trains the demo model (``configs/toy_transformer.yaml``, ``attnmt train CONFIG --run-dir RUN``) in
``--run``, or reuses it (a finished run is not trained again), and draws through attnmt's own code:
``cross-attention.png`` (one sentence, layers and heads averaged: ``plot.attention_figure``),
``head-grid.png`` (the last layer's heads: ``plot.sentence_maps``), ``curves.png`` (``plot-curves``'
figure); headless-Chromium screenshots (Debian's chromium and chromedriver, Selenium, 1200 pixels wide) of
``explorer.png`` (``attnmt plot --html`` on toy test pairs with gold alignments), ``serve.png`` (``attnmt
serve``'s page after two translations) and ``heads.png`` (``attnmt heads --html``); and
``study-bleu.png``, ``study-growth.png`` from a tiny ``attnmt study``. What else it writes (toy pairs,
pages, the study, logs) stays beside the run, in ``RUN-docs-figures``.

Each PNG is re-encoded by Pillow without metadata (screenshots as 256 colours) and must stay under 200 KB.
The same run gives the same matplotlib pictures byte for byte; serve's status line and the study's
pictures are measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "bench"))

from benchlib import smoke_settings  # noqa: E402  (--smoke: the recipes' smallest model)
from scriptargs import ConfigFile, OutputFolder, ScriptParser, guarded  # noqa: E402

from attnmt.errors import AttnmtError, ConfigError, ResourceError  # noqa: E402

MODEL_FIGURES = ("cross-attention", "head-grid", "curves", "explorer", "serve", "heads")
FIGURES = (*MODEL_FIGURES, "study-bleu", "study-growth")
SCREENSHOTS = {"explorer", "serve", "heads"}
STUDY_FIGURES = {"study-bleu": "bleu_over_minutes.png", "study-growth": "growth.png"}
MAX_BYTES = 200 * 1024
WIDTH, HEIGHT, TALLEST = 1200, 800, 1400  # the viewport a page loads in; a screenshot ends by TALLEST
SENTENCE = "saturday the 3rd of february 1904 at 5:15 pm"  # the heatmaps' sentence, a toy test source
SERVED = ("thursday , october 22nd , 2035 at 1:43 pm", "may 3rd 1919")
PAIRS, HEAD_PAIRS = 12, 40  # toy test pairs on the explorer page, and all of them
HEADS = ("--random-draws", 3)  # `attnmt heads`: each head's BLEU, three random prunings
SMOKE_HEADS = ("--limit", 4, "--no-bleu", "--random-draws", 0)
# The study: an LSTM and two Transformer kernels, narrower, 4,000 toy pairs, 2 minutes or 300 steps each.
STUDY = {"variants": "additive,sdpa,linear", "minutes": "2", "max_len": "1024"}
STUDY_SETS = ("data.train.size=4000", "data.dev.size=100", "model.d_model=64", "model.d_ff=128",
              "train.max_tokens=1024", "train.warmup_steps=50", "train.max_steps=300", "train.eval_every=30",
              "train.save_every=1000")
SMOKE_DATA = ("data.train.size=200", "data.dev.size=20", "data.test.size=20")
SMOKE_STUDY = {"variants": "sdpa", "minutes": "0.01", "max_len": "64"}
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CHILD_LIMIT_S = 1800


def smoke_sets() -> list[str]:
    """--smoke's ``--set`` words: benchlib's smallest Transformer, 8 steps (two points), 200/20/20 pairs."""
    settings = {**smoke_settings("transformer"), "train.max_steps": 8, "train.eval_every": 4,
                "train.save_every": 8}
    return [f"{key}={value}" for key, value in settings.items()] + list(SMOKE_DATA)


def set_words(sets: list[str]) -> list[str]:
    return [word for value in sets for word in ("--set", value)]


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=ConfigFile(lambda args: smoke_sets() if args.smoke else []),
                        default=REPO / "configs" / "toy_transformer.yaml",
                        help="the demo model's recipe (default: configs/toy_transformer.yaml)")
    parser.add_argument("--run", type=OutputFolder(), help="the demo model's run folder: trained there, or "
                        "reused (default: runs/docs_figures/toy; --smoke: runs/docs_figures/smoke)")
    parser.add_argument("--out", type=OutputFolder(), help="where the pictures go (default: docs/img; "
                        "--smoke: runs/docs_figures/smoke-img, never the docs' own)")
    parser.add_argument("--only", nargs="+", choices=FIGURES, metavar="NAME",
                        help=f"only these pictures: {', '.join(FIGURES)}")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest model, data and study (CI's smoke run; the pictures mean nothing)")
    parser.checks += [default_folders, check_run]
    return parser


def default_folders(args: argparse.Namespace) -> None:
    """--run and --out left out: the demo model and docs/img, or --smoke's own (another config, and pictures
    that mean nothing)."""
    runs = REPO / "runs" / "docs_figures"
    args.run = args.run or runs / ("smoke" if args.smoke else "toy")
    args.out = args.out or (runs / "smoke-img" if args.smoke else REPO / "docs" / "img")


def workspace(run: Path) -> Path:
    """What the script writes besides the pictures: beside the run folder, RUN-docs-figures."""
    return run.absolute().with_name(f"{run.absolute().name}-docs-figures")


def check_run(args: argparse.Namespace) -> None:
    """--out apart from --run and its workspace, and a browser when a page is shot."""
    out = args.out.absolute()
    for name, folder in (("--run", args.run.absolute()), ("the workspace of --run", workspace(args.run))):
        if folder == out or folder in out.parents or out in folder.parents:
            raise ConfigError(f"--out {args.out}: the pictures and {name} {folder} must be apart; give "
                              "another folder")
    if SCREENSHOTS & set(args.only or FIGURES):
        missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).is_file()]
        if missing:
            raise ConfigError(f"{' and '.join(missing)} missing: the pages' screenshots need Debian's "
                              "chromium and chromium-driver (or leave them out with --only)")


# ------------------------------------------------------------------------------------------ children


class Child:
    """``python -m attnmt ARGS`` in a child process, its output into ``log``; ``wait`` raises its failure
    as this script's one error line, with its exit code."""

    def __init__(self, log: Path, *args, cwd: Path | None = None) -> None:
        self.log, self.words = log, [str(a) for a in args]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        with open(log, "w", encoding="utf-8") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "attnmt", *self.words], cwd=cwd, env=env,
                                            stdout=out, stderr=subprocess.STDOUT)

    def wait(self) -> None:
        try:
            code = self.process.wait(CHILD_LIMIT_S)
        finally:
            self.stop()  # past its time, or this script interrupted: the child goes too
        if code != 0:
            raise child_error(f"attnmt {self.words[0]}", code, self.log)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def attnmt(log: Path, *args, cwd: Path | None = None) -> None:
    """A child run through (``Child``)."""
    Child(log, *args, cwd=cwd).wait()


def child_error(what: str, code: int, log: Path) -> AttnmtError:
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
             if line.strip()]
    said = ([line for line in lines if line.startswith("error:")] or lines or ["(no output)"])[-1]
    error = AttnmtError(f"{what} failed (exit {code}): {said.removeprefix('error: ')} (log: {log})")
    error.exit_code = code if 0 < code < 128 else 1
    return error


class Server(Child):
    """``attnmt serve RUN --port 0`` from RUN's parent (the page names the model by that short path),
    started at once; ``url`` waits for the first line that says where it listens."""

    def __init__(self, run: Path, log: Path) -> None:
        super().__init__(log, "serve", run.name, "--port", 0, "--threads", 1, "--grace", 5, cwd=run.parent)

    def url(self) -> str:
        deadline = time.monotonic() + 120
        while not self.log.read_text(encoding="utf-8").startswith("attnmt serve: http://"):
            if self.process.poll() is not None:
                raise child_error("attnmt serve", self.process.returncode, self.log)
            if time.monotonic() > deadline:
                raise ResourceError(f"attnmt serve did not start within 120 s (log: {self.log})")
            time.sleep(0.1)
        return self.log.read_text(encoding="utf-8").split()[2]


def write_png(data: bytes, path: Path, palette: bool) -> int:
    """``data`` (a PNG) re-encoded into ``path`` by Pillow: no metadata chunk, zlib at its best
    (``optimize``), a screenshot as 256 colours; its size in bytes, under MAX_BYTES or an error."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    if palette:
        image = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    size = buffer.tell()
    if size > MAX_BYTES:
        raise ResourceError(f"{path.name} would be {size / 1024:.0f} KB, over the {MAX_BYTES // 1024} KB the "
                            "docs allow")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return size


def figure_png(fig) -> bytes:
    """A matplotlib figure as PNG bytes, by attnmt's ``save_figure`` (no date, no software)."""
    import tempfile

    from attnmt.insight.plot import save_figure

    with tempfile.TemporaryDirectory() as folder:
        return save_figure(fig, Path(folder) / "figure.png").read_bytes()


# ------------------------------------------------------------------------------------------ the figures


def heatmaps(run: Path, want: set[str]) -> dict[str, bytes]:
    """cross-attention (layers and heads averaged) and head-grid (the last layer's heads) of SENTENCE,
    read under teacher forcing from the model's own translation (beam 1, as ``attnmt plot`` reads it)."""
    import tempfile

    import numpy as np

    from attnmt.cli.common import open_for_attention
    from attnmt.insight.attention_maps import teacher_forced_attention
    from attnmt.insight.plot import attention_figure, sentence_maps

    translator, _, _ = open_for_attention(run, "cpu", 1)
    src = translator.encode([SENTENCE]).ids
    hyp = [found[0].tokens for found in translator.search(src)]
    [maps] = teacher_forced_attention(translator.model, src, hyp, translator.device, kinds=["cross"])
    cross = maps["cross"]
    tokenizer = translator.tokenizer
    cols, rows = tokenizer.src_pieces(src[0]) + ["</s>"], tokenizer.tgt_pieces(hyp[0]) + ["</s>"]
    drawn = {}
    if "cross-attention" in want:
        mean = np.mean(np.stack(cross), axis=(0, 1))
        title = f"cross-attention, {len(cross)} layers x {cross[0].shape[0]} heads averaged"
        drawn["cross-attention"] = figure_png(attention_figure(mean, cols, rows, title=title))
    if "head-grid" in want:
        with tempfile.TemporaryDirectory() as folder:
            [path] = sentence_maps(Path(folder), 1, {"cross": cross}, {"cross": (cols, rows)},
                                   layers=[len(cross) - 1])
            drawn["head-grid"] = path.read_bytes()
    return drawn


def curves(run: Path, title: str) -> bytes:
    """``attnmt plot-curves``' figure (``curves_figure`` on the run's metrics)."""
    from attnmt.insight.curves import curves_figure, read_metrics

    return figure_png(curves_figure(read_metrics(run / "metrics.jsonl"), title=title))


def pages(run: Path, work: Path, want: set[str], smoke: bool) -> dict[str, bytes]:
    """The explorer, heads and serve pages as screenshots (the commands run from RUN's parent: the pages
    name the model by its short path)."""
    toy = work / "toy"
    making = None if (toy / "test.align").is_file() else Child(
        work / "toy-data.log", "toy-data", toy, "--train-size", 1, "--dev-size", 1, "--test-size", HEAD_PAIRS)
    served = Server(run, work / "serve.log") if "serve" in want else None  # it loads while the rest runs
    test = {side: toy / f"test.{side}" for side in ("en", "de", "align")}
    shots = {}
    try:
        if making is not None:
            making.wait()
        with browser() as driver:
            if "explorer" in want:
                page = work / "explorer.html"
                attnmt(work / "plot.log", "plot", run.name, "-i", test["en"], "--tgt", test["de"], "--gold",
                       test["align"], "--limit", PAIRS, "--html", page, "--device", "cpu", cwd=run.parent)
                shots["explorer"] = shoot(driver, page.as_uri(), "explorerReady", "explorerError")
            if "heads" in want:
                page = work / "heads.html"
                attnmt(work / "heads.log", "heads", run.name, "--src", test["en"], "--tgt", test["de"],
                       "--html", page, "--device", "cpu", *(SMOKE_HEADS if smoke else HEADS), cwd=run.parent)
                shots["heads"] = shoot(driver, page.as_uri(), "headsReady", "headsError", "#heads-maps")
            if served is not None:
                shots["serve"] = shoot_serve(driver, served.url())
    finally:
        for child in (making, served):
            if child is not None:
                child.stop()
    return shots


@contextlib.contextmanager
def browser() -> Iterator:
    """Headless Chromium at WIDTH x HEIGHT, one device pixel per CSS pixel."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", "--force-device-scale-factor=1",
                 "--font-render-hinting=none"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    except Exception as e:
        raise ResourceError(f"headless Chromium did not start: {type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}") from None
    try:
        yield driver
    finally:
        driver.quit()


def viewport(driver, height: int) -> None:
    """The page's viewport WIDTH x ``height`` CSS pixels, one device pixel each (the window's own size
    would count Chromium's frame)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False})


def shoot(driver, url: str, ready: str, failed: str, bottom: str = "body") -> bytes:
    """The page at ``url`` once its script says ``window[ready]`` (an error: ``window[failed]``), down to
    the end of ``bottom``; the explorer at its second pair (a longer one) in words, with its gold links."""
    from selenium.webdriver.support.ui import WebDriverWait

    viewport(driver, HEIGHT)
    driver.get(url)
    WebDriverWait(driver, 60).until(lambda d: d.execute_script(
        f"return window.{ready} !== undefined || !!window.{failed}"))
    error = driver.execute_script(f"return window.{failed} || null")
    if error:
        raise AttnmtError(f"{url}: the page failed: {error}")
    if ready == "explorerReady":
        choose(driver, "explorer-sentence", "1")
        choose(driver, "explorer-units", "words")
    return screenshot(driver, bottom)


def choose(driver, select: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, select)).select_by_value(value)


def screenshot(driver, bottom: str) -> bytes:
    """The top of the page down to the end of the element ``bottom`` (a CSS selector), at most TALLEST."""
    end = driver.execute_script(f"const e = document.querySelector({bottom!r}); "
                                "return Math.ceil(e.getBoundingClientRect().bottom + window.scrollY)")
    viewport(driver, max(300, min(TALLEST, int(end) + 8)))
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.5)  # the new size's layout and paint
    return driver.get_screenshot_as_png()


def shoot_serve(driver, url: str) -> bytes:
    """The serve page: SERVED typed, translated (one request, not as typed), the first one's map drawn in
    words."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    viewport(driver, HEIGHT)
    driver.get(url + "/")
    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return window.serveReady !== undefined"))
    driver.find_element(By.ID, "serve-live").click()  # off: one translation, on the button
    driver.find_element(By.ID, "serve-input").send_keys("\n".join(SERVED))
    driver.find_element(By.ID, "serve-go").click()
    WebDriverWait(driver, 120).until(lambda d: d.execute_script("return window.serveTranslations > 0"))
    with contextlib.suppress(Exception):  # a model of a few steps may translate to nothing: no map then
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return window.explorerDraws > 0"))
        choose(driver, "explorer-units", "words")
    return screenshot(driver, "body")


def start_study(config: Path, work: Path, smoke: bool) -> Child:
    """A tiny ``attnmt study``, started in a folder of ``work`` named by its settings: the same settings
    find their finished study (its figures redrawn as they were), other settings start their own."""
    size = SMOKE_STUDY if smoke else STUDY
    sets = smoke_sets() if smoke else list(STUDY_SETS)
    words = [str(config), "--variants", size["variants"], "--minutes", size["minutes"], "--max-len",
             size["max_len"], "--workers", "1", *set_words(sets)]
    folder = work / f"study-{hashlib.sha256(' '.join(words).encode()).hexdigest()[:8]}"
    (work / "study").unlink(missing_ok=True)
    (work / "study").symlink_to(folder.name)  # the latest, by a stable name
    return Child(work / "study.log", "study", *words, "--out", folder)


def study_figures(child: Child, work: Path) -> dict[str, bytes]:
    """The study's BLEU-over-minutes and growth figures, once it is done."""
    child.wait()
    return {name: (work / "study" / "figures" / file).read_bytes() for name, file in STUDY_FIGURES.items()}


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    print(f"{what} ...", end="", flush=True)  # and its seconds when it ends
    started = time.perf_counter()
    yield
    print(f" {time.perf_counter() - started:.1f} s", flush=True)


def draw(args: argparse.Namespace, want: set[str], run: Path, work: Path, sizes: dict[str, int]) -> None:
    """Every picture in ``want``, written into --out as it comes (a later failure keeps it), its size into
    ``sizes``. The demo model: ``attnmt train CONFIG --run-dir RUN`` (a finished run has nothing to do). The
    study needs no demo model: with --smoke it runs beside the rest (the suite's time), else after it (its
    minutes and timings on a machine otherwise idle)."""

    def keep(drawn: dict[str, bytes]) -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, data in drawn.items():
            sizes[name] = write_png(data, args.out / f"{name}.png", palette=name in SCREENSHOTS)

    config, studied = args.config.absolute(), want & set(STUDY_FIGURES)
    study = start_study(config, work, True) if args.smoke and studied else None
    try:
        if not want.isdisjoint(MODEL_FIGURES):
            with step(f"the demo model in {args.run}"):
                attnmt(work / "train.log", "train", config, "--run-dir", run,
                       *set_words(smoke_sets() if args.smoke else []))
            if want & {"cross-attention", "head-grid"}:
                with step("heatmaps"):
                    keep(heatmaps(run, want))
            if "curves" in want:
                with step("curves"):
                    keep({"curves": curves(run, config.stem)})
            if want & SCREENSHOTS:
                with step("pages"):
                    keep(pages(run, work, want, args.smoke))
        if studied:
            with step("a tiny attnmt study"):
                study = study or start_study(config, work, args.smoke)
                keep({k: v for k, v in study_figures(study, work).items() if k in want})
    finally:
        if study is not None:
            study.stop()


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    run, work = args.run.absolute(), workspace(args.run)
    work.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    draw(args, set(args.only or FIGURES), run, work, sizes)
    print(f"| picture | KB | written to {args.out} in {time.perf_counter() - started:.0f} s |")
    for name in FIGURES:
        if name in sizes:
            print(f"| {name}.png | {sizes[name] / 1024:.1f} |")


if __name__ == "__main__":
    main()
