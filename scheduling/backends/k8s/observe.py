"""Pure translation of Kubernetes objects to Berth's view: GPU counts and ids, job states, error text."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from scheduling.backends.base import (
    ActionResult,
    BackendError,
    ObservedJob,
    ObservedState,
)
from scheduling.backends.k8s.config import (
    GPU_IDS_ANNOTATION,
    JOB_ID_ANNOTATION,
    JOB_ID_LABEL,
    STOP_REASON_ANNOTATION,
)
from scheduling.engine.types import (
    ReleaseAction,
    ReserveAction,
)


def _gpu_count(quantity: str | None) -> int:
    # Extended resources such as nvidia.com/gpu are whole numbers; anything else counts as no GPU.
    try:
        return max(0, int(quantity)) if quantity is not None else 0
    except ValueError:
        return 0


def _parse_gpu_ids(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        return ()


def _object_job_id(meta: k8s_client.V1ObjectMeta | None) -> str | None:
    """The Berth job id of an object: the exact annotation, else the label (ids that are label values)."""
    if meta is None:
        return None
    annotations = meta.annotations or {}
    labels = meta.labels or {}
    if JOB_ID_ANNOTATION in annotations:
        return annotations[JOB_ID_ANNOTATION]
    return labels.get(JOB_ID_LABEL)


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _finished_condition(job: k8s_client.V1Job) -> k8s_client.V1JobCondition | None:
    conditions = (job.status.conditions if job.status else None) or []
    return next((c for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"), None)


def _owner_uid(pod: k8s_client.V1Pod) -> str | None:
    """The uid of the Job that owns a pod, None when the pod names no owning Job."""
    owners = (pod.metadata.owner_references if pod.metadata else None) or []
    return next((o.uid for o in owners if o.kind == "Job"), None)


def _is_scheduler_preempted(pod: k8s_client.V1Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "DisruptionTarget" and c.reason == "PreemptionByScheduler" for c in conditions)


def _observed_jobs(
    jobs: Iterable[k8s_client.V1Job], pods: Iterable[k8s_client.V1Pod]
) -> tuple[ObservedJob, ...]:
    """Map Berth's Jobs and pods to one `ObservedJob` per Berth job id, sorted by id."""
    jobs_by_id: dict[str, k8s_client.V1Job] = {}
    for job in jobs:
        job_id = _object_job_id(job.metadata)
        if job_id is not None:  # the emulator ignores label selectors; a real server never sends these
            jobs_by_id[job_id] = job
    pods_by_id: dict[str, list[k8s_client.V1Pod]] = {}
    for pod in pods:
        job_id = _object_job_id(pod.metadata)
        if job_id is not None:
            pods_by_id.setdefault(job_id, []).append(pod)
    observed = [
        _observe(job_id, jobs_by_id.get(job_id), pods_by_id.get(job_id, []))
        for job_id in sorted(jobs_by_id.keys() | pods_by_id.keys())
    ]
    return tuple(observed)


