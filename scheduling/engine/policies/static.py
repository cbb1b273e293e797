"""``static``: a fixed interactive partition (sized for peak) plus ``easy`` on the rest.

Interactive sessions and bookings only go to ``policy.interactive_partition`` nodes; batch
runs on the other nodes.  Each side runs its own EASY pass with its own top-job reservation
(`stages.backfill.SplitPass`).  Batch jobs wider than the batch partition run across the
interactive partition once they head the batch queue, as Slurm sites do with an overlapping
partition (`stages.partition`).
"""

from __future__ import annotations

from scheduling.engine.stages.admit import Admit
from scheduling.engine.stages.backfill import SplitPass
from scheduling.engine.stages.compose import Composition, Model, plan_with
from scheduling.engine.stages.explain import Explain
from scheduling.engine.stages.order import MultifactorOrder
from scheduling.engine.stages.place import Place
from scheduling.engine.stages.reserve import Reserve
from scheduling.engine.types import ClusterSnapshot, Plan, PolicyConfig

STATIC = Composition(
    model=Model(has_partition=True, spans_wide_jobs=True),
    admit=Admit(),
    order=MultifactorOrder(),
    reserve=Reserve(),
    backfill=SplitPass(),
    place=Place(),
    explain=Explain(),
)


def plan_static(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """EASY on the batch nodes and, separately, on the interactive partition."""
    return plan_with(STATIC, snapshot, policy, now)
