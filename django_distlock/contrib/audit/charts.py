"""Small server-side SVG charts (no JavaScript, no internet): bars over time, bars per row."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, PAD = 560, 140, 24


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value >= 100 or value == int(value) else f"{value:.3g}"


def time_bars(title: str, values: Sequence[float], labels: Sequence[str], color: str) -> SafeString:
    """A bar per time bucket; the tallest bar is the chart's height, its value on the axis."""
    top = max(values, default=0) or 1
    step = (WIDTH - PAD) / max(len(values), 1)
    bars = []
    for index, (value, label) in enumerate(zip(values, labels, strict=True)):
        height = (HEIGHT - 2 * PAD) * value / top
        bars.append(
            format_html(
                '<rect class="bar" x="{}" y="{}" width="{}" height="{}" fill="{}" '
                'data-value="{}"><title>{}: {}</title></rect>',
                f"{PAD + index * step:.1f}",
                f"{HEIGHT - PAD - height:.1f}",
                f"{max(step - 1, 1):.1f}",
                f"{height:.1f}",
                color,
                _fmt(value),
                label,
                _fmt(value),
            )
        )
    first, last = (labels[0], labels[-1]) if labels else ("", "")
    return format_html(
        '<svg class="distlock-chart" role="img" aria-label="{}" viewBox="0 0 {} {}" '
        'width="{}" height="{}"><text x="{}" y="14" font-size="12" fill="currentColor">{} '
        "(max {})</text>{}"
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999"/>'
        '<text x="{}" y="{}" font-size="10" fill="currentColor">{}</text>'
        '<text x="{}" y="{}" font-size="10" fill="currentColor" text-anchor="end">{}</text></svg>',
        title, WIDTH, HEIGHT, WIDTH, HEIGHT, PAD, title, _fmt(max(values, default=0)),
        mark_safe("".join(bars)),
        PAD, HEIGHT - PAD, WIDTH, HEIGHT - PAD,
        PAD, HEIGHT - 8, first, WIDTH, HEIGHT - 8, last,
    )  # fmt: skip


def row_bars(title: str, rows: Sequence[tuple[str, float]], unit: str, color: str) -> SafeString:
    """A horizontal bar per labelled row (e.g. wait p95 per alias and name prefix)."""
    top = max((value for _, value in rows), default=0) or 1
    line, label_width = 18, 200
    height = PAD + line * max(len(rows), 1)
    parts = []
    for index, (label, value) in enumerate(rows):
        y = PAD + index * line
        parts.append(
            format_html(
                '<text x="0" y="{}" font-size="11" fill="currentColor">{}</text>'
                '<rect class="bar" x="{}" y="{}" width="{}" height="{}" fill="{}" '
                'data-value="{}"></rect>'
                '<text x="{}" y="{}" font-size="11" fill="currentColor">{} {}</text>',
                y + 12, label[:32],
                label_width, y + 2, f"{(WIDTH - label_width - 90) * value / top:.1f}", line - 5,
                color, _fmt(value),
                label_width + (WIDTH - label_width - 90) * value / top + 4, y + 12,
                _fmt(value), unit,
            )
        )  # fmt: skip
    return format_html(
        '<svg class="distlock-chart" role="img" aria-label="{}" viewBox="0 0 {} {}" width="{}" '
        'height="{}"><text x="0" y="14" font-size="12" fill="currentColor">{}</text>{}</svg>',
        title, WIDTH, height, WIDTH, height, title, mark_safe("".join(parts)),
    )  # fmt: skip
