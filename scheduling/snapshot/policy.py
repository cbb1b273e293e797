"""A cluster's `PolicyConfig`, with the interactive headroom and pool of the demand forecast.

The forecast reaches it through the prediction port (``scheduling.ports``); when that fails the
round plans without headroom (rounds never depend on the forecasting app).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import fields
from datetime import datetime
from typing import Any

from django.conf import settings

from scheduling.engine import types as et
from scheduling.models import Cluster
from scheduling.ports import prediction_port

logger = logging.getLogger(__name__)

_TUPLE_PAIR_FIELDS = {"interactive_headroom"}
_TUPLE_FIELDS = {"interactive_partition"}


def policy_config_for_cluster(*, cluster: Cluster, at: datetime | None = None) -> et.PolicyConfig:
    """`PolicyConfig` from ``cluster.settings["policy"]`` (a name or a mapping of fields) over the defaults.

    ``BERTH_ENGINE_POLICY`` names the policy when the cluster does not.  Unknown keys are ignored.
    With ``at``, a ``berth`` policy whose settings do not fix ``interactive_headroom`` holds the
    headroom the interactive-demand forecast asks for in the hour from ``at``.
    """
    raw: Any = (cluster.settings or {}).get("policy", {})
    if isinstance(raw, str):
        raw = {"name": raw}
    values: dict[str, Any] = {"name": settings.BERTH_ENGINE_POLICY}
    known = {f.name for f in fields(et.PolicyConfig)}
    for key, value in dict(raw).items():
        if key not in known:
            continue
        if key in _TUPLE_PAIR_FIELDS:
            values[key] = tuple((str(k), int(v)) for k, v in value)
        elif key in _TUPLE_FIELDS:
            values[key] = tuple(str(v) for v in value)
        else:
            values[key] = value
    policy = et.PolicyConfig(**values)
    if at is not None and policy.name == "berth" and "interactive_headroom" not in values:
        policy = dataclasses.replace(policy, interactive_headroom=forecast_headroom(cluster=cluster, at=at))
    if at is not None and policy.name == "berth" and "interactive_pool" not in values:
        policy = dataclasses.replace(policy, interactive_pool=forecast_pool(cluster=cluster, at=at))
    return policy


def forecast_headroom(*, cluster: Cluster, at: datetime) -> tuple[tuple[str, int], ...]:
    """GPUs per type to keep for interactive demand in the coming hour, from the demand forecast.

    Empty when no usable forecast is stored or the prediction port fails (rounds never depend on it).
    """
    try:
        return tuple(prediction_port().interactive_headroom_policy(cluster_id=cluster.pk, at=at))
    except Exception:
        logger.warning("forecast headroom failed for cluster %s", cluster.name, exc_info=True)
        return ()


def forecast_pool(*, cluster: Cluster, at: datetime) -> tuple[tuple[float, str, int], ...]:
    """The interactive pool for the coming hours from the stored forecast (empty on failure)."""
    try:
        return prediction_port().interactive_pool(cluster_id=cluster.pk, at=at)
    except Exception:
        logger.warning("forecast pool failed for cluster %s", cluster.name, exc_info=True)
        return ()
