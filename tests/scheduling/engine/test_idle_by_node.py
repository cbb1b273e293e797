"""Per-node idle counts a round stores for the idle drill-down (pure; no database)."""

from __future__ import annotations

from scheduling.engine.explain import idle_by_node
from scheduling.engine.types import IdleReason, Node


def test_counts_per_node_and_reason_skipping_started_and_unknown_gpus() -> None:
    nodes = (Node("a", "A100", (1, 2, 3, 4)), Node("b", "A100", (5, 6)), Node("c", "T4", (7,)))
    idle = (
        (1, IdleReason.NO_DEMAND),
        (2, IdleReason.NO_DEMAND),
        (3, IdleReason.FRAGMENTATION),
        (5, IdleReason.RESERVED_UNUSED),
        (6, IdleReason.NO_DEMAND),
        (99, IdleReason.NO_DEMAND),  # not a GPU of these nodes
    )
    out = idle_by_node(nodes, idle, skip=(6,))
    assert out == {"a": {"no_demand": 2, "fragmentation": 1}, "b": {"reserved_unused": 1}}
    assert sum(sum(v.values()) for v in out.values()) == 4
    assert idle_by_node(nodes, ()) == {}
