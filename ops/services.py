"""Writes behind the staff pages: quota and policy-knob edits, each with an audit event.

What-ifs are forecasting's (``forecasting.services.capacity_study_create``, a `CapacityStudy`
row run by a Celery task); the pages only start and show them.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.accounts.models import Quota
from scheduling.engine import POLICIES
from scheduling.models import AuditEvent, Cluster, Node
from scheduling.services import audit_event_record

logger = logging.getLogger(__name__)

POLICY_NAMES = POLICIES  # the engine's registry: what plan_round runs
# The PolicyConfig fields these pages edit (scheduling.snapshots.policy_config_for_cluster reads
# them from Cluster.settings["policy"]); every other key there is kept as it is.
POLICY_KNOBS = ("name", "grace_s", "min_runtime_s", "booking_lead_s", "interactive_headroom")


def _audit(*, user: Any, verb: str, entity_type: str, entity_id: int, before: Any, after: Any) -> None:
    """A staff edit's audit event, through the one audit writer (`scheduling.services.audit`)."""
    audit_event_record(
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
