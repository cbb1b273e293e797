"""Deterministic discrete-event cluster: the simulator backend (DESIGN §5).

It implements the `ClusterBackend` protocol over its own clock (`snapshot`, `apply`; `cancel` and
`job_output` raise `UnsupportedOperationError`: a trace's jobs end as the trace says and print nothing),
plus what a replay needs to drive time: `register` (the hidden true work of a job, as a real
cluster would discover it), `next_event_at` and `advance_to`.  It translates and never decides:
it starts jobs on exactly the GPUs a plan names, kills at ``kill_at`` and refuses anything that
would put two holders on one GPU.

Semantics (documented because results depend on them):
* A job runs for its remaining work, whatever its estimate said: no work is cut.
* GPU type does not change runtime (traces give runtimes on unknown hardware).
* Preemption: at ``kill_at`` the job stops unless it finished first (a completion at the same
  instant wins).  Work since the last checkpoint is lost; a non-checkpointable job loses all
  of its progress.  A checkpointable job checkpoints every ``checkpoint_interval_s`` and, when
  ``checkpoint_on_signal`` is set, also at the grace signal (the signal is a checkpoint request).
* Restore cost: a job resumed from a checkpoint (it kept progress at an earlier preemption)
  first spends ``restore_s`` (set at `register`) on its GPUs before making progress again; that
  time is reported as lost (``Transition.lost_s``), never as useful work.
* A start the plan marks preemptible (``StartAction.is_preemptible``: lent capacity, or work
  above its project's guarantee) may be preempted even if the job itself did not consent, as on
  Kueue or Run:ai; the run restarts from its last checkpoint (from scratch without one).
* Booking owners occupy their GPUs through `hold`/`unhold`; held GPUs are busy like a job's.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from scheduling.backends.base import (
    ActionResult,
    BackendError,
    JobOutput,
    ObservedCluster,
    ObservedJob,
    ObservedState,
    UnsupportedOperationError,
)
from scheduling.engine.types import Node, Plan, PreemptAction, StartAction

__all__ = ["DoubleAllocationError", "SimulatorBackend", "Transition", "TransitionKind"]


class DoubleAllocationError(BackendError, AssertionError):
    """A start or hold named a GPU that another holder occupies (raised when ``strict``)."""


class TransitionKind(StrEnum):
    COMPLETED = "completed"
    PREEMPTED = "preempted"


@dataclass(frozen=True, slots=True)
class Transition:
    """A job leaving its GPUs, reported by `SimulatorBackend.advance_to`."""

    job_id: str
    kind: TransitionKind
    at: float
    gpu_ids: tuple[int, ...]
    started_at: float
    saved_s: float  # progress kept (the whole run for a completion, up to the checkpoint otherwise)
    lost_s: float  # progress thrown away by the preemption (0 for a completion)
    work_left_s: float  # remaining work after this transition (0 for a completion)


@dataclass(slots=True)
class _Work:
    work_left_s: float
    is_preemptible: bool
    checkpoint_interval_s: float | None  # None: not checkpointable
    restore_s: float = 0.0  # spent at the start of every run that resumes saved progress
    has_saved: bool = False  # some progress was kept at a preemption: the next run restores


@dataclass(slots=True)
class _Run:
    gpu_ids: tuple[int, ...]
    started_at: float
    end_at: float
    version: int
    signal_at: float | None = None
    kill_at: float | None = None
    overhead_s: float = 0.0  # restore time at the start of this run (not progress)
    is_preemptible: bool = False  # this run may be preempted


_COMPLETE, _KILL = 0, 1  # completions first: a job that ends at its kill time is not preempted


@dataclass(slots=True)
class _Counters:
    starts: int = 0
    refused_starts: int = 0
    double_allocations_refused: int = 0
    preemptions_refused: int = 0
    kills: int = 0
    completions: int = 0
    messages: list[str] = field(default_factory=list)


class SimulatorBackend:
    """A cluster of ``nodes`` whose jobs take exactly their registered work to finish."""

    def __init__(
        self,
        nodes: tuple[Node, ...],
        *,
        start_at: float = 0.0,
        checkpoint_on_signal: bool = True,
        strict: bool = False,
    ) -> None:
        self._nodes = nodes
        self._now = start_at
        self._checkpoint_on_signal = checkpoint_on_signal
        self._strict = strict
        self._owner: dict[int, str | None] = {g: None for node in nodes for g in node.gpu_ids}
        self._free = len(self._owner)
        self._work: dict[str, _Work] = {}
        self._runs: dict[str, _Run] = {}
        self._holds: dict[str, tuple[int, ...]] = {}
        self._done: dict[str, ObservedJob] = {}
        self._events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self._version = 0
        self.counters = _Counters()

    # ---- clock and workload ----

    @property
    def now(self) -> float:
        return self._now

    @property
    def free_gpu_count(self) -> int:
        return self._free

    @property
    def capacity_gpus(self) -> int:
        return len(self._owner)

    def is_free(self, gpu_id: int) -> bool:
        return self._owner.get(gpu_id, "?") is None

    def free_gpu_ids(self) -> list[int]:
        return [g for g, owner in self._owner.items() if owner is None]

    def owner_of(self, gpu_id: int) -> str | None:
        return self._owner[gpu_id]

    def is_running(self, job_id: str) -> bool:
        return job_id in self._runs

    def register(
        self,
        job_id: str,
        *,
        work_s: float,
        is_preemptible: bool = False,
        checkpoint_interval_s: float | None = None,
        restore_s: float = 0.0,
    ) -> None:
        """Declare a job's true work (seconds of running) before it can be started.

        ``restore_s``: time each resume from a checkpoint spends before progress continues.
        """
        if work_s < 0 or restore_s < 0:
            raise ValueError(f"negative work or restore time for {job_id}: {work_s}, {restore_s}")
        self._work[job_id] = _Work(work_s, is_preemptible, checkpoint_interval_s, restore_s)

    def forget(self, job_id: str) -> None:
        """Drop a registered job that is not running (a session whose user gave up)."""
        if job_id not in self._runs:
            self._work.pop(job_id, None)

    def next_event_at(self) -> float | None:
        """Time of the next completion or kill, skipping stale entries."""
        while self._events:
            at, _, _, job_id, version = self._events[0]
            run = self._runs.get(job_id)
            if run is not None and run.version == version:
                return at
            heapq.heappop(self._events)
        return None

    def advance_to(self, at: float) -> list[Transition]:
        """Move the clock to ``at``, ending the jobs that complete or are killed by then."""
        if at < self._now:
            raise BackendError(f"the simulator clock cannot go back from {self._now} to {at}")
        transitions: list[Transition] = []
        while self._events and self._events[0][0] <= at:
            when, _, kind, job_id, version = heapq.heappop(self._events)
            run = self._runs.get(job_id)
            if run is None or run.version != version:
                continue
            self._now = when
            if kind == _COMPLETE:
                if run.end_at != when:
                    continue  # superseded (should not happen: end_at never moves)
                transitions.append(self._finish(job_id, run, when))
            else:
                if run.kill_at != when:
                    continue  # an earlier kill superseded this one
                transitions.append(self._kill(job_id, run, when))
        self._now = at
        return transitions

    # ---- booking owners ----

    def hold(self, holder_id: str, gpu_ids: tuple[int, ...]) -> bool:
        """Give ``gpu_ids`` to a booking owner; False (nothing changes) if any is busy."""
        if self._holds.get(holder_id) == gpu_ids:
            return True
        if any(self._owner.get(g, "?") is not None for g in gpu_ids):
            return False
        for g in gpu_ids:
            self._owner[g] = holder_id
        self._free -= len(gpu_ids)
        self._holds[holder_id] = gpu_ids
        return True

    def unhold(self, holder_id: str) -> None:
        """The booking owner leaves; unknown holders are ignored (already done)."""
        gpu_ids = self._holds.pop(holder_id, ())
        for g in gpu_ids:
            assert self._owner[g] == holder_id, f"GPU {g} held by {self._owner[g]}, not {holder_id}"
            self._owner[g] = None
        self._free += len(gpu_ids)

    # ---- protocol ----

    def snapshot(self) -> ObservedCluster:
        """What runs now, plus every job that has ended (completed or preempted last)."""
        jobs = [
            ObservedJob(
                job_id=job_id, state=ObservedState.RUNNING, gpu_ids=run.gpu_ids, started_at=run.started_at
            )
            for job_id, run in self._runs.items()
        ]
        jobs.extend(self._done[job_id] for job_id in self._done if job_id not in self._runs)
        return ObservedCluster(at=self._now, nodes=self._nodes, jobs=tuple(jobs))

    def apply(
        self, plan: Plan, *, payloads: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[ActionResult]:
        """Schedule the plan's preemptions and start its jobs on exactly the named GPUs.

        Reservations and releases are bookkeeping for a real scheduler; here they are
        acknowledged.  Repeating a start or a preemption that is already in effect succeeds.
        ``payloads`` is not read: the trace gives each job's runtime.
        """
        results = [self._preempt(action) for action in plan.preemptions]
        results.extend(ActionResult("release", r.holder_id, True) for r in plan.releases)
        results.extend(ActionResult("reserve", r.holder_id, True) for r in plan.reservations)
        results.extend(self._start(action) for action in plan.starts)
        return results

    def cancel(self, job_id: str) -> ActionResult:
        """Not in a trace replay: its jobs end as the trace says (the portal's simulated clusters
        use `LiveSimBackend`, which cancels)."""
        raise UnsupportedOperationError("the trace simulator does not cancel jobs")

    def job_output(self, job_id: str, *, backend_ref: str = "", tail_lines: int = 200) -> JobOutput:
        """Nothing: trace jobs print nothing."""
        raise UnsupportedOperationError("the trace simulator keeps no job output")

    # ---- internals ----

    def _push(self, at: float, kind: int, job_id: str, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, job_id, version))

    def _start(self, action: StartAction) -> ActionResult:
        job_id = action.job_id
        run = self._runs.get(job_id)
        if run is not None:
            if run.gpu_ids == tuple(action.gpu_ids):
                return ActionResult("start", job_id, True, "already running")
            return self._refuse_start(job_id, f"already running on other GPUs {run.gpu_ids}")
        work = self._work.get(job_id)
        if work is None:
            return self._refuse_start(job_id, "unknown job")
        gpu_ids = tuple(action.gpu_ids)
        if not gpu_ids or len(set(gpu_ids)) != len(gpu_ids):
            return self._refuse_start(job_id, f"bad GPU list {gpu_ids}")
        busy = [g for g in gpu_ids if self._owner.get(g, "?") is not None]
        if busy:
            self.counters.double_allocations_refused += 1
            message = f"GPUs {busy} are not free (owners {[self._owner.get(g) for g in busy]})"
            if self._strict:
                raise DoubleAllocationError(f"start {job_id}: {message}")
            return self._refuse_start(job_id, message)
        for g in gpu_ids:
            assert self._owner[g] is None  # no double allocation, ever
            self._owner[g] = job_id
        self._free -= len(gpu_ids)
        self._version += 1
        overhead = work.restore_s if work.has_saved else 0.0
        run = _Run(
            gpu_ids=gpu_ids,
            started_at=self._now,
            end_at=self._now + overhead + work.work_left_s,
            version=self._version,
            overhead_s=overhead,
            is_preemptible=work.is_preemptible or action.is_preemptible,
        )
        self._runs[job_id] = run
        self._push(run.end_at, _COMPLETE, job_id, run.version)
        if action.time_limit_s is not None:
            # a probe: stopped at its lowered time limit if it has not finished by then
            run.kill_at = run.signal_at = self._now + action.time_limit_s
            self._push(run.kill_at, _KILL, job_id, run.version)
        self.counters.starts += 1
        return ActionResult("start", job_id, True)

    def _refuse_start(self, job_id: str, message: str) -> ActionResult:
        self.counters.refused_starts += 1
        if len(self.counters.messages) < 100:
            self.counters.messages.append(f"start {job_id}: {message}")
        return ActionResult("start", job_id, False, message)

    def _preempt(self, action: PreemptAction) -> ActionResult:
        job_id = action.job_id
        run = self._runs.get(job_id)
        if run is None:
            return ActionResult("preempt", job_id, True, "not running")
        if not run.is_preemptible:
            self.counters.preemptions_refused += 1
            if len(self.counters.messages) < 100:
                self.counters.messages.append(f"preempt {job_id}: the job is not preemptible")
            return ActionResult("preempt", job_id, False, "the job is not preemptible")
        kill_at = max(action.kill_at, self._now)
        signal_at = min(max(action.signal_at, self._now), kill_at)
        if run.kill_at is not None and run.kill_at <= kill_at:
            return ActionResult("preempt", job_id, True, "already being preempted")
        run.kill_at = kill_at
        run.signal_at = signal_at if run.signal_at is None else min(run.signal_at, signal_at)
        self._push(kill_at, _KILL, job_id, run.version)
        return ActionResult("preempt", job_id, True)

    def _release(self, job_id: str, run: _Run) -> None:
        for g in run.gpu_ids:
            assert self._owner[g] == job_id
            self._owner[g] = None
        self._free += len(run.gpu_ids)
        del self._runs[job_id]

    def _finish(self, job_id: str, run: _Run, at: float) -> Transition:
        self._release(job_id, run)
        work = self._work.pop(job_id)
        work.work_left_s = 0.0
        self.counters.completions += 1
        self._done[job_id] = ObservedJob(
            job_id=job_id,
            state=ObservedState.COMPLETED,
            gpu_ids=run.gpu_ids,
            started_at=run.started_at,
            ended_at=at,
        )
        ran = at - run.started_at
        return Transition(
            job_id,
            TransitionKind.COMPLETED,
            at,
            run.gpu_ids,
            run.started_at,
            max(0.0, ran - run.overhead_s),
            min(ran, run.overhead_s),
            0.0,
        )

    def _kill(self, job_id: str, run: _Run, at: float) -> Transition:
        self._release(job_id, run)
        work = self._work[job_id]
        ran = at - run.started_at
        progress = max(0.0, ran - run.overhead_s)  # the restore is not progress
        saved = 0.0
        interval = work.checkpoint_interval_s
        if interval is not None:
            if interval > 0:
                saved = math.floor(progress / interval) * interval
            if self._checkpoint_on_signal and run.signal_at is not None:
                saved = max(saved, run.signal_at - run.started_at - run.overhead_s)
        saved = max(0.0, min(saved, progress))
        work.work_left_s = max(0.0, work.work_left_s - saved)
        if saved > 0:
            work.has_saved = True
        self.counters.kills += 1
        self._done[job_id] = ObservedJob(
            job_id=job_id,
            state=ObservedState.PREEMPTED,
            gpu_ids=run.gpu_ids,
            started_at=run.started_at,
            ended_at=at,
            message=f"lost {ran - saved:.0f} s of work",
        )
        return Transition(
            job_id,
            TransitionKind.PREEMPTED,
            at,
            run.gpu_ids,
            run.started_at,
            saved,
            ran - saved,
            work.work_left_s,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the GPU map disagrees with runs and holds (for tests)."""
        owners: dict[int, str] = {}
        for job_id, run in self._runs.items():
            for g in run.gpu_ids:
                assert g not in owners, f"GPU {g} allocated to {owners[g]} and {job_id}"
                owners[g] = job_id
        for holder, gpu_ids in self._holds.items():
            for g in gpu_ids:
                assert g not in owners, f"GPU {g} allocated to {owners[g]} and {holder}"
                owners[g] = holder
        assert owners == {g: o for g, o in self._owner.items() if o is not None}
        assert self._free == sum(1 for o in self._owner.values() if o is None)
