"""Writes behind the staff pages: quota and policy-knob edits (each with an audit event) and
what-if replays.

A what-if keeps its state (status, progress, baseline and what-if results) in the Django
cache under ``ops:whatif:<id>`` for `WHATIF_TTL_S`: web and worker must share that cache
(Redis in production, ``BERTH_CACHE_URL``).  It replays the lab's finished jobs of one GPU
type twice in the simulator (``forecasting.capacity.wait_replay``: the same ``plan_round``
as production): once as the cluster is, once with the GPUs and policy changed.
"""

from __future__ import annotations

import logging
import math
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.accounts.models import Quota
from scheduling.models import AuditEvent, Cluster, Node

logger = logging.getLogger(__name__)

POLICY_NAMES = ("fifo", "easy", "static", "berth")
# The PolicyConfig fields these pages edit (scheduling.snapshots.policy_config_for_cluster reads
# them from Cluster.settings["policy"]); every other key there is kept as it is.
POLICY_KNOBS = ("name", "grace_s", "min_runtime_s", "booking_lead_s", "interactive_headroom")
WHATIF_TTL_S = 24 * 3600


def _audit(*, user: Any, verb: str, entity_type: str, entity_id: int, before: Any, after: Any) -> None:
    AuditEvent.objects.create(
        actor=user if getattr(user, "pk", None) else None,
        actor_label=AuditEvent.Actor.USER,
        verb=verb,
        entity_type=entity_type,
        entity_id=entity_id,
        before=before,
        after=after,
        at=timezone.now(),
    )


def quota_update(*, quota_id: int, user: Any, guaranteed_gpus: int, borrow_limit_gpus: int | None) -> Quota:
    """Set a quota's guaranteed and borrowable GPUs; writes ``quota.update`` to the audit log.

    The guarantee may not exceed the GPUs of that type in all clusters (it could never be met).
    """
    errors: dict[str, str] = {}
    if guaranteed_gpus < 0:
        errors["guaranteed_gpus"] = "Give 0 or more GPUs."
    if borrow_limit_gpus is not None and borrow_limit_gpus < 0:
        errors["borrow_limit_gpus"] = "Give 0 or more GPUs, or leave empty for no limit."
    with transaction.atomic():
        quota = Quota.objects.select_for_update().select_related("gpu_type", "project").get(pk=quota_id)
        existing = sum(Node.objects.filter(gpu_type=quota.gpu_type).values_list("gpu_count", flat=True))
        if "guaranteed_gpus" not in errors and guaranteed_gpus > existing:
            errors["guaranteed_gpus"] = f"Only {existing} {quota.gpu_type.name} GPUs exist."
        if errors:
            raise ValidationError(errors)
        before = {"guaranteed_gpus": quota.guaranteed_gpus, "borrow_limit_gpus": quota.borrow_limit_gpus}
        quota.guaranteed_gpus, quota.borrow_limit_gpus = guaranteed_gpus, borrow_limit_gpus
        quota.save(update_fields=["guaranteed_gpus", "borrow_limit_gpus"])
        after = {"guaranteed_gpus": guaranteed_gpus, "borrow_limit_gpus": borrow_limit_gpus}
        _audit(
            user=user,
            verb="quota.update",
            entity_type="quota",
            entity_id=quota.pk,
            before=before,
            after=after,
        )
    return quota


