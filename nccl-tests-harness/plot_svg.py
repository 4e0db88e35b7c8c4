#!/usr/bin/env python3
"""Bus bandwidth against message size, as an SVG, from the harness's --csv files.

    plot_svg.py -o plot.svg [--title T] [--ref LABEL=GBps ...] a.csv [b.csv ...]

One line per (file, test, placement); x is log2 of the size in bytes, y is busbw in GB/s.
--ref draws a dashed horizontal line (e.g. ib_write_bw of the same fabric). Only the
standard library is used.
"""
import argparse
import csv
import math
import os
import sys
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def load(paths):
    series = {}
    owner = {}
    for p in paths:
        with open(p, newline="") as f:
            for row in csv.DictReader(f):
                key = f"{row['test']} n={row['nranks']} C={row['channels']}"
                mode = row.get("mode", "ring")
                if mode != "ring":
                    key += {"pingpong": " ping-pong", "oneway": " one way"}.get(mode, " " + mode)
                if row.get("placement") == "in-place":
                    key += " in-place"
                if owner.setdefault(key, p) != p:  # the same test from another file: keep both lines
                    key += f" ({os.path.basename(p)})"
                    owner.setdefault(key, p)
                series.setdefault(key, []).append((int(row["size"]), float(row["busbw_GBps"])))
    for pts in series.values():
        pts.sort()
    return series


def nice_max(v):
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def render(series, refs, title):
    W, H = 920, 500
    L, R, T, B = 70, 290, 40, 60
    pw, ph = W - L - R, H - T - B
    sizes = [s for pts in series.values() for s, _ in pts if s > 0]
    if not sizes:
        sizes = [1, 2]
    xmin, xmax = math.log2(min(sizes)), math.log2(max(sizes))
    if xmax == xmin:
        xmax = xmin + 1
    ymax = nice_max(max([b for pts in series.values() for _, b in pts] + [v for _, v in refs] + [1e-9]) * 1.05)

    def X(s):
        return L + (math.log2(max(s, 1)) - xmin) / (xmax - xmin) * pw

    def Y(b):
        return T + ph - b / ymax * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L + pw / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>']
    for i in range(6):
        v = ymax * i / 5
        y = Y(v)
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    step = max(1, int(math.ceil((xmax - xmin) / 12)))
    e = int(math.ceil(xmin))
    while e <= xmax:
        x = X(2 ** e)
        out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{T + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{T + ph + 16}" text-anchor="middle">{human(2 ** e)}</text>')
        e += step
    out.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 18}" text-anchor="middle">message size (bytes)</text>')
    out.append(f'<text transform="translate(18,{T + ph / 2}) rotate(-90)" text-anchor="middle">bus bandwidth (GB/s)</text>')
    ly = T + 10
    for i, (name, pts) in enumerate(sorted(series.items())):
        c = COLORS[i % len(COLORS)]
        path = " ".join(f"{X(s):.1f},{Y(b):.1f}" for s, b in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for s, b in pts:
            out.append(f'<circle cx="{X(s):.1f}" cy="{Y(b):.1f}" r="2.5" fill="{c}"/>')
        out.append(f'<line x1="{L + pw + 12}" y1="{ly}" x2="{L + pw + 32}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{L + pw + 36}" y="{ly + 4}">{escape(name)}</text>')
        ly += 18
    for j, (name, v) in enumerate(refs):
        c = "#555"
        y = Y(v)
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="{c}" stroke-dasharray="6,4"/>')
        out.append(f'<line x1="{L + pw + 12}" y1="{ly}" x2="{L + pw + 32}" y2="{ly}" stroke="{c}" stroke-dasharray="6,4"/>')
        out.append(f'<text x="{L + pw + 36}" y="{ly + 4}">{escape(name)} {v:.3g}</text>')
        ly += 18
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--title", default="ferroce: bus bandwidth vs message size")
    ap.add_argument("--ref", action="append", default=[], help="LABEL=GBps dashed reference line")
    ap.add_argument("csv", nargs="+")
    a = ap.parse_args()
    refs = []
    for r in a.ref:
        name, _, v = r.rpartition("=")
        try:
            refs.append((name, float(v)))
        except ValueError:
            sys.exit(f"plot_svg.py: bad --ref {r!r}")
    series = load(a.csv)
    if not series:
        sys.exit("plot_svg.py: no rows in " + " ".join(a.csv))
    with open(a.output, "w") as f:
        f.write(render(series, refs, a.title))
    print(f"plot written to {a.output}")


if __name__ == "__main__":
    main()
