"""``easy``: today's Slurm set-up, a faithful baseline.

Multifactor priority (age + fair share with decay), interactive sessions first but without
preemption, bookings as reservations, and EASY backfill on the user's estimate (else the
partition limit): the top job gets a shadow reservation and nothing that would delay it (on
those estimates) starts.  A job past its estimate is seen as ending in ``overdue_epsilon_s``.
No preemption ever.
"""

from __future__ import annotations

from scheduling.engine.stages.admit import Admit
from scheduling.engine.stages.backfill import EasyPass
from scheduling.engine.stages.compose import Composition, Model, plan_with
from scheduling.engine.stages.explain import Explain
from scheduling.engine.stages.order import MultifactorOrder
from scheduling.engine.stages.place import Place
from scheduling.engine.stages.reserve import Reserve
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

EASY = Composition(
    model=Model(),
    admit=Admit(),
    order=MultifactorOrder(),
    reserve=Reserve(),
    backfill=EasyPass(),
    place=Place(),
    explain=Explain(),
)


def plan_easy(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """One EASY-backfill round over the whole cluster."""
    return plan_with(EASY, snapshot, policy, now)