def quota_create(
    *, project_id: int, gpu_type_id: int, user: Any, guaranteed_gpus: int, borrow_limit_gpus: int | None
) -> Quota:
    """A project's quota for a GPU type it has none for; writes ``quota.create``."""
    from portal.accounts.models import Project
    from scheduling.models import GpuType

    errors: dict[str, str] = {}
    gpu_type = GpuType.objects.filter(pk=gpu_type_id).first()
    if gpu_type is None:
        errors["gpu_type"] = "Choose a GPU type."
    if not Project.objects.filter(pk=project_id).exists():
        errors["project"] = "Choose a project."
    if guaranteed_gpus < 0:
        errors["guaranteed_gpus"] = "Give 0 or more GPUs."
    if borrow_limit_gpus is not None and borrow_limit_gpus < 0:
        errors["borrow_limit_gpus"] = "Give 0 or more GPUs, or leave empty for no limit."
    if gpu_type is not None and "guaranteed_gpus" not in errors:
        existing = sum(Node.objects.filter(gpu_type=gpu_type).values_list("gpu_count", flat=True))
        if guaranteed_gpus > existing:
            errors["guaranteed_gpus"] = f"Only {existing} {gpu_type.name} GPUs exist."
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        if Quota.objects.select_for_update().filter(project_id=project_id, gpu_type_id=gpu_type_id).exists():
            raise ValidationError(
                {"gpu_type": "This project already has a quota for that type: edit it above."}
            )
        quota = Quota.objects.create(
            project_id=project_id,
            gpu_type_id=gpu_type_id,
            guaranteed_gpus=guaranteed_gpus,
            borrow_limit_gpus=borrow_limit_gpus,
        )
        after = {
            "project_id": project_id,
            "gpu_type_id": gpu_type_id,
            "guaranteed_gpus": guaranteed_gpus,
            "borrow_limit_gpus": borrow_limit_gpus,
        }
        _audit(
            user=user, verb="quota.create", entity_type="quota", entity_id=quota.pk, before=None, after=after
        )
    return quota


def project_weight_update(*, project_id: int, user: Any, fair_share_weight: float) -> Any:
    """Set a project's fair-share weight (its entitlement); writes ``project.weight_update``."""
    from portal.accounts.models import Project

    if not math.isfinite(fair_share_weight) or not 0 < fair_share_weight <= 1000:
        raise ValidationError({"fair_share_weight": "Give a weight above 0 and at most 1000."})
    with transaction.atomic():
        project = Project.objects.select_for_update().get(pk=project_id)
        before = {"fair_share_weight": project.fair_share_weight}
        project.fair_share_weight = fair_share_weight
        project.save(update_fields=["fair_share_weight"])
        _audit(
            user=user,
            verb="project.weight_update",
            entity_type="project",
            entity_id=project.pk,
            before=before,
            after={"fair_share_weight": fair_share_weight},
        )
    return project


def cluster_policy_update(
    *,
    cluster_id: int,
    user: Any,
    name: str,
    grace_s: float,
    min_runtime_s: float,
    booking_lead_s: float = 0.0,
    interactive_headroom: list[tuple[str, int]] | None = None,
) -> Cluster:
    """Store policy knobs in ``Cluster.settings["policy"]`` (read by the next engine round);
    writes ``cluster.policy_update`` with the old and new knobs.

    ``interactive_headroom`` ``None`` removes the override (berth sizes it from the forecast).
    """
    errors: dict[str, str] = {}
    if name not in POLICY_NAMES:
        errors["name"] = f"Choose one of {', '.join(POLICY_NAMES)}."
    for key, value in (
        ("grace_s", grace_s),
        ("min_runtime_s", min_runtime_s),
        ("booking_lead_s", booking_lead_s),
    ):
        if not math.isfinite(value) or value < 0 or value > 7 * 86400:
            errors[key] = "Give between 0 s and 7 days."
    for type_name, gpus in interactive_headroom or ():
        if gpus < 0:
            errors["interactive_headroom"] = "Headroom GPUs must be 0 or more."
        elif (
            type_name != "*"
            and not Node.objects.filter(cluster_id=cluster_id, gpu_type__name=type_name).exists()
        ):
            errors["interactive_headroom"] = f"This cluster has no {type_name} GPUs."
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster_id)
        current = dict(cluster.settings or {})
        raw = current.get("policy", {})
        policy: dict[str, Any] = {"name": raw} if isinstance(raw, str) else dict(raw or {})
        before = {k: policy.get(k) for k in POLICY_KNOBS if k in policy}
        policy.update(
            {
                "name": name,
                "grace_s": grace_s,
                "min_runtime_s": min_runtime_s,
                "booking_lead_s": booking_lead_s,
            }
        )
        if interactive_headroom:
            policy["interactive_headroom"] = [[t, int(g)] for t, g in interactive_headroom]
        else:
            policy.pop("interactive_headroom", None)
        current["policy"] = policy
        cluster.settings = current
        cluster.save(update_fields=["settings"])
        after = {k: policy.get(k) for k in POLICY_KNOBS if k in policy}
        _audit(
            user=user,
            verb="cluster.policy_update",
            entity_type="cluster",
            entity_id=cluster.pk,
            before=before,
            after=after,
        )
    return cluster


# ---- what-if replays ----


