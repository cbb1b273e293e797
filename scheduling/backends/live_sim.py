"""Live simulated backend for the demo and the tests: a cluster that runs on the wall clock.

Unlike `scheduling.backends.simulator` (a discrete-event simulator driven by a replay), this
backend answers like a real cluster whose jobs start, run, finish and get preempted while a
person watches.  Every engine round may run in another worker process, so the backend keeps
no state in memory: each job's record lives in a Redis hash (one per cluster), and the
backend derives what happened since the last call from the clock when it is asked.

Semantics
    * Time is the injected ``clock`` (epoch seconds; `time.time` by default).  ``speedup``
      makes work run faster: a job with 600 s of work finishes 600 / speedup wall seconds
      after its start.  Reported times are wall-clock epoch seconds.
    * A job's true work comes from its payload: ``sim_runtime_s`` when given, else a draw
      seeded by the job id from ``[runtime_fraction_lo, runtime_fraction_hi]`` of its
      ``requested_s`` (else of ``default_runtime_s``).  With ``fail_rate`` a seeded share of
      jobs ends ``failed`` instead of ``completed``.  No work is cut at the estimate.
    * Preemption: the job stops at ``kill_at`` unless it finished first.  A checkpointable job
      keeps its progress up to its last checkpoint (and up to the grace signal when
      ``checkpoint_on_signal``); a restart of the same job id runs only the work left.
    * Starts go on exactly the GPUs named; a GPU that another running job holds refuses the
      start (a failed `ActionResult`), so the backend itself never double-allocates.
    * Records of ended jobs are kept ``retention_s`` (like slurmctld's MinJobAge), then dropped.

Fault injection (demos and the fault tests; all off by default): ``is_unreachable`` makes
every call raise `BackendError`; ``fail_apply`` makes `apply` raise before doing anything;
``refuse_starts`` refuses every start; ``block_in`` (``"snapshot"`` or ``"apply"``; in apply,
the first apply that starts a job) sleeps ``block_s`` seconds there, once per ``block_marker``
file (the file is created first and holds the sleeping process id, so a test can kill exactly
that process).

No Django here: the registry passes the node inventory, a Redis client and a config.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from scheduling.backends.base import (
    ActionResult,
    BackendError,
    JobOutput,
    ObservedCluster,
    ObservedJob,
    ObservedState,
    tail,
)
from scheduling.backends.settings import cluster_settings
from scheduling.engine.types import Node, Plan, PreemptAction, StartAction

__all__ = ["LiveSimBackend", "LiveSimConfig", "RedisLike"]

_RUNNING = "running"
# Per state key: the raw record values of the last load, what they parsed to and which of
# its keys hold lists (`_load`).
_DECODED: dict[str, dict[Any, tuple[dict[str, Any], tuple[str, ...]]]] = {}
_TERMINAL = {
    "completed": ObservedState.COMPLETED,
    "failed": ObservedState.FAILED,
    "preempted": ObservedState.PREEMPTED,
    "cancelled": ObservedState.CANCELLED,
}


class RedisLike(Protocol):
    """The part of a ``redis.Redis`` client this backend uses."""

    def hgetall(self, name: str) -> Any: ...

    def hset(
        self, name: str, key: str | None = None, value: str | None = None, mapping: Any = None
    ) -> Any: ...

    def hdel(self, name: str, *keys: str) -> Any: ...

    def lock(
        self,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
class LiveSimConfig:
    key_prefix: str = "berth:livesim"
    speedup: float = 1.0  # work seconds per wall second
    runtime_fraction_lo: float = 0.3
    runtime_fraction_hi: float = 0.9
    default_runtime_s: float = 600.0  # work of a job with neither sim_runtime_s nor requested_s
    fail_rate: float = 0.0
    seed: int = 0
    checkpoint_on_signal: bool = True
    retention_s: float = 86_400.0
    lock_timeout_s: float = 30.0
    # fault injection
    is_unreachable: bool = False
    fail_apply: bool = False
    refuse_starts: bool = False
    block_in: str = ""
    block_s: float = 0.0
    block_marker: str = ""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, key_prefix: str) -> LiveSimConfig:
        """Build a config from a cluster's settings (`SimulatorSettings`: unknown keys are ignored,
        bad values raise ValueError naming the key)."""
        return cls(key_prefix=key_prefix, **cluster_settings("simulator", data))


class LiveSimBackend:
    """`ClusterBackend` over a wall clock, with per-job records in Redis (see the module docstring)."""

    def __init__(
        self,
        nodes: tuple[Node, ...],
        *,
        redis: RedisLike,
        config: LiveSimConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nodes = nodes
        self._redis = redis
        self.config = config or LiveSimConfig()
        self._clock = clock
        self._gpu_ids = frozenset(g for node in nodes for g in node.gpu_ids)
        self._jobs_key = f"{self.config.key_prefix}:jobs"
        # Inside `_writes_batched`: records to write and to delete when the block ends.
        self._batch: dict[str, str] | None = None
        self._batch_deletes: set[str] = set()

    # ---- protocol ----

    def snapshot(self) -> ObservedCluster:
        """The nodes and every job that runs or ended within ``retention_s``."""
        self._check_reachable()
        self._maybe_block("snapshot")
        with self._locked(), self._writes_batched():
            now = self._clock()
            records = self._advance(now)
        jobs = tuple(self._observe(job_id, rec) for job_id, rec in sorted(records.items()))
        return ObservedCluster(at=now, nodes=self._nodes, jobs=jobs)

    def apply(
        self, plan: Plan, *, payloads: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[ActionResult]:
        """Preemptions first, then starts; reservations and releases are acknowledged.

        Idempotent: a start that already runs on the same GPUs and a preemption already under
        way succeed again.  ``payloads`` maps job ids to what they run (``sim_runtime_s``,
        ``requested_s``, ``is_preemptible``, ``is_checkpointable``, ``checkpoint_interval_s``).
        """
        self._check_reachable()
        if self.config.fail_apply:
            raise BackendError("simulated cluster refused the connection (fail_apply)")
        if plan.starts:  # an apply that only acknowledges reservations is not worth blocking
            self._maybe_block("apply")
        payloads = payloads or {}
        results: list[ActionResult] = []
        with self._locked(), self._writes_batched():
            now = self._clock()
            records = self._advance(now)
            for preempt in plan.preemptions:
                results.append(self._preempt(preempt, records, now))
            results.extend(ActionResult("release", r.holder_id, True) for r in plan.releases)
            results.extend(ActionResult("reserve", r.holder_id, True) for r in plan.reservations)
            owners = {
                g: job_id for job_id, r in records.items() if r["state"] == _RUNNING for g in r["gpu_ids"]
            }
            for start in plan.starts:
                results.append(self._start(start, records, payloads.get(start.job_id) or {}, now, owners))
        return results

    def cancel(self, job_id: str) -> ActionResult:
        """Stop a running job now; a job that is not running counts as cancelled."""
        self._check_reachable()
        with self._locked():
            now = self._clock()
            records = self._advance(now)
            rec = records.get(job_id)
            if rec is None or rec["state"] != _RUNNING:
                return ActionResult("cancel", job_id, True, "not running")
            rec.update(state="cancelled", ended_at=now, message="cancelled")
            self._save(job_id, rec)
        return ActionResult("cancel", job_id, True, "cancelled", backend_ref=str(rec.get("ref", "")))

    def job_output(self, job_id: str, *, backend_ref: str = "", tail_lines: int = 200) -> JobOutput:
        """Synthetic output: the simulator runs nothing, so it prints what it pretends happened."""
        self._check_reachable()
        with self._locked():
            now = self._clock()
            rec = self._advance(now).get(job_id)
        if rec is None:
            return JobOutput(stdout="", source="simulator (no record: never started, or expired)")
        started = float(rec["started_at"])
        lines = [
            f"[berth-sim] job {job_id} ({rec.get('ref', '')}) started on GPUs {rec['gpu_ids']}",
            f"[berth-sim] CUDA_VISIBLE_DEVICES={','.join(str(i) for i in range(len(rec['gpu_ids'])))}",
        ]
        end = float(rec.get("ended_at") or now)
        total = max(1e-9, float(rec["end_at"]) - started)
        for pct in (10, 25, 50, 75, 90, 100):
            at = started + total * pct / 100
            if at <= end:
                lines.append(f"[berth-sim] step {pct}% at +{at - started:.0f} s")
        stderr = ""
        exit_code: int | None = None
        state = rec["state"]
        if state == "completed":
            exit_code = 0
            lines.append("[berth-sim] done")
        elif state == "failed":
            exit_code = 1
            stderr = f"[berth-sim] error: {rec.get('message') or 'exited with status 1'}\n"
        elif state in ("preempted", "cancelled"):
            stderr = f"[berth-sim] {rec.get('message') or state}\n"
        text, cut = tail("\n".join(lines) + "\n", tail_lines)
        return JobOutput(
            stdout=text, stderr=stderr, exit_code=exit_code, source="simulator (synthetic)", is_truncated=cut
        )

    # ---- test and demo helpers ----

    def records(self) -> dict[str, dict[str, Any]]:
        """The raw per-job records (for tests and the demo's debugging)."""
        return self._load()

    def running_on(self) -> dict[int, str]:
        """GPU id -> id of the job running on it, as of the last call."""
        return {
            g: job_id
            for job_id, rec in self._load().items()
            if rec["state"] == _RUNNING
            for g in rec["gpu_ids"]
        }

    # ---- internals ----

    def _check_reachable(self) -> None:
        if self.config.is_unreachable:
            raise BackendError("simulated cluster is unreachable (is_unreachable)")

    def _maybe_block(self, where: str) -> None:
        config = self.config
        if config.block_in != where or config.block_s <= 0 or not config.block_marker:
            return
        try:
            fd = os.open(config.block_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return  # blocked once already
        with os.fdopen(fd, "w") as marker:
            marker.write(str(os.getpid()))
        time.sleep(config.block_s)

    def _locked(self) -> Any:
        try:
            return self._redis.lock(
                f"{self.config.key_prefix}:lock",
                timeout=self.config.lock_timeout_s,
                blocking_timeout=self.config.lock_timeout_s,
            )
        except Exception as exc:  # a connection error surfaces as BackendError
            raise BackendError(f"simulated cluster state store: {exc}") from exc

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            raw = self._redis.hgetall(self._jobs_key)
        except Exception as exc:
            raise BackendError(f"simulated cluster state store: {exc}") from exc
        # A record read again unchanged (most of them, round after round) is not parsed again:
        # the last load's parsed records are kept per state key (keyed by the exact stored
        # text, so a record another process changed is parsed anew), and a copy is handed out.
        # The copy is the record's own dict copy with its lists copied (the caller changes both;
        # the other values are immutable): a dictionary copy and a list or two instead of a
        # comprehension over every key, ~4,100 records twice a round at 1,000 nodes.
        seen = _DECODED.get(self._jobs_key, {})
        decoded: dict[Any, tuple[dict[str, Any], tuple[str, ...]]] = {}
        out: dict[str, dict[str, Any]] = {}
        for key, value in raw.items():
            job_id = key.decode() if isinstance(key, bytes) else str(key)
            parsed = seen.get(value)
            if parsed is None:
                rec = json.loads(value)
                parsed = (rec, tuple(k for k, v in rec.items() if type(v) is list))
            decoded[value] = parsed
            rec, lists = parsed
            copy = rec.copy()
            for k in lists:
                copy[k] = list(copy[k])
            out[job_id] = copy
        _DECODED[self._jobs_key] = decoded
        return out

    def _save(self, job_id: str, rec: Mapping[str, Any]) -> None:
        value = json.dumps(rec, sort_keys=True)
        if self._batch is None:
            self._redis.hset(self._jobs_key, job_id, value)
        else:
            self._batch_deletes.discard(job_id)
            self._batch[job_id] = value

    def _delete(self, job_id: str) -> None:
        if self._batch is None:
            self._redis.hdel(self._jobs_key, job_id)
        else:
            self._batch.pop(job_id, None)
            self._batch_deletes.add(job_id)

    @contextmanager
    def _writes_batched(self) -> Iterator[None]:
        """The records saved and deleted in the block are written when it ends, in one HDEL and
        one HSET (under the state lock, which the caller holds): a round that ends or starts
        hundreds of runs made a round trip per record.  Nothing is written if the block raises."""
        self._batch, self._batch_deletes = {}, set()
        try:
            yield
            batch, deletes = self._batch, self._batch_deletes
        finally:
            self._batch, self._batch_deletes = None, set()
        try:
            if deletes:
                self._redis.hdel(self._jobs_key, *sorted(deletes))
            if batch:
                self._redis.hset(self._jobs_key, mapping=batch)
        except Exception as exc:
            raise BackendError(f"simulated cluster state store: {exc}") from exc

    def _advance(self, now: float) -> dict[str, dict[str, Any]]:
        """Load the records and end the runs whose completion or kill time has passed."""
        records = self._load()
        for job_id, rec in list(records.items()):
            if rec["state"] == _RUNNING:
                kill_at = rec.get("kill_at")
                end_at = float(rec["end_at"])
                if kill_at is not None and kill_at < end_at and kill_at <= now:
                    self._kill(rec, at=float(kill_at))
                    self._save(job_id, rec)
                elif end_at <= now:
                    rec.update(state=rec["outcome"], ended_at=end_at, work_left_s=0.0)
                    rec["message"] = "exited with status 1" if rec["outcome"] == "failed" else ""
                    self._save(job_id, rec)
            elif rec.get("ended_at") is not None and float(rec["ended_at"]) < now - self.config.retention_s:
                self._delete(job_id)
                del records[job_id]
        return records

    def _kill(self, rec: dict[str, Any], *, at: float) -> None:
        speed = self.config.speedup
        progress = (at - float(rec["started_at"])) * speed
        saved = 0.0
        interval = rec.get("checkpoint_interval_s")
        if rec.get("is_checkpointable"):
            if interval:
                saved = math.floor(progress / float(interval)) * float(interval)
            if self.config.checkpoint_on_signal and rec.get("signal_at") is not None:
                saved = max(saved, (float(rec["signal_at"]) - float(rec["started_at"])) * speed)
        saved = min(max(saved, 0.0), progress)
        rec["work_left_s"] = max(0.0, float(rec["work_left_s"]) - saved)
        rec.update(state="preempted", ended_at=at, lost_s=progress - saved)
        rec["message"] = f"preempted; lost {progress - saved:.0f} s of work"

    def _observe(self, job_id: str, rec: Mapping[str, Any]) -> ObservedJob:
        state = ObservedState.RUNNING if rec["state"] == _RUNNING else _TERMINAL[rec["state"]]
        return ObservedJob(
            job_id=job_id,
            state=state,
            gpu_ids=tuple(rec["gpu_ids"]),
            started_at=float(rec["started_at"]),
            ended_at=None if rec.get("ended_at") is None else float(rec["ended_at"]),
            backend_ref=str(rec.get("ref", "")),
            message=str(rec.get("message", "")),
        )

    def _preempt(self, action: PreemptAction, records: dict[str, dict[str, Any]], now: float) -> ActionResult:
        job_id = action.job_id
        rec = records.get(job_id)
        if rec is None or rec["state"] != _RUNNING:
            return ActionResult("preempt", job_id, True, "not running")
        if not rec.get("is_preemptible"):
            return ActionResult("preempt", job_id, False, "the job is not preemptible")
        kill_at = max(action.kill_at, now)
        if rec.get("kill_at") is not None and float(rec["kill_at"]) <= kill_at:
            return ActionResult("preempt", job_id, True, "already being preempted", str(rec.get("ref", "")))
        rec["kill_at"] = kill_at
        signal_at = min(max(action.signal_at, now), kill_at)
        rec["signal_at"] = (
            signal_at if rec.get("signal_at") is None else min(float(rec["signal_at"]), signal_at)
        )
        self._save(job_id, rec)
        return ActionResult("preempt", job_id, True, "", str(rec.get("ref", "")))

    def _start(
        self,
        action: StartAction,
        records: dict[str, dict[str, Any]],
        payload: Mapping[str, Any],
        now: float,
        owners: dict[int, str],
    ) -> ActionResult:
        """Start one job; ``owners`` (GPU id -> running job id) is kept up to date for the next start."""
        job_id = action.job_id
        gpu_ids = tuple(action.gpu_ids)
        rec = records.get(job_id)
        if rec is not None and rec["state"] == _RUNNING:
            if tuple(rec["gpu_ids"]) == gpu_ids:
                return ActionResult("start", job_id, True, "already running", str(rec.get("ref", "")))
            return ActionResult("start", job_id, False, f"already running on GPUs {rec['gpu_ids']}")
        if self.config.refuse_starts:
            return ActionResult(
                "start", job_id, False, "the simulated cluster refused the start (refuse_starts)"
            )
        if not gpu_ids or len(set(gpu_ids)) != len(gpu_ids) or not set(gpu_ids) <= self._gpu_ids:
            return ActionResult("start", job_id, False, f"bad GPU list {list(gpu_ids)}")
        busy = sorted(g for g in gpu_ids if g in owners)
        if busy:
            return ActionResult(
                "start", job_id, False, f"GPUs {busy} are busy (jobs {sorted({owners[g] for g in busy})})"
            )
        restarts = 0 if rec is None else int(rec.get("restarts", 0)) + 1
        if rec is not None and rec["state"] == "preempted" and float(rec.get("work_left_s", 0.0)) > 0:
            work_s = float(rec["work_left_s"])
        else:
            work_s = self._work_s(job_id, payload)
        outcome = "completed"
        if (
            self.config.fail_rate > 0
            and random.Random(f"fail:{self.config.seed}:{job_id}").random() < self.config.fail_rate
        ):
            outcome = "failed"
        ref = f"sim-{job_id}.{restarts}"
        new = {
            "state": _RUNNING,
            "gpu_ids": list(gpu_ids),
            "started_at": now,
            "end_at": now + work_s / self.config.speedup,
            "work_left_s": work_s,
            "outcome": outcome,
            "is_preemptible": bool(action.is_preemptible or payload.get("is_preemptible")),
            "is_checkpointable": bool(payload.get("is_checkpointable")),
            "checkpoint_interval_s": payload.get("checkpoint_interval_s"),
            "signal_at": None,
            "kill_at": None,
            "ended_at": None,
            "restarts": restarts,
            "ref": ref,
            "message": "",
        }
        records[job_id] = new
        self._save(job_id, new)
        owners.update(dict.fromkeys(gpu_ids, job_id))
        return ActionResult("start", job_id, True, "", ref)

    def _work_s(self, job_id: str, payload: Mapping[str, Any]) -> float:
        explicit = payload.get("sim_runtime_s")
        if explicit is not None:
            return max(0.0, float(explicit))
        base = payload.get("requested_s") or self.config.default_runtime_s
        rng = random.Random(f"work:{self.config.seed}:{job_id}")
        return float(base) * rng.uniform(self.config.runtime_fraction_lo, self.config.runtime_fraction_hi)
