"""Explain: freeze a round into a `Plan`; reasons, sentences and ETAs (`engine.explain`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling.engine.explain import build_plan
from scheduling.engine.types import JobRequest, Plan

if TYPE_CHECKING:
    from scheduling.engine.round import Round


@dataclass(frozen=True, slots=True)
class Explain:
    """``is_strict_order`` (fifo): nobody's ETA is before that of the job ahead of it."""

    is_strict_order: bool = False

    def __call__(self, rnd: Round, queue: list[JobRequest]) -> Plan:
        """The round's plan; its explanations are computed when first read."""
        return build_plan(rnd, queue, is_strict_order=self.is_strict_order)