def _key(whatif_id: str) -> str:
    return f"ops:whatif:{whatif_id}"


def whatif_get(*, whatif_id: str) -> dict[str, Any] | None:
    state: dict[str, Any] | None = cache.get(_key(whatif_id))
    return state


def _whatif_put(state: dict[str, Any]) -> None:
    cache.set(_key(state["id"]), state, WHATIF_TTL_S)


def whatif_create(
    *,
    cluster: Cluster,
    gpu_type: str,
    gpu_delta: int,
    policy: str,
    history_days: int = 14,
    user: Any = None,
    enqueue: bool = True,
) -> dict[str, Any]:
    """Queue a baseline-vs-what-if replay; returns its state (``id``, ``status`` "queued", ...)."""
    from forecasting.capacity import _gpus_per_node
    from forecasting.selectors import cluster_capacity_by_type

    errors: dict[str, str] = {}
    current = cluster_capacity_by_type(cluster_id=cluster.pk).get(gpu_type)
    per_node = _gpus_per_node(cluster_id=cluster.pk, gpu_type=gpu_type)
    if current is None:
        errors["gpu_type"] = f"{cluster.name} has no {gpu_type} GPUs."
    elif current + gpu_delta < per_node:
        errors["gpu_delta"] = f"Keep at least one node ({per_node} GPUs); {cluster.name} has {current}."
    if policy not in POLICY_NAMES:
        errors["policy"] = f"Choose one of {', '.join(POLICY_NAMES)}."
    if not 1 <= history_days <= 90:
        errors["history_days"] = "Replay between 1 and 90 days of history."
    if errors:
        raise ValidationError(errors)
    from forecasting.capacity import _policy_name

    state: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "cluster_id": cluster.pk,
        "gpu_type": gpu_type,
        "gpu_delta": gpu_delta,
        "gpus_per_node": per_node,
        "current_gpus": current,
        "baseline_policy": _policy_name(cluster_id=cluster.pk),
        "policy": policy,
        "history_days": history_days,
        "status": "queued",
        "progress": 0.0,
        "results": {},
        "message": "",
        "jobs": 0,
        "requested_by": getattr(user, "username", ""),
        "created_at": timezone.now().isoformat(),
    }
    _whatif_put(state)
    if enqueue:
        from ops.tasks import whatif_run

        transaction.on_commit(lambda: whatif_run.delay(state["id"]))
    return state


def whatif_execute(*, whatif_id: str, now: datetime | None = None) -> dict[str, Any]:
    """Run both replays, storing progress after each; a done what-if is left alone."""
    from forecasting.capacity import wait_replay, wait_trace_get

    state = whatif_get(whatif_id=whatif_id)
    if state is None:
        raise LookupError(f"what-if {whatif_id} expired or unknown")
    if state["status"] == "done":
        return state
    state.update(status="running", progress=0.05)
    _whatif_put(state)
    try:
        end = now or timezone.now()
        trace = wait_trace_get(
            cluster_id=state["cluster_id"],
            gpu_type=state["gpu_type"],
            start_at=end - timedelta(days=state["history_days"]),
            end_at=end,
            max_jobs=settings.BERTH_CAPACITY_MAX_JOBS,
        )
        state["jobs"] = len(trace.jobs)
        per_node = state["gpus_per_node"]
        runs = (
            ("baseline", state["current_gpus"], state["baseline_policy"]),
            ("whatif", state["current_gpus"] + state["gpu_delta"], state["policy"]),
        )
        for k, (label, gpus, policy) in enumerate(runs):
            nodes = max(1, round(gpus / per_node))
            if trace.jobs:
                point = wait_replay(
                    trace, gpu_type=state["gpu_type"], nodes=nodes, gpus_per_node=per_node, policy=policy
                )
                result = {**point.as_dict(), "policy": policy}
            else:
                result = {"gpus": nodes * per_node, "nodes": nodes, "policy": policy}
            state["results"][label] = result
            state["progress"] = round((k + 1) / len(runs), 2)
            _whatif_put(state)
        state.update(
            status="done",
            progress=1.0,
            message="" if trace.jobs else "No finished jobs of this type in the history: nothing to replay.",
        )
    except Exception as error:
        logger.exception("what-if %s failed", whatif_id)
        state.update(status="failed", message=str(error)[:500])
    _whatif_put(state)
    return state
