"""The documentation site: ``mkdocs build --strict`` succeeds; the built site asks nothing of the network
(no external script, style sheet, font or image in its files, and no request leaves the machine when
headless Chromium opens its pages from disk, searching included); the generated reference holds every
command and option of the app, every config key, every exit code and every path of the server's API.

The site is built once for the module (``site``), in a process of its own, into a temporary folder; MkDocs
writes the whole site even when strict mode then refuses it, so the other tests run on it either way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "docs" / "hooks"))  # the reference's generators (attnmt_docs)

PAGES = ("index.html", "tutorials/own-corpus.html", "reference/commands.html")  # opened in Chromium
LOCAL = ("file:", "data:", "blob:", "about:")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, float]:
    out = tmp_path_factory.mktemp("site") / "site"
    started = time.perf_counter()
    mkdocs = str(Path(sys.executable).with_name("mkdocs"))
    built = subprocess.run([mkdocs, "build", "--strict", "-d", str(out)], cwd=REPO, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return out, built, time.perf_counter() - started


def test_the_strict_build_succeeds(site):
    out, built, seconds = site
    print(f"mkdocs build --strict: {seconds:.1f} s")
    warnings = [line for line in built.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert built.returncode == 0, f"mkdocs build --strict failed ({seconds:.1f} s):\n" + "\n".join(
        warnings or built.stderr.splitlines()[-30:])
    assert (out / "index.html").is_file()


# ------------------------------------------------------------------------------------------ offline

# What makes a browser fetch something: a tag's src/href/srcset/data/poster, CSS's @import and url().
_ATTRIBUTE = re.compile(r"<(script|link|img|source|iframe|video|audio|embed|object|track|input|image|use)\b"
                        r"[^>]*?\s(?:src|href|srcset|data|poster|xlink:href)\s*=\s*[\"']?\s*((?:https?:)?//[^\s\"'>]+)",
                        re.IGNORECASE)
_CSS = re.compile(r"(?:@import\s+(?:url\()?|url\()\s*[\"']?\s*((?:https?:)?//[^\s\"')]+)", re.IGNORECASE)
_JS = re.compile(r"(?:importScripts|import)\s*\(\s*[\"']((?:https?:)?//[^\"']+)|"
                 r"[\"']((?:https?:)?//[^\"'\s]+\.(?:css|js|mjs|woff2?|ttf|otf|eot|png|jpe?g|gif|webp))[\"']")


def external_resources(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".html", ".css", ".js"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        hits = [m.group(2) for m in _ATTRIBUTE.finditer(text)] if path.suffix == ".html" else []
        hits += [m.group(1) for m in _CSS.finditer(text)] if path.suffix in (".css", ".html") else []
        hits += [m.group(1) or m.group(2) for m in _JS.finditer(text)] if path.suffix == ".js" else []
        found += [f"{path.relative_to(root)}: {url}" for url in hits]
    return found


# Material's script loads these only when a page needs them; this site gives it no reason to (checked).
CONDITIONAL = {"https://unpkg.com/mermaid@11/dist/mermaid.min.js": 'class="mermaid"'}


def test_the_site_names_no_external_resource(site):
    out, _, _ = site
    assert (out / "index.html").is_file(), "the site was not built"
    found = [hit for hit in external_resources(out) if hit.split(": ", 1)[1] not in CONDITIONAL]
    assert found == []
    pages = [p for p in out.rglob("*.html") if any(why in p.read_text(encoding="utf-8")
                                                   for why in CONDITIONAL.values())]
    assert pages == [], "a page makes Material load a script from the network"


def test_the_offline_scan_finds_an_external_resource(tmp_path):
    (tmp_path / "a.html").write_text('<link rel="stylesheet" href="https://cdn.example/x.css">'
                                     '<script src="//cdn.example/y.js"></script><a href="https://ok.example">x</a>')
    (tmp_path / "b.css").write_text('@import url("https://fonts.example/f.css");\n'
                                    'p { background: url(//x/y.png) }')
    assert len(external_resources(tmp_path)) == 4


def test_pages_open_from_disk_with_no_request_leaving(site, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    out, _, _ = site
    for page in PAGES:
        url = (out / page).as_uri()
        browser.get_log("performance")  # start from an empty log
        browser.get(url)
        WebDriverWait(browser, 10).until(
            lambda d: d.execute_script("return document.readyState") == "complete")
        time.sleep(0.3)  # the search worker and late scripts
        events = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
        urls = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
        assert url in urls, f"{page}: the page itself was not requested: {urls[:5]}"
        assert [u for u in urls if not u.startswith(LOCAL)] == [], page
        shown = browser.execute_script(
            "return [document.querySelectorAll('.md-nav__link').length, "
            "(document.querySelector('.md-content h1') || {}).textContent || '']")
        assert shown[0] > 10 and shown[1].strip(), f"{page}: not rendered (nav links, title): {shown}"
    search_from_disk(browser)
    events = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    urls = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    assert [u for u in urls if not u.startswith(LOCAL)] == [], "searching"


def search_from_disk(browser) -> None:
    """Search works on a page opened from disk (its worker runs in docs/javascripts/iframe-worker.js)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys("tokenizer")
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item"))


