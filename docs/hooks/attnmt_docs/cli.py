"""The commands reference: attnmt's Typer app (``attnmt.cli:app``) as mkdocs-click renders it.

Typer (0.29) carries its own copy of Click (``typer._click``), whose parameters are not ``click.Option``s,
so mkdocs-click, which asks ``isinstance(param, click.Option)``, would list no option at all. ``mirror``
copies each command of ``typer.main.get_command(app)`` into a real Click command for it: the same names,
types (Click's ``Choice`` and ranges, so mkdocs-click states them), defaults as ``attnmt CMD --help``
states them, required marks, hidden flags and help; the help's Rich markup (``[b]...[/b]``) becomes
Markdown. Nothing is listed by hand: ``markdown()`` writes one mkdocs-click directive per command of the
app, in the order ``attnmt --help`` lists them, then the command's arguments (which mkdocs-click's table
leaves out).

A module attribute ``command_NAME`` (``command_toy_data``) is the mirrored command ``NAME``; ``root`` is
``attnmt`` itself with its global options and no subcommand (mkdocs-click would sort the subcommands by name).
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

import click

HIDDEN_SHOWN = False  # hidden options stay out of the reference, as they stay out of --help


def typer_command():
    """The app's Click group, as Typer builds it (its own Click)."""
    import typer

    from attnmt.cli import app

    return typer.main.get_command(app)


def _context(command, name: str, parent=None):
    return command.context_class(command, info_name=name, parent=parent)


def rich_to_markdown(text: str) -> str:
    """Typer's Rich markup as Markdown: ``[b]x[/b]`` bold, ``[i]x[/i]`` italic, other styles dropped; a
    bracket that is no style (``attnmt[ct2]``) stays as written. Characters Markdown would read as HTML or
    emphasis are escaped, and a list that follows a line of text gets the blank line Markdown needs."""
    from rich.errors import StyleSyntaxError
    from rich.style import Style

    def tag(match: re.Match) -> str:
        name = match.group(1).strip().lstrip("/").strip()
        if not name:
            return match.group(0) if not match.group(1).startswith("/") else ""
        try:
            Style.parse(name)
        except StyleSyntaxError:
            return match.group(0)
        if name in ("b", "bold"):
            return "**"
        return "*" if name in ("i", "italic") else ""

    escaped = "\x00"  # Rich's \[ is a bracket as written: kept from the style pass, then put back bare
    text = text.replace("\\[", escaped)
    text = text.replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"\[([^\[\]]*)\]", tag, text).replace(escaped, "[")
    out: list[str] = []
    for line in text.splitlines():
        item, text_line = line.startswith("- "), line.strip() and not line.startswith((" ", "- "))
        before = out[-1] if out else ""
        in_list = before.startswith(("- ", " ")) and before.strip()
        if (item and before.strip() and not in_list) or (text_line and in_list):
            out.append("")  # a list needs a blank line before it, and the text after it one too
        out.append(line)
    return "\n".join(out)


def cell(text: str) -> str:
    """Help text in one table cell: one line, pipes escaped."""
    return " ".join(rich_to_markdown(text).split()).replace("|", "&#124;")


def type_label(param, ctx) -> str:
    return param.display_type(ctx).strip("<>")


def _click_type(param, ctx) -> click.ParamType:
    """A Click type mkdocs-click can state: Click's Choice and ranges, else a type named as --help does."""
    desc = param.type_descriptor
    if desc.is_choice and desc.choices is not None:
        return click.Choice([c.value if isinstance(c, Enum) else str(c) for c in desc.choices])
    if desc.is_ranged and (param.min is not None or param.max is not None):
        ranged = click.IntRange if desc.ranged_type_name == "int" else click.FloatRange
        return ranged(min=param.min, max=param.max)
    named = click.ParamType()
    named.name = "flag" if getattr(param, "is_flag", False) else type_label(param, ctx)
    return named


