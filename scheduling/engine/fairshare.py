"""Fair share across projects: decayed, value-weighted usage against project weights.

The factor follows Slurm's classic formula ``F = 2 ** (-U / S)``: ``U`` is the project's share
of all (decayed, GPU-value-weighted) usage, ``S`` its share of all weights.  A project that used
exactly its share gets 0.5, an idle one 1.0, a heavy one tends to 0.
"""

from __future__ import annotations

import math

from scheduling.engine.types import ClusterSnapshot, GpuType

_RUNNING_HORIZON_H = 1.0  # running work counts as this many hours of usage "right now"


def decay_usage(usage: float, *, elapsed_s: float, half_life_s: float) -> float:
    """Exponential decay of accumulated usage over ``elapsed_s`` seconds.

    Callers (the portal's usage rollup, the simulator) add new GPU-hours x type value and decay
    with this, so the engine and its callers agree on one formula.
    """
    if half_life_s <= 0:
        return 0.0
    return usage * math.pow(0.5, max(0.0, elapsed_s) / half_life_s)


def fairshare_factors(
    snapshot: ClusterSnapshot,
    gpu_types: dict[str, GpuType],
    gpu_type_of: dict[int, str],
    *,
    queued_only: bool = False,
) -> dict[str, float]:
    """Fair-share factor in (0, 1] per project that appears in the snapshot.

    Usage is ``ProjectShare.decayed_usage`` plus the value of what the project runs right now
    (GPUs x type value x one hour), so a project that just grabbed many GPUs drops at once
    even when the caller's usage rollup lags.  Unknown projects have weight 1 and no history.
    ``queued_only``: only the factors of projects with pending jobs (the same values; a queue
    order asks for no others, and a portal may know many more projects than it queues for).
    """
    projects = snapshot.projects
    weights: dict[str, float] = {share.name: share.weight for share in projects}
    usage: dict[str, float] = {share.name: share.decayed_usage for share in projects}
    # max(x, 0.0) of every weight and usage, exactly: it changes only a value below 0.0, and
    # ``min`` is below 0.0 or NaN whenever one is (a NaN first hides the rest: fixed then too)
    if not min(weights.values(), default=0.0) >= 0.0:
        weights = {name: max(weight, 0.0) for name, weight in weights.items()}
    if not min(usage.values(), default=0.0) >= 0.0:
        usage = {name: max(used, 0.0) for name, used in usage.items()}
    # each project once, in order of first appearance (a queue has far more jobs than projects)
    queued = dict.fromkeys([job.project for job in snapshot.pending])
    for project in queued:
        if project not in weights:
            weights[project] = 1.0
        if project not in usage:
            usage[project] = 0.0
    gpu_value = {name: t.value for name, t in gpu_types.items()}
    is_uniform = all(value == 1.0 for value in gpu_value.values())
    for running in snapshot.running:
        project = running.job.project
        if project not in weights:
            weights[project] = 1.0
        if is_uniform:
            value = float(len(running.gpu_ids))
        else:
            value = sum(gpu_value.get(gpu_type_of.get(gpu, ""), 1.0) for gpu in running.gpu_ids)
        usage[project] = usage.get(project, 0.0) + value * _RUNNING_HORIZON_H
    total_usage = sum(usage.values())
    total_weight = sum(weights.values())
    wanted = queued if queued_only else weights
    if total_usage <= 0:
        return dict.fromkeys(wanted, 1.0)
    factors: dict[str, float] = {}
    pow_ = math.pow
    for project in wanted:
        weight = weights[project]
        norm_share = weight / total_weight if total_weight > 0 else 0.0
        used = usage.get(project, 0.0) / total_usage
        if norm_share <= 0:
            factors[project] = 0.0 if used > 0 else 1.0
        else:
            factors[project] = pow_(2.0, -used / norm_share)
    return factors
