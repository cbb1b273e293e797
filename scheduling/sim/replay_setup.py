"""What a replay runs under: its options, the per-policy set-up and the replay's arguments.

`ReplayOptions` (ticks, horizons, stopping), `policy_config` (``static``'s partition sized for
the overlay's demand; the other policies start from the defaults) and `ReplaySetup` (the keyword
arguments of `scheduling.sim.replay.Replay` and `run_replay`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Required, TypedDict

from scheduling.engine.types import Plan, PolicyConfig
from scheduling.sim.forecast import SessionForecast
from scheduling.sim.inventory import Inventory
from scheduling.sim.overlays import Overlay, demand_series
from scheduling.sim.runtime import RuntimePredictor
from scheduling.stats import percentile

PlanFn = Callable[..., Plan]  # plan_round(snapshot, policy=PolicyConfig, now=float) -> Plan

POLICIES = ("fifo", "easy", "static", "berth")


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    tick_s: float = 30.0
    max_tick_s: float = 600.0
    static_quantile: float = 95.0  # static partition sized for this percentile of overlay demand
    predict_for: frozenset[str] = frozenset({"berth"})  # policies that get runtime predictions
    strict: bool = True  # raise on a double allocation instead of refusing the start
    horizon_s: float = 7 * 86_400.0  # bookings passed to the engine: starting before now + horizon
    # "engine": bookings reach the engine without GPUs and take those of the engine's
    # ReserveAction at their start (the portal's own assignment is the admission check and the
    # fallback); "portal": the portal's assignment is final.
    booking_gpus: str = "portal"
    max_idle_rounds: int = 3  # stop when only ticks remain and this many rounds changed nothing
    # Stop at this simulated instant (what is running or queued then stays so in the record);
    # the demo lab's history replay ends at "now".  inf: until every job is done.
    stop_at_s: float = math.inf
    # easy, static and berth: a tick that would plan what the last round planned is not planned
    # (`scheduling.sim.replay_still`); verify: plan it anyway and raise if it differs
    skip_still_ticks: bool = True
    verify_still_ticks: bool = False


def policy_config(
    policy: str, *, inventory: Inventory, overlay: Overlay, options: ReplayOptions, seed: int = 0
) -> PolicyConfig:
    """The per-policy set-up: ``static`` gets a fixed interactive partition sized for the
    overlay's p95 interactive + booking demand; the others start from the defaults (``berth``'s
    headroom is updated every hour from the forecast during the replay)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    restore_s = overlay.config.restore_s
    if policy != "static":
        return PolicyConfig(name=policy, restore_s=restore_s)
    demand = [float(level) for _, level in demand_series(overlay)]
    want = math.ceil(percentile(demand, options.static_quantile))
    partition: list[str] = []
    covered = 0
    for node in reversed(inventory.nodes):  # the last nodes form the partition
        if covered >= want:
            break
        partition.append(node.id)
        covered += len(node.gpu_ids)
    return PolicyConfig(name=policy, interactive_partition=tuple(sorted(partition)), restore_s=restore_s)


class ReplaySetup(TypedDict, total=False):
    """The keyword arguments of `Replay` and `run_replay` (one declaration for both).

    ``policy`` and ``plan_fn`` are required; ``predictor`` gives runtime predictions to the
    policies in ``options.predict_for``; ``seed`` (default 0) seeds the policy set-up;
    ``config`` overrides the policy set-up of `policy_config`; ``forecast`` is the session-demand
    forecast that sizes berth's headroom and pool (None: berth gets none); ``oracle`` replaces
    every batch job's runtime estimate by its true runtime (the ``easy_oracle`` bound).
    """

    policy: Required[str]
    plan_fn: Required[PlanFn]
    predictor: RuntimePredictor | None
    options: ReplayOptions | None
    seed: int
    config: PolicyConfig | None
    forecast: SessionForecast | None
    oracle: bool


_SETUP_KEYS = ReplaySetup.__required_keys__ | ReplaySetup.__optional_keys__
