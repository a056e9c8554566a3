"""Small helpers for the self-contained HTML reports of ``racktwin optimize`` and ``racktwin evaluate``.

Plots are drawn with matplotlib's Agg backend (no display needed) and embedded as base64 PNG, so a
report is one file that opens anywhere::

    plt = pyplot()
    fig, ax = plt.subplots()
    ...
    figures = [("Rack power", png_base64(fig))]
    plt.close(fig)
    path.write_text(page("racktwin evaluate: day", intro_html + table_html(head, rows) + figures_html(figures)))
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from html import escape
from typing import Any

__all__ = ["STYLE", "figures_html", "page", "png_base64", "pyplot", "table_html"]

STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:1em auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}"
)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (imported on first use: matplotlib is slow to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_base64(fig: Any, dpi: int = 90) -> str:
    """A figure as base64 PNG text (for ``<img src='data:image/png;base64,...'>``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def figures_html(figures: Sequence[tuple[str, str]]) -> str:
    """``(title, base64 PNG)`` pairs as headed, embedded images."""
    return "".join(f"<h2>{escape(t)}</h2><img alt='{escape(t)}' src='data:image/png;base64,{b}'/>" for t, b in figures)


def table_html(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, first_left: bool = True) -> str:
    """An HTML table; cells are escaped (``str()`` of the value)."""
    head = "".join(f"<th>{escape(str(h))}</th>" for h in headers)
    style = " style='text-align:left'" if first_left else ""
    body = "".join(
        "<tr>" + "".join(f"<td{style if i == 0 else ''}>{escape(str(c))}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>\n{body}</table>"


def page(title: str, body_html: str) -> str:
    """A whole HTML document with the shared style; ``body_html`` is inserted as is."""
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>\n'
        f"<style>{STYLE}</style></head><body>\n<h1>{escape(title)}</h1>\n{body_html}</body></html>\n"
    )
