"""``fifo``: strict arrival order, first fit, stop at the first job that does not fit.

Bookings are still honoured as reservations (a start that would run into a booking's window
on its user estimate does not fit); the blocked head job reserves the next free GPUs, and
everyone behind it waits for it.
"""

from __future__ import annotations

from scheduling.engine.stages.admit import Admit
from scheduling.engine.stages.backfill import StrictPass
from scheduling.engine.stages.compose import Composition, Model, plan_with
from scheduling.engine.stages.explain import Explain
from scheduling.engine.stages.order import ArrivalOrder
from scheduling.engine.stages.place import Place
from scheduling.engine.stages.reserve import Reserve
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

FIFO = Composition(
    model=Model(),
    admit=Admit(),
    order=ArrivalOrder(),
    reserve=Reserve(),
    backfill=StrictPass(),
    place=Place(),
    explain=Explain(is_strict_order=True),
)


def plan_fifo(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """Start jobs in submit order until one does not fit; everyone behind it waits."""
    return plan_with(FIFO, snapshot, policy, now)