# ------------------------------------------------------------------------------------------ the reference


class _Tables(HTMLParser):
    """The first column's ``<code>`` of every table row, table by table."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[str]] = []
        self.column, self.in_code, self.text = 0, False, ""

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.column = 0
        elif tag == "td":
            self.column += 1
        elif tag == "code" and self.column == 1:
            self.in_code, self.text = True, ""

    def handle_endtag(self, tag):
        if tag == "code" and self.in_code:
            self.in_code = False
            self.tables[-1].append(self.text)

    def handle_data(self, data):
        if self.in_code:
            self.text += data


def first_column_codes(html: str) -> list[list[str]]:
    parser = _Tables()
    parser.feed(html)
    return parser.tables


def sections(html: str) -> dict[str, str]:
    """Each heading's id and the HTML up to the next heading of level 2 or 3."""
    parts = re.split(r"(?=<h[23]\b)", html)
    return {m.group(1): part for part in parts if (m := re.match(r"<h[23][^>]*\bid=\"([^\"]+)\"", part))}


def codes(html: str) -> set[str]:
    import html as entities

    found = re.findall(r"<code\b[^>]*>(.*?)</code>", html, re.S)
    return {entities.unescape(re.sub(r"<[^>]+>", "", c)) for c in found}


def reference(site, name: str) -> str:
    out, _, _ = site
    page = out / "reference" / f"{name}.html"
    assert page.is_file(), f"{page} was not built"
    return page.read_text(encoding="utf-8")


def test_every_command_and_option_is_in_the_reference(site):
    import typer

    from attnmt.cli import app

    group = typer.main.get_command(app)
    top = group.context_class(group, info_name="attnmt")
    found, missing = sections(reference(site, "commands")), []
    for name in group.list_commands(top):
        command = group.get_command(top, name)
        section = found.get(f"attnmt-{name}")
        if section is None:
            missing.append(f"the command {name}")
            continue
        ctx = command.context_class(command, info_name=name, parent=top)
        for param in command.get_params(ctx):
            names = [param.metavar or param.name.upper()] if param.param_type_name == "argument" else \
                [*param.opts, *param.secondary_opts]
            missing += [f"{name} {spelled}" for spelled in names
                        if not param.hidden and spelled not in codes(section)]
    assert "--debug" in codes(found.get("attnmt", "")) and "--version" in codes(found.get("attnmt", ""))
    assert not missing, "not in reference/commands.html: " + ", ".join(missing)


def schema_models() -> list[type]:
    """Every pydantic model the config schema reaches (sections, union members), read off the annotations."""
    from typing import get_args

    from pydantic import BaseModel

    from attnmt.config.schema import Config

    def models(tp) -> list[type]:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return [tp]
        return [m for arg in get_args(tp) for m in models(arg)]

    seen: list[type] = []

    def visit(cls: type) -> None:
        for info in cls.model_fields.values():
            for model in models(info.annotation):
                if model not in seen:
                    seen.append(model)
                    visit(model)

    visit(Config)
    return seen


def test_every_config_key_is_in_the_reference(site):
    tables = first_column_codes(reference(site, "config"))
    names = [{key.rsplit(".", 1)[-1] for key in table} for table in tables]
    models = schema_models()
    assert len(models) >= 12  # 5 sections, 2 model kinds, 5 source formats, sampling, alignment
    missing = [cls.__name__ for cls in models if set(cls.model_fields) not in names]
    assert not missing, f"no table with exactly these classes' keys: {missing}"
    assert sum(map(len, tables)) == sum(len(cls.model_fields) for cls in models)
    every = {key for table in tables for key in table}
    assert {"train.lr", "model.d_model", "tokenizer.sampling.alpha", "train.alignment.weight"} <= every


def test_every_exit_code_and_error_is_in_the_reference(site):
    from attnmt.errors import AttnmtError

    classes, todo = [], [AttnmtError]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo += cls.__subclasses__()
    html = reference(site, "errors")
    found = sections(html)
    rows = re.findall(r"<tr>\s*<td>(\d+)</td>", found.get("exit-codes", ""))
    assert {str(cls.exit_code) for cls in classes} <= set(rows), rows
    assert [cls.__name__ for cls in classes if cls.__name__.lower() not in found] == []


def test_every_api_path_is_in_the_reference(site):
    from attnmt_docs.server_api import openapi

    document = openapi()
    found = {re.sub(r"\s+", " ", c): html for html in sections(reference(site, "server-api")).values()
             for c in codes(html[:300])}
    missing = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            section = found.get(f"{method.upper()} {path}")
            if section is None:
                missing.append(f"{method.upper()} {path}")
                continue
            for content in op.get("requestBody", {}).get("content", {}).values():
                ref = content["schema"]["$ref"].rsplit("/", 1)[-1]
                fields = document["components"]["schemas"][ref]["properties"]
                missing += [f"{method.upper()} {path} {f}" for f in fields if f not in codes(section)]
    assert len(document["paths"]) >= 4 and not missing, missing