def _observe(job_id: str, job: k8s_client.V1Job | None, pods: list[k8s_client.V1Pod]) -> ObservedJob:
    meta = job.metadata if job is not None else (pods[0].metadata if pods else None)
    annotations = (meta.annotations if meta else None) or {}
    gpu_ids = _parse_gpu_ids(annotations.get(GPU_IDS_ANNOTATION))
    ref = (meta.name if meta else None) or ""
    earlier: list[k8s_client.V1Pod] = []
    if job is not None:
        ref = (job.metadata.name if job.metadata else None) or ref
        # A requeued job gets a new Job of the same name while the pods of the preempted attempt may still be
        # in their grace period: only pods owned by this Job (by uid) describe it.
        uid = job.metadata.uid if job.metadata else None
        earlier = [p for p in pods if _owner_uid(p) not in (None, uid)]
        pods = [p for p in pods if p not in earlier]
    started = [t for t in (_epoch(p.status.start_time if p.status else None) for p in pods) if t is not None]
    job_started = _epoch(job.status.start_time if job is not None and job.status else None)
    started_at = min(started) if started else job_started

    terminating = [p for p in pods if p.metadata and p.metadata.deletion_timestamp is not None]
    is_job_deleting = job is None or (
        job.metadata is not None and job.metadata.deletion_timestamp is not None
    )
    if terminating and is_job_deleting:
        reasons = {
            ((p.metadata.annotations if p.metadata else None) or {}).get(STOP_REASON_ANNOTATION) for p in pods
        }
        state = ObservedState.PREEMPTED if "preempted" in reasons else ObservedState.CANCELLED
        message = "terminating" if reasons - {None} else "terminating; deleted outside Berth"
        return ObservedJob(job_id, state, gpu_ids, started_at=started_at, backend_ref=ref, message=message)

    if job is not None:
        finished = _finished_condition(job)
        if finished is not None:
            ended_at = _epoch(job.status.completion_time if job.status else None)
            ended_at = ended_at if ended_at is not None else _epoch(finished.last_transition_time)
            if finished.type == "Complete":
                state = ObservedState.COMPLETED
            elif any(_is_scheduler_preempted(p) for p in pods):
                state = ObservedState.PREEMPTED
            else:
                state = ObservedState.FAILED
            message = ": ".join(part for part in (finished.reason, finished.message) if part)
            return ObservedJob(
                job_id,
                state,
                gpu_ids,
                started_at=started_at,
                ended_at=ended_at,
                backend_ref=ref,
                message=message,
            )

    phases = {(p.status.phase if p.status else None) for p in pods}
    if "Running" in phases:
        state = ObservedState.RUNNING
    elif "Unknown" in phases:
        state = ObservedState.LOST
    elif job is None and phases & {"Succeeded", "Failed"}:
        # Pods outlived their Job (orphaned): report what the pods say.
        state = ObservedState.COMPLETED if phases == {"Succeeded"} else ObservedState.FAILED
    else:
        state = ObservedState.PENDING
    message = _waiting_reason(pods) if state is ObservedState.PENDING else ""
    if earlier:
        message = "; ".join(
            filter(None, (message, f"{len(earlier)} pod(s) of an earlier attempt still exist"))
        )
    return ObservedJob(job_id, state, gpu_ids, started_at=started_at, backend_ref=ref, message=message)


def _waiting_reason(pods: list[k8s_client.V1Pod]) -> str:
    """Why a pending pod waits (image pull back-off, unschedulable), for the "why pending" page."""
    for pod in pods:
        status = pod.status
        if status is None:
            continue
        for container in status.container_statuses or []:
            waiting = container.state.waiting if container.state else None
            if waiting is not None and waiting.reason:
                return ": ".join(part for part in (waiting.reason, waiting.message) if part)
        for condition in status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                return ": ".join(part for part in (condition.reason, condition.message) if part)
    return ""


def _no_reservation(action: ReserveAction) -> ActionResult:
    return ActionResult(
        "reserve",
        action.holder_id,
        is_ok=True,
        message="Kubernetes has no reservations; the engine holds these GPUs until the booking starts",
    )


def _no_release(action: ReleaseAction) -> ActionResult:
    return ActionResult(
        "release",
        action.holder_id,
        is_ok=True,
        message="Kubernetes has no reservations; the engine released these GPUs",
    )


def _describe(exc: ApiException) -> str:
    """The API server's own message from a Status body, else the HTTP reason."""
    detail = str(exc.reason or "")
    try:
        status = json.loads(exc.body or "")
    except (TypeError, ValueError):
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        detail = status["message"]
    return f"HTTP {exc.status}: {detail}"


def _backend_error(doing: str, exc: Exception) -> BackendError:
    if isinstance(exc, ApiException):
        return BackendError(f"Kubernetes API: {doing} failed: {_describe(exc)}")
    if isinstance(exc, ValidationError):
        # The v37 client validates every response against the API schema; a proxy or an incompatible
        # server version can send a shape it refuses.
        return BackendError(f"Kubernetes API: {doing} returned an unexpected object: {exc}")
    return BackendError(f"Kubernetes API: {doing} failed: {type(exc).__name__}: {exc}")
