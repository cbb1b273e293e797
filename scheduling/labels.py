"""Readable names for the engine's machine keys (idle and pending reasons) on every page.

The engine, the rounds and the CSV downloads keep the keys (``quota_blocked``); people read
the labels ("Quota-blocked").  One mapping, used by the templates (`berth_ui` filters) and by
the chart legends (`Table.chart_data`), so a page never shows a key in one place and a label
in another.  An unknown key reads as itself with the underscores turned into spaces.
"""

from __future__ import annotations

from scheduling.engine.types import IdleReason, PendingReason

IDLE_REASON_LABELS: dict[str, str] = {
    IdleReason.NO_DEMAND: "No demand",
    IdleReason.FRAGMENTATION: "Fragmented",
    IdleReason.CONSTRAINT_MISMATCH: "Constraint mismatch",
    IdleReason.RESERVED_UNUSED: "Reserved, unused",
    IdleReason.QUOTA_BLOCKED: "Quota-blocked",
    IdleReason.DRAINING: "Draining",
    IdleReason.DOWN: "Node down",
    IdleReason.SCHEDULER_LATENCY: "Scheduler latency",
    IdleReason.ALLOCATED_BUT_IDLE: "Allocated, idle",
    # Drill-down rows of rounds that stored no per-node counts.
    "not recorded": "Not recorded",
}

PENDING_REASON_LABELS: dict[str, str] = {
    PendingReason.RESOURCES: "Waiting for GPUs",
    PendingReason.PRIORITY: "Behind higher priority",
    PendingReason.RESERVATION: "Held for a reservation",
    PendingReason.FRAGMENTATION: "Fragmented",
    PendingReason.CONSTRAINT: "No fitting GPU",
    PendingReason.QUOTA: "At quota",
    PendingReason.PREEMPTING: "Preempting for it",
    PendingReason.HEADROOM: "Interactive headroom",
    PendingReason.BACKEND: "Backend retry",
}


def idle_reason_label(key: str) -> str:
    """``quota_blocked`` -> "Quota-blocked"; an unknown key with spaces for underscores."""
    return IDLE_REASON_LABELS.get(str(key), str(key).replace("_", " "))


def pending_reason_label(key: str) -> str:
    """``priority`` -> "Behind higher priority"; "" stays "" (a running job has none)."""
    return PENDING_REASON_LABELS.get(str(key), str(key).replace("_", " "))


def reason_label(key: object) -> str:
    """A column head or cell that may be an idle-reason key: its label, else the value as read."""
    text = str(key)
    return IDLE_REASON_LABELS.get(text, text.replace("_", " "))
