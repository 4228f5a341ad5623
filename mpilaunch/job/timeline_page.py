"""The timeline page: one self-contained HTML file drawing ``timeline.model``'s rows as SVG.

It only draws: every position, class and word comes from the model. No
script, no fonts, nothing fetched: the page opens from a file, offline, in
any browser, and mails as one attachment. The standard library's
``html.escape`` rather than a jinja2 template: ``mpilaunch report`` must
work where only the base install is (jinja2 comes with the k8s extra).
Hovering a bar shows its ``<title>`` (times, exit code).
"""

from __future__ import annotations

from html import escape

#: fill colours of the model's classes (timeline.LEGEND, LAUNCH_CLASSES)
COLOURS = {
    "queue": "#b8b8b8",
    "pull": "#f0a35e",
    "agent": "#f2d264",
    "held": "#d7e6f5",
    "ok": "#4c9a5b",
    "failed": "#d9534f",
    "unended": "#8c8c8c",
    "earlier": "#9fb8d6",
    "earlier-failed": "#e6a3a1",
    "l-allocate": "#7f9fc6",
    "l-mpirun": "#9c7fc6",
    "l-wireup": "#c67fb5",
    "l-run": "#6fae7c",
    "l-release": "#7fc6c0",
    "l-other": "#cccccc",
}

STYLE = """
body { font: 13px/1.4 sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 16px; margin: 0 0 6px; }
pre.summary { font: 12px/1.35 monospace; background: #f6f6f6; padding: 8px 10px; margin: 0 0 12px;
  white-space: pre-wrap; border-left: 3px solid #888; }
svg text { font: 11px sans-serif; fill: #222; }
svg text.axis { fill: #555; }
svg text.in-bar { fill: #fff; pointer-events: none; }
svg line.tick { stroke: #e4e4e4; }
svg line.timeout { stroke: #d9534f; stroke-width: 2; stroke-dasharray: 6 3; }
svg rect.band.attempt { fill: #5b6fd6; fill-opacity: 0.06; stroke: #5b6fd6; stroke-opacity: 0.5; stroke-dasharray: 4 3; }
svg rect.band.hang { fill: #d9534f; fill-opacity: 0.16; stroke: #d9534f; stroke-opacity: 0.6; }
svg text.band-label { font-weight: bold; }
svg rect.row-launch { fill: #f3f3f3; }
svg rect.row-worker { fill: #fafafa; }
svg text.worker { font-weight: bold; }
svg text.note { fill: #999; font-style: italic; }
svg rect.bar { stroke: #fff; stroke-width: 0.5; }
svg rect.bar.earlier { fill-opacity: 0.8; }
ul.legend { list-style: none; padding: 0; margin: 10px 0 0; display: flex; flex-wrap: wrap; gap: 6px 18px; }
ul.legend li { display: flex; align-items: center; gap: 6px; }
span.swatch { display: inline-block; width: 14px; height: 10px; border: 1px solid #888; }
span.swatch.band.attempt { background: rgba(91, 111, 214, 0.15); border-style: dashed; }
span.swatch.band.hang { background: rgba(217, 83, 79, 0.3); }
span.swatch.timeout { border: none; border-top: 2px dashed #d9534f; height: 0; }
"""


def colour_rules() -> str:
    return "\n".join(
        f"svg rect.bar.{cls} {{ fill: {c}; }}\nspan.swatch.{cls} {{ background: {c}; }}" for cls, c in COLOURS.items()
    )


def _attrs(**values) -> str:
    return " ".join(f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in values.items())


def svg(m: dict) -> list[str]:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" {_attrs(width=m["width"], height=m["height"])} role="img">']
    for tick in m["axis"]:
        out.append(f"<line {_attrs(class_='tick', x1=tick['x'], x2=tick['x'], y1=m['axis_y'] + 4, y2=m['height'])}/>")
        out.append(
            f"<text {_attrs(class_='axis', x=tick['x'], y=m['axis_y'], text_anchor='middle')}>{escape(tick['label'])}</text>"
        )
    for row in m["rows"]:
        if row["kind"] in ("launch", "worker"):
            out.append(
                f"<rect {_attrs(class_='row-' + row['kind'], x=0, y=row['y'], width=m['width'], height=row['h'])}/>"
            )
        indent = 6 if row["kind"] != "rank" else 20
        if row["h"] >= 12:  # a large job's rank rows are too thin to label
            out.append(f"<text {_attrs(class_=row['kind'], x=indent, y=row['text_y'])}>{escape(row['label'])}</text>")
        for bar in row["bars"]:
            cls = f"bar {bar['cls']}" + (
                " rank-bar" if row["kind"] == "rank" and not bar["cls"].startswith("earlier") else ""
            )
            cls += " attempt-rank" if bar["cls"].startswith("earlier") else ""
            extra = {"data_rank": bar["rank"]} if "rank" in bar else {}
            out.append(
                f"<rect {_attrs(class_=cls, x=bar['x'], y=bar['y'], width=bar['w'], height=bar['h'], **extra)}>"
                f"<title>{escape(bar['title'])}</title></rect>"
            )
            if "text" in bar:
                out.append(
                    f"<text {_attrs(class_='in-bar', x=bar['x'] + 3, y=row['text_y'])}>{escape(bar['text'])}</text>"
                )
        if row["note"]:
            out.append(f"<text {_attrs(class_='note', x=m['left'] + 4, y=row['text_y'])}>{escape(row['note'])}</text>")
    for band in m["bands"]:
        out.append(
            f"<rect {_attrs(class_='band ' + band['cls'], x=band['x'], y=band['y'], width=band['w'], height=band['h'])}>"
            f"<title>{escape(band['title'])}</title></rect>"
        )
        out.append(
            f"<text {_attrs(class_='band-label', x=band['x'] + 4, y=band['label_y'])}>{escape(band['label'])}</text>"
        )
    for line in m["lines"]:
        out.append(f"<line {_attrs(class_=line['cls'], x1=line['x'], x2=line['x'], y1=line['y1'], y2=line['y2'])}/>")
        out.append(f"<text {_attrs(x=line['x'] + 4, y=line['label_y'])}>{escape(line['label'])}</text>")
    out.append("</svg>")
    return out


def legend(m: dict) -> list[str]:
    out = ['<ul class="legend">']
    for item in m["legend"]:
        cls = f"band {item['cls']}" if item["cls"] in ("attempt", "hang") else item["cls"]
        out.append(f'<li><span class="swatch {escape(cls)}"></span>{escape(item["label"])}</li>')
    out.append("</ul>")
    return out


def page(m: dict) -> str:
    """The whole HTML document."""
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(m['title'])}</title>",
        f"<style>{STYLE}{colour_rules()}</style>",
        "</head><body>",
        f"<h1>{escape(m['title'])}</h1>",
        f'<pre class="summary">{escape(chr(10).join(m["summary"]))}</pre>',
    ]
    return "\n".join(head + legend(m) + svg(m) + ["</body></html>"]) + "\n"
