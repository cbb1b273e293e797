"""`earliest_start`'s one-GPU search picks what the general single-node search picks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine.backfill import Shadow, Window, _latest, earliest_start, first_gap

NodeGpus = list[tuple[int, tuple[int, ...]]]
Case = tuple[NodeGpus, dict[int, float], dict[int, list[Window]]]


def _general(
    node_gpus: NodeGpus,
    available: dict[int, float],
    gpu_count: int,
    duration_s: float,
    windows: dict[int, list[Window]],
) -> Shadow | None:
    best: Shadow | None = None
    for _node, gpus in node_gpus:
        times = sorted(
            (first_gap(available[g], duration_s, windows.get(g)), g) for g in gpus if g in available
        )
        if len(times) < gpu_count:
            continue
        start = times[gpu_count - 1][0]
        if best is None or start < best.start_at:
            best = Shadow(start, _latest(times, start, gpu_count))
    return best


@st.composite
def _cases(
    draw: st.DrawFn,
) -> tuple[list[tuple[int, tuple[int, ...]]], dict[int, float], dict[int, list[Window]]]:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    ids = draw(st.permutations(range(sum(sizes))))
    nodes, at = [], 0
    for index, size in enumerate(sizes):
        nodes.append((index, tuple(ids[at : at + size])))
        at += size
    times = st.sampled_from([0.0, 10.0, 20.0, 50.0])  # few values: ties are the point
    available = draw(st.dictionaries(st.sampled_from(ids), times))
    windows: dict[int, list[Window]] = {}
    for gpu in draw(st.lists(st.sampled_from(ids), max_size=3, unique=True)):
        start = draw(times)
        windows[gpu] = [(start, start + draw(st.sampled_from([5.0, 30.0])))]
    return nodes, available, windows


@settings(max_examples=300, deadline=None)
@given(_cases(), st.sampled_from([0.0, 15.0]))
def test_one_gpu_search_matches_the_general_one(
    case: tuple[list[tuple[int, tuple[int, ...]]], dict[int, float], dict[int, list[Window]]],
    duration_s: float,
) -> None:
    nodes, available, windows = case
    for use_windows in (windows, {}):
        fast = earliest_start(
            node_gpus=nodes,
            available=available,
            gpu_count=1,
            is_single_node=True,
            duration_s=duration_s,
            windows=use_windows,
        )
        assert fast == _general(nodes, available, 1, duration_s, use_windows)
