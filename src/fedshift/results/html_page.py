"""The HTML report as one self-contained file: figures embedded as base64 PNG, so the page
can be mailed, attached to an issue or archived without the folder it was written in."""

from __future__ import annotations

import base64
import html
from pathlib import Path

STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}
td,th{padding:3px 9px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}
figure{margin:1.5em 0} img{max-width:100%} figcaption{color:#555;font-size:.85em}
details{margin:1em 0} summary{cursor:pointer;font-weight:600}
.note{background:#fff6e0;padding:.5em 1em;border-left:4px solid #e0a000}
"""


def table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def figure(title: str, png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    t = html.escape(title)
    return (
        f"<figure><img src='data:image/png;base64,{data}' alt='{t}'>"
        f"<figcaption>{t} ({html.escape(png.name)})</figcaption></figure>"
    )


def page(title: str, sections: list[tuple[str | None, str]]) -> str:
    """``sections``: (heading or None, HTML body) in order."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for heading, body in sections:
        if heading:
            parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(body)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )


def note(text: str) -> str:
    return f"<p class='note'>{html.escape(text)}</p>"


def collapsed(summary: str, body: str) -> str:
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"
