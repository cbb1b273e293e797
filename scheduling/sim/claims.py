"""The replay's claims: for whom running work was reclaimed (`ClusterSnapshot.claims`).

The portal reads them from its preemption rows (`snapshots.open_claims`); the replay keeps them
from its plans here: a job's latest planned kill of work signalled for it, forgotten once the
job is no longer pending (it started, or left) or ``hold_s`` past that kill.
"""

from __future__ import annotations

import math
from collections.abc import Container


class ClaimBook:
    """Job id -> the latest planned kill of work reclaimed for it."""

    __slots__ = ("_kills",)

    def __init__(self) -> None:
        self._kills: dict[str, float] = {}

    def signalled(self, job_id: str, kill_at: float) -> None:
        """Work was signalled for ``job_id`` (a pending job), to stop at ``kill_at``."""
        self._kills[job_id] = max(self._kills.get(job_id, -math.inf), kill_at)

    def live(self, t: float, pending: Container[str], hold_s: float) -> tuple[tuple[str, float], ...]:
        """The claims of pending jobs within their hold at ``t``; the others are forgotten."""
        kills = self._kills
        if not kills:
            return ()
        for job_id in [j for j, kill_at in kills.items() if j not in pending or t > kill_at + hold_s]:
            del kills[job_id]
        return tuple(kills.items())
