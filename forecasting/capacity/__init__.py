"""Capacity planning: when forecast demand outgrows the cluster, and the what-if's replays.

* `exceed` (Prophet fits): `capacity_exceed_when`, per GPU type the first forecast hour whose
  demand (point, and the upper end of the 80% interval) exceeds the GPUs the cluster has.
* `trace` (ORM reads): `wait_trace_get`, the lab's own recent finished jobs on one type as a
  replay trace, and the cluster facts a what-if starts from (`gpus_per_node`, `policy_name`).
* `replay` (the simulator, no ORM): `wait_replay` runs a trace on a given number of nodes and
  policy (``scheduling.sim``: the same ``plan_round`` as production); `WaitPoint` is its result.
* `runs` (the tasks' writes): `capacity_study_execute` and `capacity_exceed_run_execute` run a
  stored what-if (`CapacityStudy`) or capacity-exceed run (`CapacityExceedRun`) and store its
  progress and result on the row; `forecasting.services` creates the rows and queues the tasks.

The what-if replays a trace twice: as the cluster is and with GPUs added or removed.  Only
`runs` writes.
"""

from forecasting.capacity.exceed import CapacityCrossing, capacity_exceed_when
from forecasting.capacity.replay import WaitPoint, peak_concurrent_gpus, wait_replay
from forecasting.capacity.trace import gpus_per_node, policy_name, wait_trace_get

__all__ = [
    "CapacityCrossing",
    "WaitPoint",
    "capacity_exceed_when",
    "gpus_per_node",
    "peak_concurrent_gpus",
    "policy_name",
    "wait_replay",
    "wait_trace_get",
]
