"""The replay's claims: whom running work was reclaimed for (`ClusterSnapshot.claims`).

The portal reads them from its preemption rows (`snapshots.open_claims`); the replay keeps them
from its plans here: (claimant, evicted job) -> the planned kill, forgotten once the claimant is
no longer pending (it started, or left) or ``hold_s`` past the kill.
"""

from __future__ import annotations

from collections.abc import Container


class ClaimBook:
    """(claimant, evicted job) -> the planned kill of the evicted job."""

    __slots__ = ("_kills",)

    def __init__(self) -> None:
        self._kills: dict[tuple[str, str], float] = {}

    def signalled(self, claimant: str, evicted: str, kill_at: float) -> None:
        """Running job ``evicted`` was signalled for pending job ``claimant``, to stop at ``kill_at``."""
        self._kills[claimant, evicted] = kill_at

    def live(self, t: float, pending: Container[str], hold_s: float) -> tuple[tuple[str, str, float], ...]:
        """The claims of pending claimants within their hold at ``t``; the others are forgotten."""
        kills = self._kills
        if not kills:
            return ()
        for key in [key for key, kill_at in kills.items() if key[0] not in pending or t > kill_at + hold_s]:
            del kills[key]
        return tuple((claimant, evicted, kill_at) for (claimant, evicted), kill_at in kills.items())
