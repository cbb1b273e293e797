"""Small display filters for the researcher pages."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def duration_s(value: float | str | None) -> str:
    """Seconds as a short human duration: "45 min", "2 h 30 min", "3 d 4 h"; "–" when unknown."""
    if value is None or value == "":
        return "–"
    minutes = round(float(value) / 60)
    if minutes < 60:
        return f"{max(minutes, 1)} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@register.filter
def gpu_hours(value: float | None) -> str:
    """GPU-hours with one decimal (two below 1), e.g. "0.25 GPU-h"."""
    if value is None:
        return "–"
    return f"{value:.2f} GPU-h" if value < 1 else f"{value:.1f} GPU-h"


@register.filter
def header_label(value: object) -> str:
    """A column name as people read it: ``constraint_mismatch`` -> ``constraint mismatch`` (the
    CSV keeps the machine name); a long one-word name could not wrap and pushed tables wider."""
    return str(value).replace("_", " ")
