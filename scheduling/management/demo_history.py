"""The demo lab's past, replayed through the engine the portal runs.

The trace says when jobs arrived and how long they ran; *where and when they started* on the
demo cluster is decided by the same `plan_round` and the same simulator backend the live
demo uses (`scheduling.sim.replay`), under the cluster's own policy.  What the replay did is
then stored as the portal's own record of the past: finished jobs, their GPU allocations
(ended), preemptions, and one `EngineRound` per replayed round with its idle GPUs by reason,
so the utilization, fairness, idle-reason and capacity pages have weeks of history on the
first page view.

The recorder wraps the ``plan_fn`` the replay calls (its public hook) and reads each round's
snapshot: a job's run starts at its ``started_at`` and ends at the first round that no longer
sees it running (a completion or a preemption kill always triggers a round at its instant).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from scheduling.engine import plan_round
from scheduling.engine import types as et
from scheduling.engine.explain import idle_by_node
from scheduling.sim.inventory import Inventory
from scheduling.sim.overlays import OverlayConfig, ProjectQuota, build_overlay
from scheduling.sim.replay import Replay, ReplayOptions
from scheduling.sim.runtime import default_predictor
from scheduling.sim.trace import Trace, TraceJob

WEEK_S = 7 * 86_400.0
MONDAY = datetime(1970, 1, 5, tzinfo=UTC)  # a Monday 00:00 UTC


@dataclass(frozen=True, slots=True)
class HistoryJob:
    """One trace job as the demo lab assigns it (times in seconds after ``origin``)."""

    key: str
    user: str
    project: str
    submit_s: float
    runtime_s: float
    gpu_count: int
    gpu_type: str
    requested_s: float | None
    status: str


@dataclass(slots=True)
class Run:
    """One stretch a job ran on fixed GPUs: [start_s, end_s)."""

    start_s: float
    gpu_ids: tuple[int, ...]
    is_preemptible: bool
    end_s: float | None = None


@dataclass(frozen=True, slots=True)
class ReplayedRound:
    at_s: float
    plan_ms: float
    starts: int
    preemptions: int
    pending: int
    running: int
    idle: dict[str, int]
    idle_nodes: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PreemptionNote:
    signal_s: float
    kill_s: float
    reason: str


@dataclass(slots=True)
class ReplayedHistory:
    """What the replay did: runs per job key, rounds, preemption signals, sessions."""

    runs: dict[str, list[Run]] = field(default_factory=dict)
    rounds: list[ReplayedRound] = field(default_factory=list)
    preemptions: dict[str, list[PreemptionNote]] = field(default_factory=dict)
    sessions: dict[str, tuple[str, str, float, float, int]] = field(default_factory=dict)
    # (p50_s, p90_s) the portal's runtime predictor gave each batch job when it first waited,
    # learnt only from the jobs that had finished by then (what the portal would have stored)
    predictions: dict[str, tuple[float, float]] = field(default_factory=dict)
    # batch jobs whose replayed users checkpoint, every `checkpoint_interval_s` (the overlay's)
    checkpointable: frozenset[str] = frozenset()
    checkpoint_interval_s: float = 0.0
    wall_s: float = 0.0


def lost_work_s(*, run_s: float, gpu_count: int, checkpoint_interval_s: float | None) -> float:
    """GPU-seconds a kill throws away after ``run_s`` of running: everything since the last
    checkpoint (all of it without checkpoints); the rule the live rounds apply."""
    lost_s = max(0.0, run_s)
    if checkpoint_interval_s:
        lost_s %= checkpoint_interval_s
    return lost_s * gpu_count


def preemption_notice(*, reason: str, run_s: float, names: dict[str, str]) -> str:
    """The replayed preemption's reason as the portal says it: the replay's job keys
    (``t22284.3``, ``int-001284``) become the portal's job names, and a reason that does not
    say how long the job ran says it, in the portal's one clock ("It ran 2.1 h.").  The lost
    work is stored beside it (`Preemption.lost_gpu_s`) and the pages print it."""
    text = _KEY.sub(lambda m: names.get(m.group(0), m.group(0)), reason.strip()) or "Preempted."
    if " ran " not in f" {text} ":
        ran = f"{run_s / 60:.0f} min" if run_s < 3600 else f"{run_s / 3600:.1f} h"
        text = f"{text.rstrip('.')}. It ran {ran}."
    return text


# A job key of the replay inside an engine sentence: a trace job (t123, t123.2) or a session.
_KEY = re.compile(r"\b(?:t\d+(?:\.\d+)?|int-\d+)\b")


class _Recorder:
    """The replay's ``plan_fn``: plans with `plan_round` and records what each round saw.

    A run is opened from the plan's own start (the replay applies it at this round's instant)
    and closed at the first later round whose snapshot no longer shows it running: every
    completion and preemption kill triggers a round at its instant.  Opening runs from the
    *next* snapshot instead would miss every job that starts and ends with no round in between
    (most short jobs): they would look as if they never ran.  A start the simulator refused
    leaves the job pending on the same attempt at the next round, and its run is dropped.
    """

    def __init__(self, history: ReplayedHistory) -> None:
        self.history = history
        self.open: dict[str, Run] = {}
        self.unconfirmed: dict[str, int] = {}  # job id -> attempt, started by the last plan

    def __call__(self, snapshot: et.ClusterSnapshot, *, policy: et.PolicyConfig, now: float) -> et.Plan:
        running = {r.job.id: r for r in snapshot.running}
        pending = {p.id: p for p in snapshot.pending}
        predictions = self.history.predictions
        for job_id, request in pending.items():
            if job_id not in predictions and request.predicted_p50_s is not None:
                p90 = (
                    request.predicted_p90_s
                    if request.predicted_p90_s is not None
                    else request.predicted_p50_s
                )
                predictions[job_id] = (request.predicted_p50_s, p90)
        for job_id, run in list(self.open.items()):
            seen = running.get(job_id)
            if seen is not None and seen.started_at == run.start_s:
                continue
            del self.open[job_id]
            waiting = pending.get(job_id)
            attempt = self.unconfirmed.get(job_id)
            if seen is None and waiting is not None and attempt is not None and waiting.attempt == attempt:
                self.history.runs[job_id].remove(run)  # the start was refused: it never ran
                if not self.history.runs[job_id]:
                    del self.history.runs[job_id]
                continue
            run.end_s = now
        self.unconfirmed.clear()
        for job_id, seen in running.items():
            if job_id not in self.open:
                run = Run(seen.started_at, seen.gpu_ids, seen.is_preemptible)
                self.open[job_id] = run
                self.history.runs.setdefault(job_id, []).append(run)
        t0 = time.perf_counter()
        plan = plan_round(snapshot, policy, now)
        plan_ms = (time.perf_counter() - t0) * 1000.0
        attempts = {p.id: p.attempt for p in snapshot.pending}
        for start in plan.starts:
            if start.job_id in attempts and start.job_id not in self.open:
                run = Run(now, tuple(start.gpu_ids), start.is_preemptible)
                self.open[start.job_id] = run
                self.unconfirmed[start.job_id] = attempts[start.job_id]
                self.history.runs.setdefault(start.job_id, []).append(run)
        for preempt in plan.preemptions:
            self.history.preemptions.setdefault(preempt.job_id, []).append(
                PreemptionNote(preempt.signal_at, preempt.kill_at, preempt.reason)
            )
        started = {g for s in plan.starts for g in s.gpu_ids}
        idle = Counter(reason.value for gpu, reason in plan.idle if gpu not in started)
        # Per node only on the last round of each hour (what the drill-down shows): the
        # replay has thousands of rounds and the others would only fill the table.
        hour = int(now // 3600)
        if self.history.rounds and int(self.history.rounds[-1].at_s // 3600) == hour:
            last = self.history.rounds[-1]
            self.history.rounds[-1] = ReplayedRound(
                last.at_s, last.plan_ms, last.starts, last.preemptions, last.pending, last.running, last.idle
            )
        self.history.rounds.append(
            ReplayedRound(
                at_s=now,
                plan_ms=plan_ms,
                starts=len(plan.starts),
                preemptions=len(plan.preemptions),
                pending=len(snapshot.pending) - len(plan.starts),
                running=len(snapshot.running) + len(plan.starts),
                idle=dict(idle),
                idle_nodes=idle_by_node(snapshot.nodes, plan.idle, skip=started),
            )
        )
        return plan


def week_phase_s(origin: datetime) -> float:
    """Seconds after Monday 00:00 UTC of ``origin`` (the overlay's diurnal/weekly rhythm)."""
    return (origin - MONDAY).total_seconds() % WEEK_S


def history_replay(
    jobs: Sequence[HistoryJob],
    *,
    nodes: tuple[et.Node, ...],
    gpu_types: tuple[et.GpuType, ...],
    policy: et.PolicyConfig,
    origin: datetime,
    interactive_share: float = 0.05,
    seed: int = 0,
    stop_at_s: float = math.inf,
    projects: tuple[ProjectQuota, ...] | None = None,
) -> ReplayedHistory:
    """Replay ``jobs`` (plus seeded on-demand sessions worth ``interactive_share`` of their
    GPU-hours, half the batch jobs preemptible, half of those checkpointing) on ``nodes``
    under ``policy``, with the runtime predictor the portal ships; deterministic for a seed.

    GPU ids of ``nodes`` are kept as they are, so a recorded run names the database's GPUs.
    ``stop_at_s`` (seconds after ``origin``) ends the replay there: runs still going then have
    no ``end_s``, and jobs not started yet have no run.  ``projects`` (weights and guarantees)
    replace the overlay's own, so the replay plans under the portal's quotas.
    """
    trace = Trace(
        name="demo-history",
        jobs=tuple(
            TraceJob(
                id=job.key,
                user=job.user,
                project=job.project,
                submit_at=job.submit_s,
                runtime_s=job.runtime_s,
                gpu_count=job.gpu_count,
                gpu_type=job.gpu_type,
                requested_s=job.requested_s,
                status=job.status,
            )
            for job in sorted(jobs, key=lambda j: (j.submit_s, j.key))
        ),
        skipped_no_runtime=0,
        skipped_no_gpus=0,
        week_phase_s=week_phase_s(origin),
    )
    overlay = build_overlay(trace, OverlayConfig(interactive_share=interactive_share, seed=seed))
    if projects is not None:
        overlay = dataclasses.replace(overlay, projects=projects)
    history = ReplayedHistory()
    history.checkpointable = frozenset(overlay.checkpointable)
    history.checkpoint_interval_s = overlay.checkpoint_interval_s
    history.sessions = {
        s.id: (s.user, s.project, s.submit_at, s.duration_s, s.gpu_count) for s in overlay.sessions
    }
    recorder = _Recorder(history)
    started = time.perf_counter()
    Replay(
        trace,
        Inventory(name="demo", nodes=nodes, gpu_types=gpu_types),
        overlay,
        policy=policy.name,
        plan_fn=recorder,
        predictor=default_predictor(),
        options=ReplayOptions(stop_at_s=stop_at_s),
        config=policy,
        seed=seed,
    ).run()
    history.wall_s = time.perf_counter() - started
    return history


def at(origin: datetime, seconds: float) -> datetime:
    return origin + timedelta(seconds=seconds)
