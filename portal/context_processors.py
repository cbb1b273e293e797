"""Template context every page needs."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def demo_clock(request: HttpRequest) -> dict[str, Any]:
    """``sim_speedup`` when simulated clusters run faster than the wall clock (BERTH_SIM_SPEEDUP),
    so every page can say that its ETAs and runtimes are on the faster demo clock."""
    speedup = float(getattr(settings, "BERTH_SIM_SPEEDUP", 1.0) or 1.0)
    return {"sim_speedup": speedup if abs(speedup - 1.0) > 1e-9 else None}
