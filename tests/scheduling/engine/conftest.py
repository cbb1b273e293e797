"""Builders for engine tests: plain dataclasses, no database (the engine is pure)."""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.engine.types import (
    ClusterSnapshot,
    GpuType,
    JobKind,
    JobRequest,
    Node,
    NodeStatus,
    RunningJob,
)


def make_nodes(
    count: int, gpus_per_node: int, *, gpu_type: str = "A100", first_gpu: int = 0, prefix: str = "n"
) -> tuple[Node, ...]:
    """``count`` nodes with consecutive GPU ids starting at ``first_gpu``."""
    return tuple(
        Node(
            id=f"{prefix}{i}",
            gpu_type=gpu_type,
            gpu_ids=tuple(range(first_gpu + i * gpus_per_node, first_gpu + (i + 1) * gpus_per_node)),
        )
        for i in range(count)
    )


def job(
    job_id: str,
    gpu_count: int,
    *,
    submit_at: float = 0.0,
    requested_s: float | None = 3_600.0,
    project: str = "p",
    user: str = "u",
    kind: JobKind = JobKind.BATCH,
    **extra: object,
) -> JobRequest:
    return JobRequest(
        id=job_id,
        user=user,
        project=project,
        gpu_count=gpu_count,
        submit_at=submit_at,
        kind=kind,
        requested_s=requested_s,
        **extra,  # type: ignore[arg-type]
    )


def running(
    request: JobRequest, gpu_ids: Sequence[int], *, started_at: float = 0.0, is_preemptible: bool = False
) -> RunningJob:
    return RunningJob(
        job=request, gpu_ids=tuple(gpu_ids), started_at=started_at, is_preemptible=is_preemptible
    )


def snapshot(
    nodes: Sequence[Node],
    *,
    running_jobs: Sequence[RunningJob] = (),
    pending: Sequence[JobRequest] = (),
    gpu_types: Sequence[GpuType] | None = None,
    **extra: object,
) -> ClusterSnapshot:
    names = []
    for node in nodes:
        if node.gpu_type not in names:
            names.append(node.gpu_type)
    return ClusterSnapshot(
        cluster="test",
        gpu_types=tuple(gpu_types) if gpu_types is not None else tuple(GpuType(name=n) for n in names),
        nodes=tuple(nodes),
        running=tuple(running_jobs),
        pending=tuple(pending),
        **extra,  # type: ignore[arg-type]
    )


def down(node: Node) -> Node:
    return Node(id=node.id, gpu_type=node.gpu_type, gpu_ids=node.gpu_ids, status=NodeStatus.DOWN)
