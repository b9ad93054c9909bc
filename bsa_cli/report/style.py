"""What the HTML pages share: escaping, the base stylesheet (colours, header, tables), the SVG font."""

from __future__ import annotations

import html
from collections.abc import Sequence

#: The rules every bsa page starts from (the compare report, the trend page); each adds its own.
BASE_CSS = """
:root{--fail:#b3001b;--error:#8a1a8a;--pass:#16702a;--line:#d6d6d6}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1d;background:#fff}
main,header.top{padding:0 1.5em}
header.top{padding-top:1em;padding-bottom:.6em;border-bottom:1px solid var(--line);background:#fafafa}
h1{font-size:1.35em;margin:.2em 0 .5em}
table{border-collapse:collapse;margin:.4em 0 1em;font-size:.88em}
td,th{border:1px solid var(--line);padding:.18em .5em;text-align:left;vertical-align:top}
th{background:#f1f1f1;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
"""

#: The font of every inline SVG picture.
SVG_FONT = "font-family:ui-monospace,Menlo,Consolas,monospace;font-size:10px"


def esc(value: object) -> str:
    """Escape any value's text for HTML (quotes too: it also goes into attributes)."""
    return html.escape(str(value), quote=True)


def html_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "", numeric: Sequence[int] = ()
) -> str:
    """Return an HTML table; cells are HTML already; columns in `numeric` are right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><tr>{head}</tr>{''.join(body)}</table>"
