"""The one protocol every cluster backend implements (DESIGN §5).

Backends translate and never decide: the engine's `Plan` says what to do, a backend does it
and reports what really runs.  Repeating an action that is already done counts as success.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from scheduling.engine.types import Node, Plan


class BackendError(Exception):
    """The backend could not be reached or refused an action; callers retry."""


class UnsupportedOperationError(BackendError):
    """The backend cannot do this at all (not a transient failure: callers do not retry)."""


class ObservedState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class ObservedJob:
    job_id: str  # Berth's id for the job (backends map their own ids to it)
    state: ObservedState
    gpu_ids: tuple[int, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None
    backend_ref: str = ""  # the backend's own id (Slurm job id, pod name)
    message: str = ""


@dataclass(frozen=True, slots=True)
class ObservedCluster:
    at: float
    nodes: tuple[Node, ...]
    jobs: tuple[ObservedJob, ...]
    is_degraded: bool = False
    message: str = ""


@dataclass(frozen=True, slots=True)
class ActionResult:
    action: str  # "start" | "preempt" | "reserve" | "release" | "cancel"
    target_id: str
    is_ok: bool
    message: str = ""
    backend_ref: str = ""


@runtime_checkable
class ClusterBackend(Protocol):
    """Everything a round and the portal ask of a cluster; every backend implements all of it
    (an operation a backend cannot do raises `UnsupportedOperationError`)."""

    def snapshot(self) -> ObservedCluster:
        """What the cluster runs and holds now."""
        ...

    def apply(
        self, plan: Plan, *, payloads: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[ActionResult]:
        """Carry out a plan; ``payloads`` maps the plan's started job ids to what they run."""
        ...

    def cancel(self, job_id: str) -> ActionResult:
        """Stop a job the portal cancelled (idempotent: an unknown or ended job is ok)."""
        ...

    def job_output(self, job_id: str, *, backend_ref: str = "", tail_lines: int = 200) -> JobOutput:
        """The tail of what the job printed, and its exit code when known."""
        ...


@dataclass(frozen=True, slots=True)
class JobOutput:
    """The tail of what a job printed, as the backend keeps it (``job_output`` of a backend).

    ``stdout``/``stderr`` are the last ``tail_lines`` lines (``stderr`` is empty when the backend
    merges the two streams, as Slurm does by default and Kubernetes always does); ``exit_code``
    is None while the job runs or when the backend does not know it; ``source`` says where the
    text came from (a file path, a pod name) and ``is_truncated`` whether older lines were cut.
    """

    stdout: str
    stderr: str = ""
    exit_code: int | None = None
    source: str = ""
    is_truncated: bool = False


def tail(text: str, lines: int) -> tuple[str, bool]:
    """The last ``lines`` lines of ``text`` and whether anything was cut."""
    parts = text.splitlines(keepends=True)
    if len(parts) <= lines:
        return text, False
    return "".join(parts[-lines:]), True


def natural_key(name: str) -> list[tuple[int, int | str]]:
    """Sort key putting gpu-2 before gpu-10: the node order the backends number GPUs in."""
    return [(0, int(tok)) if tok.isdigit() else (1, tok) for tok in re.findall(r"\d+|\D+", name)]
