"""The mutable accumulator of one round's decisions, frozen into a `Plan` at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.engine.types import (
    PendingReason,
    PreemptAction,
    ReleaseAction,
    ReserveAction,
    StartAction,
)

# per unit (s, min, tenths of h, tenths of d): the rounded value -> its text
_FMT_CACHE: tuple[dict[int, str], dict[int, str], dict[int, str], dict[int, str]] = ({}, {}, {}, {})
_FMT_KEPT = 25_000  # texts kept per unit


def fmt_s(seconds: float) -> str:
    """A duration for humans: 45 s, 12 min, 3.5 h, 2.1 d (memoised: explanations call it a lot)."""
    if seconds < 90:
        unit, value = 0, round(max(seconds, 0.0))
    elif seconds < 5_400:
        unit, value = 1, round(seconds / 60)
    elif seconds < 172_800:
        unit, value = 2, round(seconds / 360)
    else:
        unit, value = 3, round(seconds / 8_640)
    cache = _FMT_CACHE[unit]
    text = cache.get(value)
    if text is None:
        text = (f"{value} s", f"{value} min", f"{value / 10:.1f} h", f"{value / 10:.1f} d")[unit]
        if len(cache) < _FMT_KEPT:
            cache[value] = text
    return text


def fmt_gpus(count: int) -> str:
    """A GPU count for a sentence: 1 GPU, 4 GPUs."""
    return "1 GPU" if count == 1 else f"{count} GPUs"


def job_label(job_id: str, name: str, *, same_owner: bool = True) -> str:
    """How a sentence names another job: its name in quotes when the reader owns it too (else its id),
    and "another user's job" when it is someone else's (a sentence never shows others' job names)."""
    if not same_owner:
        return "another user's job"
    return f"\u201c{name}\u201d" if name else job_id


def claim_label(what: str, claimant_id: str, *, same_owner: bool) -> str:
    """How a preemption notice names the work it made room for: ``what`` and its id when the
    preempted job's owner owns it too, else "another user's <what>" (a notice, like a pending
    sentence, never shows another user's job or booking)."""
    return f"{what} {claimant_id}" if same_owner else f"another user's {what}"


@dataclass(slots=True)
class Verdict:
    """Why a job waits, with the numbers a sentence needs; ETAs are filled in by explain."""

    reason: PendingReason
    sentence: str
    eta_p50_at: float | None = None
    eta_p90_at: float | None = None
    has_eta: bool = True  # False: it cannot start with what exists now, so no ETA is honest


@dataclass(slots=True)
class Outcome:
    """What one round decided so far: actions, verdicts, and the GPUs claimed or promised."""

    starts: list[StartAction] = field(default_factory=list)
    preemptions: list[PreemptAction] = field(default_factory=list)
    reservations: list[ReserveAction] = field(default_factory=list)
    releases: list[ReleaseAction] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    # free GPUs set aside this round for a demand whose other GPUs are still being reclaimed
    claimed: dict[int, str] = field(default_factory=dict)
    # running jobs that were signalled this round (never twice, never re-used as victims)
    preempted: set[str] = field(default_factory=set)
    # GPUs of running jobs already promised to a demand (in grace or signalled now)
    promised: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    next_round_at: float | None = None
    # a reclaim this round found a plan and was refused as not worth it (`stages.reclaim.
    # Reclaim.is_worth_it` weighs gain against loss, both of which move with ``now``): read by
    # the replay's still ticks (`scheduling.sim.replay_still_berth`), never by the plan
    worth_refused: bool = False

    def wake_at(self, at: float, now: float) -> None:
        """Ask for another round at ``at`` (only future instants count)."""
        if at > now and (self.next_round_at is None or at < self.next_round_at):
            self.next_round_at = at

    def wait(self, job_id: str, reason: PendingReason, sentence: str, eta: float | None = None) -> None:
        """Record a waiting verdict unless the job already has one (the first reason wins)."""
        if job_id not in self.verdicts:
            self.verdicts[job_id] = Verdict(reason, sentence, eta, None)