def default_label(param, ctx) -> str | None:
    """The default as ``--help`` states it (``(the model's)`` for a stated default), None where none is."""
    if isinstance(param.show_default, str):
        return f"({param.show_default})"
    value = param._extract_default_help_str(ctx=ctx)
    if getattr(param, "is_flag", False) and not param.secondary_opts:
        return str(bool(value))
    if value is None or value in ((), []) or not param.show_default:
        return None
    shown = param._get_default_string(ctx=ctx, show_default_is_str=False, default_value=value)
    return shown or None


def _mirror_option(param, ctx) -> click.Option:
    option = click.Option(["--x"], type=_click_type(param, ctx), required=param.required,
                          help=cell(param.help or ""), hidden=param.hidden, multiple=param.multiple)
    option.name, option.opts, option.secondary_opts = param.name, list(param.opts), list(param.secondary_opts)
    option.default = default_label(param, ctx)
    return option


def _mirror_argument(param) -> click.Argument:
    return click.Argument([param.name], required=param.required, nargs=param.nargs, metavar=param.metavar)


def mirror(command, name: str, parent_ctx=None) -> click.Command:
    """A real Click command with ``command``'s help, options and arguments (no callback: it documents)."""
    ctx = _context(command, name, parent_ctx)
    params: list[click.Parameter] = []
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            params.append(_mirror_argument(param))
        elif not param.hidden or HIDDEN_SHOWN:
            params.append(_mirror_option(param, ctx))
    return click.Command(name, help=rich_to_markdown(command.help or ""), params=params,
                         add_help_option=False)


def commands() -> dict[str, Any]:
    """The app's visible commands, in the order ``attnmt --help`` lists them."""
    group = typer_command()
    ctx = _context(group, "attnmt")
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)
            if not group.get_command(ctx, name).hidden}


def arguments_table(command, name: str) -> list[str]:
    """The command's arguments as a Markdown table (mkdocs-click's table lists options only)."""
    group = typer_command()
    ctx = _context(command, name, _context(group, "attnmt"))
    rows = []
    for param in command.get_params(ctx):
        if param.param_type_name != "argument" or param.hidden:
            continue
        many = " (one or more)" if param.nargs == -1 and param.required else \
            " (any number)" if param.nargs == -1 else ""
        required = "required" if param.required else (default_label(param, ctx) or "optional")
        rows.append(f"| `{param.metavar or param.name.upper()}` | {type_label(param, ctx)}{many} | "
                    f"{cell(param.help or '')} | {required} |")
    if not rows:
        return []
    return ["**Arguments:**", "", "| Name | Type | Description | Default |",
            "| ---- | ---- | ----------- | ------- |", *rows, ""]


def attribute(name: str) -> str:
    return "command_" + name.replace("-", "_")


def __getattr__(attr: str) -> click.Command:
    if attr == "root":
        group = typer_command()
        root = mirror(group, "attnmt")
        root.collect_usage_pieces = lambda ctx: ["[OPTIONS]", "COMMAND", "[ARGS]..."]
        return root
    for name, command in commands().items():
        if attr == attribute(name):
            return mirror(command, f"attnmt {name}")
    raise AttributeError(attr)


def directive(attr: str, prog_name: str) -> list[str]:
    return ["::: mkdocs-click", "    :module: attnmt_docs.cli", f"    :command: {attr}",
            f"    :prog_name: {prog_name}", "    :depth: 1", "    :style: table", ""]


def markdown() -> str:
    """The commands page's generated part: the global options, then every command in the app's order."""
    found = commands()
    lines = ["| Command | What it does |", "| --- | --- |"]
    lines += [f"| [`{name}`](#attnmt-{name}) | {cell((command.help or '').split(chr(10) + chr(10))[0])} |"
              for name, command in found.items()]
    lines += ["", *directive("root", "attnmt")]
    for name, command in found.items():
        lines += directive(attribute(name), f"attnmt {name}")
        lines += arguments_table(command, name)
    return "\n".join(lines) + "\n"
