"""Persist the plan's explanations of pending jobs (DESIGN §1, step 5): reason, sentence, ETAs.

Only rows whose values change are written, in one statement (`queries.pending_explanations_write`);
what "change" means (an ETA within its slack and the sentence that tells it are kept) is
`_explanation_changed`, applied to every pending job by `_explanations_changed`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from notifications.events import jobs_cannot_start_emit
from scheduling import queries
from scheduling.engine.outcome import fmt_s
from scheduling.engine.startability import Unstartable
from scheduling.engine.types import PendingExplanation, Plan
from scheduling.models import Cluster, Job
from scheduling.rounds.common import _ETA_SLACK, RoundResult
from scheduling.snapshots import epoch


def _write_explanations(
    cluster: Cluster,
    plan: Plan,
    *,
    now: datetime,
    result: RoundResult,
    unstartable: dict[str, Unstartable],
) -> None:
    """Reason, sentence and ETAs on every pending job the plan explains (not a state change: no audit).

    A job in ``unstartable`` (it can never start under today's inventory and quotas) keeps
    that reason and what would unblock it, and no ETA: no amount of waiting starts it.

    Only rows whose values change are written (an ETA that moved less than `_eta_close`
    allows is kept, and with it the sentence's ETA text: `_with_eta_text`), in one statement
    over arrays (``UNNEST``):
    from one round to the next most of a long queue keeps its explanation, and a ``CASE`` per
    row (Django's ``bulk_update``) costs PostgreSQL time quadratic in the rows of one statement.
    """
    explanations = {int(p.job_id): p for p in plan.pending if p.job_id.isdigit()}
    # Plain columns, ETAs as epoch seconds, every pending job of the cluster (the plan explains
    # all of them): 2,000 ids in an ``IN (...)`` list, or in an array parameter (psycopg dumps
    # lists in Python), and 4,000 timestamps parsed in Python were most of this function.
    current = queries.pending_explanations_read(cluster_id=cluster.pk)
    changed, cannot_start, seen = _explanations_changed(current, explanations, unstartable, now_s=epoch(now))
    result.pending = seen
    if cannot_start:  # told once per attempt: waiting alone never starts them
        jobs = Job.objects.filter(pk__in=cannot_start).select_related("project", "cluster", "user")
        jobs_cannot_start_emit(list(jobs), at=now)
    if changed:
        queries.pending_explanations_write(changed)


_Row = tuple[int, str, str, float | None, float | None]
_VALID_REASONS = frozenset(Job.PendingReason.values)
_ETA_HEAD = " Expected start in "  # how `_eta_text` begins


def _explanations_changed(
    current: Sequence[tuple[int, str, str, float | None, float | None]],
    explanations: Mapping[int, PendingExplanation],
    unstartable: Mapping[str, Unstartable],
    *,
    now_s: float,
) -> tuple[list[_Row], list[int], int]:
    """The rows of ``current`` (the stored explanations of the cluster's pending jobs) whose
    new explanation must be written (`_explanation_changed`), the jobs that can never start, and
    how many of the stored jobs the plan explains.

    `_explanation_changed` row by row, inlined: this runs over every pending job every round
    (9,623 rows in a steady round of the full bench: 35-46 ms of CPU as a call per row).  Text
    is only formatted for a row whose reason and ETAs are kept but whose sentence differs, and
    then only if the stored sentence starts with the new one's part before the ETA text.
    """
    resources = str(Job.PendingReason.RESOURCES)
    slack_floor_s = _ETA_SLACK.total_seconds()
    changed: list[_Row] = []
    cannot_start: list[int] = []
    seen = 0
    for pk, old_reason, old_sentence, old_p50, old_p90 in current:
        p = explanations.get(pk)
        if p is None:  # submitted after the snapshot: the next round explains it
            continue
        seen += 1
        never = unstartable.get(p.job_id) if unstartable else None
        row: _Row
        if never is not None:
            cannot_start.append(pk)
            row = (pk, never.reason.value, never.message[:500], None, None)
        else:
            reason = p.reason.value
            row = (
                pk,
                reason if reason in _VALID_REASONS else resources,
                p.sentence[:500],
                p.eta_p50_at,
                p.eta_p90_at,
            )
        _, reason, sentence, p50, p90 = row
        if reason != old_reason:
            changed.append(row)
            continue
        # `_eta_close_s` of both ETAs.
        if p50 is None or old_p50 is None:
            if p50 is not old_p50:
                changed.append(row)
                continue
        elif not abs(p50 - old_p50) <= max(slack_floor_s, 0.1 * (old_p50 - now_s)):  # NaN: changed
            changed.append(row)
            continue
        if p90 is None or old_p90 is None:
            if p90 is not old_p90:
                changed.append(row)
                continue
        elif not abs(p90 - old_p90) <= max(slack_floor_s, 0.1 * (old_p90 - now_s)):
            changed.append(row)
            continue
        if sentence == old_sentence:
            continue
        # What `_with_eta_text` decides, formatting only when the parts before the ETA agree.
        cut = sentence.rfind(_ETA_HEAD)
        if (
            cut < 0
            or p50 is None
            or p90 is None
            or old_p50 is None
            or old_p90 is None
            or not old_sentence.startswith(sentence[:cut])
            or old_sentence[cut:] != _eta_text(old_p50, old_p90, now_s=now_s)
            or sentence[cut:] != _eta_text(p50, p90, now_s=now_s)
        ):
            changed.append(row)
    return changed, cannot_start, seen


def _explanation_changed(
    row: tuple[int, str, str, float | None, float | None],
    stored: tuple[str, str, float | None, float | None],
    *,
    now_s: float,
) -> bool:
    """Whether a pending job's new (reason, sentence, p50, p90) must be written over the stored one."""
    _, reason, sentence, p50, p90 = row
    old_reason, old_sentence, old_p50, old_p90 = stored
    if reason != old_reason or not (
        _eta_close_s(p50, old_p50, now_s=now_s) and _eta_close_s(p90, old_p90, now_s=now_s)
    ):
        return True
    return sentence != old_sentence and old_sentence != _with_eta_text(
        sentence, new=(p50, p90), old=(old_p50, old_p90), now_s=now_s
    )


def _eta_text(p50: float, p90: float, *, now_s: float) -> str:
    """The engine's ETA sentence tail (`engine.explain.explain_pending`) for these ETAs at ``now_s``."""
    return f" Expected start in {fmt_s(p50 - now_s)} (p90 {fmt_s(p90 - now_s)})."


def _with_eta_text(
    sentence: str,
    *,
    new: tuple[float | None, float | None],
    old: tuple[float | None, float | None],
    now_s: float,
) -> str:
    """``sentence`` (the engine's, ending in the text of the ``new`` ETAs) told with the ``old``
    ETAs instead: what the stored sentence must be for the stored row to stay as it is.

    The engine's sentences end in "Expected start in 5.4 d (p90 10.6 d).", relative to the
    round's instant: ETAs that move by minutes flip that rounding on most of a long queue every
    round (1,900 of 2,000 rows rewritten per round in the demo lab).  A row whose ETAs are kept
    (within `_eta_close`) keeps its sentence when only that tail differs *and* the stored
    sentence is what the engine says now for the stored ETAs, so the text shown always agrees
    with the stored ETAs at this instant.  A sentence without the tail is returned unchanged.
    """
    if None in new or None in old:
        return sentence
    tail = _eta_text(new[0], new[1], now_s=now_s)  # type: ignore[arg-type]
    if not sentence.endswith(tail):
        return sentence
    return sentence[: -len(tail)] + _eta_text(old[0], old[1], now_s=now_s)  # type: ignore[arg-type]


def _eta_close_s(new: float | None, old: float | None, *, now_s: float) -> bool:
    """`_eta_close` on epoch seconds."""
    if new is None or old is None:
        return new is old
    slack_s = max(_ETA_SLACK.total_seconds(), 0.1 * max(0.0, old - now_s))
    return abs(new - old) <= slack_s


def _eta_close(new: datetime | None, old: datetime | None, *, now: datetime) -> bool:
    """Whether a stored ETA may stay: within ``max(_ETA_SLACK, 10 %)`` of the time left until it.

    ETAs move by seconds from one round to the next; a queue of 10,000 jobs rewritten every
    round for that costs PostgreSQL seconds and nobody can see the difference ("in about 3 h").
    """
    return _eta_close_s(
        epoch(new) if new is not None else None, epoch(old) if old is not None else None, now_s=epoch(now)
    )
