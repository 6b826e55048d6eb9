"""The server API reference: ``attnmt serve``'s OpenAPI document (FastAPI's ``app.openapi()``), rendered.

The application is the one ``attnmt.serve.server.create_app`` builds for ``attnmt serve``, with no model
behind it: the routes only read the model, the lanes and the page when a request comes, and the schema
needs none of them, so nothing is loaded or decoded. Every path, method, request body field (type,
default, constraints, description) and response of the document is on the page; the status codes and the
error body are the server module's own words (its docstring), because FastAPI's document states its
default validation error, which the server replaces with ``{"error": "one line"}``.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from .config import text

FASTAPI_ERRORS = {"HTTPValidationError", "ValidationError"}  # FastAPI's defaults, which the server replaces
ERROR_BODY = '`{"error": "one line"}`'


def openapi() -> dict:
    from attnmt.serve.api import Served
    from attnmt.serve.server import create_app

    served = Served(translator=None, path=Path("MODEL"), info={}, log=lambda line: None)
    return create_app(served, lanes=None, page="").openapi()


def status_codes() -> str:
    """The server module's paragraph on status codes and the error body."""
    from attnmt.serve import server

    paragraphs = inspect.cleandoc(server.__doc__ or "").split("\n\n")
    return next((p for p in paragraphs if p.startswith("Status codes")), "")


def schema_type(schema: dict, document: dict) -> str:
    """A JSON schema in words: ``integer (>= 1) or null``, ``array of string``, a link for a reference."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return ERROR_BODY if name in FASTAPI_ERRORS else f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            inner = " or ".join(dict.fromkeys(schema_type(s, document) for s in schema[key]))
            bounds = _bounds(schema)
            return f"{inner} ({bounds})" if bounds else inner
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        kind = "array of " + schema_type(schema.get("items", {}), document)
    elif kind == "object" and "properties" not in schema:
        kind = "object"
    bounds = _bounds(schema)
    return f"{kind} ({bounds})" if bounds else kind


def _bounds(schema: dict) -> str:
    signs = {"minimum": ">=", "ge": ">=", "exclusiveMinimum": ">", "gt": ">", "maximum": "<=", "le": "<=",
             "exclusiveMaximum": "<", "lt": "<", "minItems": "items >=", "maxItems": "items <=",
             "minLength": "length >=", "maxLength": "length <="}
    return ", ".join(f"{sign} {_number(schema[key])}" for key, sign in signs.items() if key in schema)


def _number(value: Any) -> str:
    exact = isinstance(value, float) and value.is_integer() and abs(value) < 2**53  # a float holds it exactly
    return str(int(value)) if exact else str(value)


def fields_table(schema: dict, document: dict) -> list[str]:
    required = set(schema.get("required", ()))
    rows = ["| Field | Type | Required | Default | Description |", "| --- | --- | --- | --- | --- |"]
    for name, field in schema.get("properties", {}).items():
        default = f"`{json.dumps(field['default'])}`" if "default" in field else ""
        rows.append(f"| `{name}` | {schema_type(field, document)} | {'yes' if name in required else 'no'} | "
                    f"{default} | {text(field.get('description', ''))} |")
    extra = "no other field is accepted" if schema.get("additionalProperties") is False else ""
    return rows + (["", f"{extra[0].upper()}{extra[1:]}."] if extra else [])


def resolve(schema: dict, document: dict) -> tuple[str | None, dict]:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return name, document["components"]["schemas"][name]
    return None, schema


def operation(path: str, method: str, op: dict, document: dict) -> list[str]:
    lines = [f"## `{method.upper()} {path}`", ""]
    lines += [text(op[key]) + "\n" for key in ("summary", "description") if op.get(key)]
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            name, schema = resolve(content.get("schema", {}), document)
            title = f" `{name}`" if name else ""
            needed = ", required" if body.get("required") else ""
            lines += [f"**Request body**{title} (`{media}`{needed}):", ""]
            if schema.get("description"):
                lines += [text(schema["description"]), ""]
            lines += [*fields_table(schema, document), ""]
    else:
        lines += ["No request body.", ""]
    lines += ["**Responses:**", "", "| Status | Meaning | Body |", "| --- | --- | --- |"]
    for status, answer in op.get("responses", {}).items():
        content = answer.get("content", {}).get("application/json", {})
        shape = schema_type(content["schema"], document) if content.get("schema") else "JSON"
        lines.append(f"| {status} | {text(answer.get('description', ''))} | {shape} |")
    lines += [f"| other | an error (see [status codes](#status-codes)) | {ERROR_BODY} |", ""]
    return lines


def markdown() -> str:
    document = openapi()
    info = document.get("info", {})
    lines = [f"OpenAPI {document.get('openapi', '')}, API `{info.get('title', '')}` version "
             f"{info.get('version', '')}.", "", "| Method | Path | What it does |", "| --- | --- | --- |"]
    for path, methods in document.get("paths", {}).items():
        for method, op in methods.items():
            anchor = f"{method}-{path}".lower().replace("/", "").replace("{", "").replace("}", "")
            lines.append(f"| {method.upper()} | [`{path}`](#{anchor}) | {text(op.get('summary', ''))} |")
    lines += ["", "## Status codes { #status-codes }", "", text(status_codes()), ""]
    for path, methods in document.get("paths", {}).items():
        for method, op in methods.items():
            anchor = f"{method}-{path}".lower().replace("/", "").replace("{", "").replace("}", "")
            section = operation(path, method, op, document)
            section[0] += f" {{ #{anchor} }}"
            lines += section
    inlined = {resolve(c.get("schema", {}), document)[0] for methods in document.get("paths", {}).values()
               for op in methods.values() for c in op.get("requestBody", {}).get("content", {}).values()}
    others = [name for name in document.get("components", {}).get("schemas", {})
              if name not in inlined and name not in FASTAPI_ERRORS]
    for name in others:
        schema = document["components"]["schemas"][name]
        lines += [f"## `{name}` {{ #{name.lower()} }}", "", text(schema.get("description", "")), "",
                  *fields_table(schema, document), ""]
    return "\n".join(lines) + "\n"
