"""The parts of the engine's input snapshot, one module per responsibility.

``scheduling.snapshots`` assembles them into the frozen `ClusterSnapshot` of a round (and
re-exports their public names): `ids` (engine ids and the epoch clock), `inventory` (nodes and
GPU types), `policy` (the cluster's `PolicyConfig`, with the forecast's headroom and pool through
the prediction port), `jobs` (open jobs as engine requests, their GPUs, preemption graces and
runtime predictions) and `shares` (fair share: decayed usage and quotas).
"""
