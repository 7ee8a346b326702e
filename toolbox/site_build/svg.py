"""Small inline SVG charts (no JavaScript): a line chart over categories and a grouped bar chart.

Axes and labels use `currentColor`, so the charts follow the site's light or dark palette.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 150, 34, 46
COLORS = ("#1f77b4", "#e4572e", "#2a9d8f", "#9c6ade", "#f4a261")


@dataclass(frozen=True)
class Series:
    name: str
    values: tuple[float | None, ...]  # one per category; None = not measured
    dashed: bool = False


def _nice_ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        return [10.0 ** e for e in range(first, last + 1)]
    if high <= low:
        high = low + 1
    raw = (high - low) / 5
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if step * m >= raw)
    start = math.floor(low / step) * step
    return [start + i * step for i in range(math.ceil((high - start) / step) + 1)]


def _label(value: float) -> str:
    if value >= 1e6 or (0 < value < 1e-2):
        return f"{value:.0e}"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}"


def _frame(title: str, y_label: str, x_label: str) -> list[str]:
    return [
        f'<svg class="toolbox-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(title)}">',
        f"<title>{html.escape(title)}</title>",
        f'<text x="{LEFT}" y="18" font-size="14" font-weight="bold" fill="currentColor">{html.escape(title)}</text>',
        f'<text x="14" y="{TOP + (HEIGHT - TOP - BOTTOM) / 2}" font-size="11" fill="currentColor" transform="rotate(-90 14 {TOP + (HEIGHT - TOP - BOTTOM) / 2})" text-anchor="middle">{html.escape(y_label)}</text>',
        f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2}" y="{HEIGHT - 8}" font-size="11" fill="currentColor" text-anchor="middle">{html.escape(x_label)}</text>',
    ]


def _y_axis(ticks: list[float], scale) -> list[str]:
    out = []
    for tick in ticks:
        y = scale(tick)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="currentColor" stroke-opacity="0.15"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" fill="currentColor" text-anchor="end">{_label(tick)}</text>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="currentColor"/>')
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}" stroke="currentColor"/>')
    return out


def _legend(series: list[Series]) -> list[str]:
    out = []
    for index, item in enumerate(series):
        y = TOP + 8 + 18 * index
        color = COLORS[index % len(COLORS)]
        dash = ' stroke-dasharray="5 3"' if item.dashed else ""
        out.append(f'<line x1="{WIDTH - RIGHT + 12}" x2="{WIDTH - RIGHT + 32}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="3"{dash}/>')
        out.append(f'<text x="{WIDTH - RIGHT + 38}" y="{y + 4}" font-size="11" fill="currentColor">{html.escape(item.name)}</text>')
    return out


def _values(series: list[Series]) -> list[float]:
    return [v for s in series for v in s.values if v is not None and math.isfinite(v) and v > 0]


def line_chart(title: str, categories: list[str], series: list[Series], y_label: str, x_label: str, log_y: bool = True) -> str:
    """Lines over categorical x positions; a series value of None leaves a gap (a lone point is drawn as a dot)."""
    values = _values(series)
    if not values:
        return ""
    low, high = min(values), max(values)
    log_y = log_y and high / low > 20
    ticks = _nice_ticks(low if log_y else 0.0, high, log_y)
    bottom, top = ticks[0], ticks[-1]

    def scale(value: float) -> float:
        fraction = (math.log10(value) - math.log10(bottom)) / (math.log10(top) - math.log10(bottom) or 1) if log_y else (value - bottom) / ((top - bottom) or 1)
        return HEIGHT - BOTTOM - fraction * (HEIGHT - TOP - BOTTOM)

    step = (WIDTH - LEFT - RIGHT) / max(1, len(categories))
    x_of = [LEFT + step * (i + 0.5) for i in range(len(categories))]
    out = _frame(title, y_label, x_label) + _y_axis(ticks, scale)
    for i, category in enumerate(categories):
        out.append(f'<text x="{x_of[i]:.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" fill="currentColor" text-anchor="middle">{html.escape(category)}</text>')
    for index, item in enumerate(series):
        color = COLORS[index % len(COLORS)]
        points = [(x_of[i], scale(v)) for i, v in enumerate(item.values) if v is not None and math.isfinite(v) and v > 0]
        dash = ' stroke-dasharray="5 3"' if item.dashed else ""
        if len(points) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2.5"{dash}/>')
        for (x, y), value in zip(points, [v for v in item.values if v is not None and math.isfinite(v) and v > 0]):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"><title>{html.escape(item.name)}: {_label(value)}</title></circle>')
    out += _legend(series)
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(title: str, categories: list[str], series: list[Series], y_label: str, x_label: str = "") -> str:
    """Grouped bars on a linear axis from zero."""
    values = _values(series)
    if not values:
        return ""
    ticks = _nice_ticks(0.0, max(values), False)
    top = ticks[-1]

    def scale(value: float) -> float:
        return HEIGHT - BOTTOM - (value / (top or 1)) * (HEIGHT - TOP - BOTTOM)

    group = (WIDTH - LEFT - RIGHT) / max(1, len(categories))
    bar = group * 0.8 / max(1, len(series))
    out = _frame(title, y_label, x_label) + _y_axis(ticks, scale)
    for i, category in enumerate(categories):
        out.append(f'<text x="{LEFT + group * (i + 0.5):.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" fill="currentColor" text-anchor="middle">{html.escape(category)}</text>')
        for index, item in enumerate(series):
            value = item.values[i] if i < len(item.values) else None
            if value is None or not math.isfinite(value):
                continue
            x = LEFT + group * i + group * 0.1 + bar * index
            y = scale(max(value, 0.0))
            opacity = ' fill-opacity="0.45"' if item.dashed else ""
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar * 0.92:.1f}" height="{HEIGHT - BOTTOM - y:.1f}" fill="{COLORS[index % len(COLORS)]}"'
                       f'{opacity}><title>{html.escape(item.name)}, {html.escape(category)}: {_label(value)}</title></rect>')
    out += _legend(series)
    out.append("</svg>")
    return "\n".join(out)
