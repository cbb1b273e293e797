"""Choosing what to reclaim for higher-class demand, losing as little work as possible.

Consent decides what may be taken: a running batch job is a candidate when its owner allowed
preemption (``JobRequest.is_preemptible``) or the quota made it preemptible
(``RunningJob.is_preemptible``: started above a guarantee or on lent capacity), however it
started.  A job in its grace period is never signalled again, and its GPUs count as "arriving"
for one demand only.  The kill time is never before the grace ends and never before the
demand's minimum runtime: for sessions, bookings and guaranteed-quota claims (the promise is a
GPU within about a grace) that minimum is at most the grace; for a batch job suspending another
it is ``min_runtime_s`` (so batch work is never churned for batch work).

Cost of a victim (`Victim.lost_gpu_s`): checkpointing work loses the work since its last
checkpoint plus ``restore_s`` per GPU when it resumes; restartable work loses everything it did.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from heapq import heappop, heappush

from scheduling.engine.cluster import RoundState
from scheduling.engine.types import JobKind, JobRequest, PolicyConfig, RunningJob

INF_COST = float("inf")


@dataclass(frozen=True, slots=True)
class Victim:
    running: RunningJob
    kill_at: float
    lost_gpu_s: float


@dataclass(frozen=True, slots=True)
class Reclaim:
    """A way to get GPUs for a demand: free ones now, ones in grace, and new victims."""

    free_gpus: tuple[int, ...]
    incoming_gpus: tuple[int, ...]  # from jobs already in grace (or signalled now)
    victims: tuple[Victim, ...]
    ready_at: float


def min_runtime_s(policy: PolicyConfig, *, is_high_class: bool) -> float:
    """How long a job runs before a demand may kill it: at most the grace for higher-class
    demand (sessions, bookings, quota claims), ``min_runtime_s`` for a batch job."""
    if is_high_class:
        return min(policy.min_runtime_s, policy.grace_s)
    return policy.min_runtime_s


def kill_time(state: RoundState, running: RunningJob, *, is_high_class: bool = False) -> float:
    """Earliest kill time of a signal sent now: after the grace and after the minimum runtime."""
    policy = state.policy
    return max(
        state.now + policy.grace_s,
        running.started_at + min_runtime_s(policy, is_high_class=is_high_class),
    )


def victim_of(state: RoundState, running: RunningJob, *, is_high_class: bool = False) -> Victim:
    return Victim(
        running=running,
        kill_at=kill_time(state, running, is_high_class=is_high_class),
        lost_gpu_s=state.lost_work_s(running) * len(running.gpu_ids),
    )


def is_consenting(running: RunningJob) -> bool:
    """Whether the owner or the quota marked a running job preemptible."""
    return running.is_preemptible or running.job.is_preemptible


def is_cheap_to_reclaim(running: RunningJob) -> bool:
    """Consenting work that resumes from a checkpoint: a reclaim loses at most a checkpoint
    interval plus the restore, so sessions may count on it being taken back (restartable work
    would lose everything it did, so it is a last resort, not capacity in reach)."""
    return running.job.is_checkpointable and is_consenting(running)


def is_costly_start(job: JobRequest) -> bool:
    """Batch work sessions cannot take back once it runs: work without its owner's consent.
    Such a start must leave the interactive pool's forecast peak free
    (`stages.admit.pool_admits`) unless it starts lent (above its project's guarantee).

    Restartable consenting work is not held back: a session may take it back while that
    loses at most what the session asks for (`demand_may_take`), and past that the session is
    served from the pool, lent checkpointing work and work ending.  Holding it back for the
    forecast peak, as non-preemptible work is, cost more than it saved: on the first 1,500 KTH
    jobs with sessions (15 %) and bookings (10 %), seeds 1 and 2, batch wait fell 28 % and 16 %,
    busy utilization rose 0.71 -> 0.75 and 0.70 -> 0.74, and the share of sessions waiting
    over 60 s fell 0.046 -> 0.004 and 0.027 -> 0.016 once it was not.
    """
    return job.kind == JobKind.BATCH and not job.is_preemptible


def demand_may_take(state: RoundState, *, demand_gpu_s: float) -> Callable[[RunningJob], bool]:
    """Which reclaimable work a session or a guaranteed-quota claim may take: checkpointing
    work always (it loses at most an interval plus the restore), restartable work only while
    the work it would throw away (`RoundState.lost_work_s` x its GPUs) is at most the GPU-time
    the demand asks for (``demand_gpu_s``).  Past that, evicting it destroys more GPU-time than
    serving the demand now uses, and the requeued job must redo it all on a cluster that is
    already full; the demand waits for GPUs to come free instead (for sessions the pool holds
    idle GPUs at the forecast level, `headroom.headroom_need`, so this is the overflow beyond
    the forecast)."""

    def may_take(running: RunningJob) -> bool:
        if running.job.is_checkpointable:
            return True
        return state.lost_work_s(running) * len(running.gpu_ids) <= demand_gpu_s

    return may_take


def is_reclaimable(running: RunningJob, *, excluded: set[str]) -> bool:
    """Consenting batch work (see `is_consenting`) that is not already being reclaimed."""
    return (
        is_consenting(running)
        and running.grace_until is None
        and running.job.kind == JobKind.BATCH
        and running.job.id not in excluded
    )


def takeable_on(state: RoundState, node_index: int) -> tuple[RunningJob, ...]:
    """The running jobs on a node that are reclaimable this round before this round's own
    signals (`is_reclaimable` with nothing excluded), in the order of their first GPU on it;
    indexed once per node and round (the snapshot does not change)."""
    cache = state.takeable_by_node
    found = cache.get(node_index)
    if found is None:
        seen: dict[str, RunningJob] = {}
        nothing: set[str] = set()
        running_by_gpu = state.running_by_gpu
        for gpu in state.nodes[node_index].gpu_ids:
            running = running_by_gpu.get(gpu)
            if running is None or running.job.id in seen:
                continue
            if is_reclaimable(running, excluded=nothing):
                seen[running.job.id] = running
        found = cache[node_index] = tuple(seen.values())
    return found


def takeable_on_nodes(state: RoundState, node_indexes: tuple[int, ...]) -> tuple[RunningJob, ...]:
    """The running jobs with a GPU on any of ``node_indexes`` that are reclaimable this round
    before this round's own signals (`takeable_on` over those nodes, each job once); indexed
    once per node list and round, by walking the running jobs instead of the nodes (a
    multi-node demand on one-GPU nodes asks about every node of the cluster)."""
    cache = state.takeable_on_nodes
    found = cache.get(node_indexes)
    if found is None:
        wanted = frozenset(node_indexes)
        gpu_node = state.gpu_node
        nothing: set[str] = set()
        found = cache[node_indexes] = tuple(
            running
            for running in state.snapshot.running
            if is_reclaimable(running, excluded=nothing)
            and any(gpu_node.get(g) in wanted for g in running.gpu_ids)
        )
    return found


def _takeable_gpus(state: RoundState, node_index: int) -> int:
    """GPUs of the node held by jobs reclaimable this round (`takeable_on`; once per node and
    round)."""
    found = state.takeable_gpus_by_node.get(node_index)
    if found is None:
        gpu_node = state.gpu_node
        found = state.takeable_gpus_by_node[node_index] = sum(
            sum(1 for g in running.gpu_ids if gpu_node.get(g) == node_index)
            for running in takeable_on(state, node_index)
        )
    return found


def _node_victims(
    state: RoundState, node_index: int, *, is_high_class: bool
) -> tuple[tuple[Victim, tuple[int, ...]], ...]:
    """The node's takeable work (`takeable_on`) as victims in victim order, each with the GPUs
    it frees on the node; once per node, class and round (a victim's kill time and loss depend
    on the round's clock and the job only, and the order is total: the same order as sorting
    any subset)."""
    key = (node_index, is_high_class)
    found = state.victims_by_node.get(key)
    if found is None:
        gpu_node = state.gpu_node
        victims = sorted(
            (
                victim_of(state, running, is_high_class=is_high_class)
                for running in takeable_on(state, node_index)
            ),
            key=lambda v: _victim_order(state, v),
        )
        found = state.victims_by_node[key] = tuple(
            (v, tuple(g for g in v.running.gpu_ids if gpu_node.get(g) == node_index)) for v in victims
        )
    return found


def _victim_order(state: RoundState, victim: Victim) -> tuple[bool, float, float, str]:
    # Past their minimum runtime first (the demand waits only the grace), then least lost work
    # (since the last checkpoint plus the restore, or all of it for restartable work), then
    # youngest, then id for determinism.
    slow = victim.kill_at > state.now + state.policy.grace_s
    return (slow, victim.lost_gpu_s, -victim.running.started_at, victim.running.job.id)


def plan_reclaim(
    state: RoundState,
    *,
    node_indexes: Iterable[int],
    gpu_count: int,
    free_on_node: Callable[[int], list[int]],
    incoming: dict[int, float],
    excluded_jobs: set[str],
    is_single_node: bool,
    may_take: Callable[[RunningJob], bool] | None = None,
    is_high_class: bool = False,
    free_nodes: Collection[int] | None = None,
) -> Reclaim | None:
    """The cheapest way to assemble ``gpu_count`` GPUs on the given nodes, or None.

    ``free_on_node`` gives usable free GPUs of a node; ``incoming`` maps GPUs of jobs already in grace
    (not promised to another demand) to when they come free; ``may_take`` narrows which reclaimable
    jobs this demand may take; ``is_high_class`` (sessions, bookings, quota claims) selects the short
    minimum runtime (`min_runtime_s`).  A single-node demand goes to the node with the lowest (ready
    time, lost work, node index): a unique minimum, whatever order the nodes are costed in; a
    multi-node one takes free, then incoming GPUs, then victims in victim order.
    ``free_nodes``: where ``free_on_node`` may find GPUs (None: anywhere); elsewhere a single-node
    demand needs victims, and those nodes are visited by ascending lower bound of their cost
    (`_FloorIndex`) until one's bound is above the best cost found: the nodes left cannot win.
    """
    arriving_on = _arriving_by_node(state, incoming)
    if is_single_node and free_nodes is not None:
        return _cheapest_node(
            state, _floor_index(state, node_indexes, is_high_class, excluded_jobs), free_on_node,
            arriving_on, free_nodes, (gpu_count, excluded_jobs, may_take, is_high_class),
        )  # fmt: skip
    if not is_single_node:
        return _plan_multi(state, node_indexes, gpu_count, free_on_node, arriving_on, excluded_jobs, may_take,
                           is_high_class)  # fmt: skip
    best: tuple[tuple[float, float, int], Reclaim] | None = None
    victims_ready = state.now + state.policy.grace_s  # no kill time is earlier (`kill_time`)
    nodes = state.nodes
    for node_index in node_indexes:
        if len(nodes[node_index].gpu_ids) < gpu_count:
            continue  # the node is too small whatever is taken on it
        free = free_on_node(node_index)
        arriving = arriving_on.get(node_index, []) if arriving_on else []
        found = (free, arriving, node_index, gpu_count)
        reclaim = _node_reclaim(state, found, excluded_jobs, may_take, is_high_class, best, victims_ready)
        best = _better(best, reclaim, node_index)
    return None if best is None else best[1]


def _plan_multi(
    state: RoundState,
    node_indexes: Iterable[int],
    gpu_count: int,
    free_on_node: Callable[[int], list[int]],
    arriving_on: dict[int, list[tuple[float, int]]],
    excluded_jobs: set[str],
    may_take: Callable[[RunningJob], bool] | None,
    is_high_class: bool,
) -> Reclaim | None:
    """`plan_reclaim` of a multi-node demand: the free and arriving GPUs of its nodes, then
    victims in victim order, each freeing all its GPUs.  The victims are collected per running
    job (`takeable_on_nodes`), not per node: on one-GPU nodes a wide job's demand covers every
    node of the cluster, and the running jobs are far fewer."""
    nodes = node_indexes if type(node_indexes) is tuple else tuple(node_indexes)
    pool_free: list[int] = []
    pool_incoming: list[tuple[float, int]] = []
    for node_index in nodes:
        pool_free.extend(free_on_node(node_index))
        if arriving_on:
            pool_incoming.extend(arriving_on.get(node_index, []))
    victims = [
        victim_of(state, running, is_high_class=is_high_class)
        for running in takeable_on_nodes(state, nodes)
        if running.job.id not in excluded_jobs and (may_take is None or may_take(running))
    ]
    return _assemble(
        state, pool_free, sorted(pool_incoming), victims, gpu_count, None, is_high_class=is_high_class
    )


# A single-node demand's search: (GPUs wanted, jobs signalled this round, what the demand may
# take or None for any, high class).
_Demand = tuple[int, set[str], Callable[[RunningJob], bool] | None, bool]
_Cost = tuple[float, float, int]


class _FloorIndex:
    """A node list's nodes for `_cheapest_node`: as a set, and as a heap of (floor, node index),
    each floor a lower bound of the cost of a reclaim there that needs victims, whatever the
    demand may take (`_floor_now`).  A floor is computed with the jobs signalled when it was
    (``excluded``, the round's signalled jobs, which only grows), so it stays a lower bound;
    a node whose cheapest victims were signalled since is found with a stale floor and moved
    to its new one when the search reaches it.  One per node list, class and round."""

    __slots__ = ("eligible", "excluded", "heap", "seen")

    def __init__(self, eligible: frozenset[int], heap: list[tuple[_Cost, int]], excluded: set[str]) -> None:
        self.eligible = eligible
        self.heap = heap
        self.excluded = excluded  # the set the floors were computed with (by identity)
        self.seen = len(excluded)  # its size then: a smaller set would not be the same set grown


def _floor_index(
    state: RoundState, node_indexes: Iterable[int], is_high_class: bool, excluded_jobs: set[str]
) -> _FloorIndex:
    """The `_FloorIndex` of ``node_indexes``, started from `_victims_floor` (nothing signalled),
    which is a sorted list and so a heap; started again for another or a shrunken signalled set."""
    nodes = node_indexes if type(node_indexes) is tuple else tuple(node_indexes)
    key = (is_high_class, nodes)
    found: _FloorIndex | None = state.floor_orders.get(key)
    if found is None or found.excluded is not excluded_jobs or len(excluded_jobs) < found.seen:
        victims_ready = state.now + state.policy.grace_s
        floors = state.victims_floor_by_node
        heap = sorted(
            (floors.get((i, is_high_class)) or _victims_floor(state, i, is_high_class, victims_ready), i)
            for i in nodes
        )
        found = state.floor_orders[key] = _FloorIndex(frozenset(nodes), heap, excluded_jobs)
    found.seen = len(excluded_jobs)
    return found


def _floor_now(
    state: RoundState, node_index: int, excluded_jobs: set[str], is_high_class: bool, victims_ready: float
) -> _Cost:
    """`_victims_floor` without the victims in ``excluded_jobs``: a reclaim on a node without free or
    arriving GPUs takes at least one other victim; past its minimum runtime it is ready at
    ``victims_ready`` and loses at least the first such one's work (the least, in victim order),
    else it is ready later."""
    for victim, _gained in _node_victims(state, node_index, is_high_class=is_high_class):
        if victim.running.job.id in excluded_jobs:
            continue
        if victim.kill_at > victims_ready:
            return (victims_ready, INF_COST, node_index)
        return (victims_ready, victim.lost_gpu_s, node_index)
    return (INF_COST, 0.0, node_index)


def _cheapest_node(
    state: RoundState,
    index: _FloorIndex,
    free_on_node: Callable[[int], list[int]],
    arriving_on: dict[int, list[tuple[float, int]]],
    free_nodes: Collection[int],
    demand: _Demand,
) -> Reclaim | None:
    """`plan_reclaim` of a single-node demand with ``free_nodes`` known: the eligible nodes with
    free or arriving GPUs first (in node order), then the others by ascending floor
    (`_FloorIndex`), the search stopping at the first floor above the best cost (every later
    floor is higher, and a node without free or arriving GPUs costs at least its floor)."""
    gpu_count, excluded_jobs, may_take, is_high_class = demand
    victims_ready = state.now + state.policy.grace_s
    nodes = state.nodes
    firsts = sorted({i for i in (*free_nodes, *arriving_on) if i in index.eligible})
    best: tuple[_Cost, Reclaim] | None = None
    for node_index in firsts:
        if len(nodes[node_index].gpu_ids) < gpu_count:
            continue
        found = (free_on_node(node_index), arriving_on.get(node_index, []), node_index, gpu_count)
        reclaim = _node_reclaim(state, found, excluded_jobs, may_take, is_high_class, best, victims_ready)
        best = _better(best, reclaim, node_index)
    done = set(firsts)
    heap = index.heap
    visited: list[tuple[_Cost, int]] = []
    while heap and (best is None or not best[0] < heap[0][0]):
        floor, node_index = heappop(heap)
        now_floor = _floor_now(state, node_index, excluded_jobs, is_high_class, victims_ready)
        if floor < now_floor:  # its cheapest victims were signalled: back in at its floor now
            heappush(heap, (now_floor, node_index))
            continue
        visited.append((floor, node_index))
        if node_index in done or len(nodes[node_index].gpu_ids) < gpu_count:
            continue
        found = ([], [], node_index, gpu_count)
        reclaim = _node_reclaim(state, found, excluded_jobs, may_take, is_high_class, best, victims_ready)
        best = _better(best, reclaim, node_index)
    for entry in visited:  # the next demand searches them too
        heappush(heap, entry)
    return None if best is None else best[1]


def _better(
    best: tuple[tuple[float, float, int], Reclaim] | None, reclaim: Reclaim | None, node_index: int
) -> tuple[tuple[float, float, int], Reclaim] | None:
    """The cheaper by (ready time, lost work, node index) of ``best`` and ``reclaim`` on a node."""
    if reclaim is None:
        return best
    cost = (reclaim.ready_at, sum(v.lost_gpu_s for v in reclaim.victims), node_index)
    return (cost, reclaim) if best is None or cost < best[0] else best


def _node_reclaim(
    state: RoundState,
    found: tuple[list[int], list[tuple[float, int]], int, int],
    excluded_jobs: set[str],
    may_take: Callable[[RunningJob], bool] | None,
    is_high_class: bool,
    best: tuple[tuple[float, float, int], Reclaim] | None,
    victims_ready: float,
) -> Reclaim | None:
    """The cheapest reclaim on one node given its ``found`` (free GPUs, arriving GPUs, node, GPUs
    wanted), or None when it cannot gather enough GPUs or, needing victims, cannot beat ``best``."""
    free, arriving, node_index, gpu_count = found
    if len(free) + len(arriving) + _takeable_gpus(state, node_index) < gpu_count:
        # an upper bound on what reclaim could add here (every takeable job's GPUs on the
        # node): too few, so the victims need not be costed
        return None
    if len(free) + len(arriving) >= gpu_count:
        return _assemble_sorted(state, free, arriving, [], gpu_count)  # no victim needed
    return _with_victims(state, found, excluded_jobs, may_take, is_high_class, best, victims_ready)


def _with_victims(
    state: RoundState,
    found: tuple[list[int], list[tuple[float, int]], int, int],
    excluded_jobs: set[str],
    may_take: Callable[[RunningJob], bool] | None,
    is_high_class: bool,
    best: tuple[tuple[float, float, int], Reclaim] | None,
    victims_ready: float,
) -> Reclaim | None:
    """`plan_reclaim` on one node whose ``found`` (free GPUs, arriving GPUs, node, GPUs wanted)
    do not suffice: None when it has too few victims or cannot beat ``best`` (a lower bound of
    its cost, `_victims_bound`, says so before the victims are assembled)."""
    free, arriving, node_index, gpu_count = found
    if best is not None and best[0] < _victims_bound(
        state, node_index, excluded_jobs, may_take, is_high_class, victims_ready
    ):
        return None
    victims = _may_take_on(state, node_index, excluded_jobs, may_take, is_high_class)
    if len(free) + len(arriving) + sum(len(gained) for _v, gained in victims) < gpu_count:
        return None
    return _assemble_sorted(state, free, arriving, victims, gpu_count)


def _arriving_by_node(state: RoundState, incoming: dict[int, float]) -> dict[int, list[tuple[float, int]]]:
    """``incoming`` per node as (time, GPU) pairs in ascending order."""
    by_node: dict[int, list[tuple[float, int]]] = {}
    gpu_node = state.gpu_node
    for gpu, at in incoming.items():
        node_index = gpu_node.get(gpu)
        if node_index is not None:
            by_node.setdefault(node_index, []).append((at, gpu))
    for pairs in by_node.values():
        pairs.sort()
    return by_node


def _victims_floor(
    state: RoundState, node_index: int, is_high_class: bool, victims_ready: float
) -> tuple[float, float, int]:
    """A lower bound on the cost (ready time, lost work, node) of any reclaim on a node that
    needs a victim, whatever this round has signalled or the demand may take: the first victim
    in victim order is past its minimum runtime (ready at ``victims_ready``) and loses least
    among those, or none is (every victim is ready later).  Once per node, class and round."""
    key = (node_index, is_high_class)
    found = state.victims_floor_by_node.get(key)
    if found is None:
        victims = _node_victims(state, node_index, is_high_class=is_high_class)
        if not victims:
            found = (INF_COST, 0.0, node_index)  # nothing to take: no reclaim here at all
        elif victims[0][0].kill_at > victims_ready:
            found = (victims_ready, INF_COST, node_index)
        else:
            found = (victims_ready, victims[0][0].lost_gpu_s, node_index)
        state.victims_floor_by_node[key] = found
    return found


def _victims_bound(
    state: RoundState,
    node_index: int,
    excluded_jobs: set[str],
    may_take: Callable[[RunningJob], bool] | None,
    is_high_class: bool,
    victims_ready: float,
) -> tuple[float, float, int]:
    """A lower bound on the cost (ready time, lost work, node) of a reclaim on a node whose free
    and arriving GPUs do not suffice: it takes at least the first victim in victim order,
    which is ready no earlier than the grace (`kill_time`); when that victim is past its
    minimum runtime (``kill_at`` = ``victims_ready``) the plan is ready then at the earliest
    and loses at least that victim's work, else it is ready at that victim's kill time at the
    earliest (victims that are not past it come later in the order)."""
    for victim, _gained in _node_victims(state, node_index, is_high_class=is_high_class):
        if victim.running.job.id in excluded_jobs or (may_take is not None and not may_take(victim.running)):
            continue
        if victim.kill_at > victims_ready:
            return (victim.kill_at, 0.0, node_index)
        return (victims_ready, victim.lost_gpu_s, node_index)
    return (INF_COST, 0.0, node_index)  # no victim at all: nothing to assemble here


def _may_take_on(
    state: RoundState,
    node_index: int,
    excluded_jobs: set[str],
    may_take: Callable[[RunningJob], bool] | None,
    is_high_class: bool,
) -> list[tuple[Victim, tuple[int, ...]]]:
    """The node's victims in victim order (`_node_victims`) not signalled this round and that
    ``may_take`` (None: any) allows."""
    return [
        (victim, gained)
        for victim, gained in _node_victims(state, node_index, is_high_class=is_high_class)
        if victim.running.job.id not in excluded_jobs and (may_take is None or may_take(victim.running))
    ]


def _assemble_sorted(
    state: RoundState,
    free: list[int],
    arriving: list[tuple[float, int]],
    victims: Iterable[tuple[Victim, tuple[int, ...]]],
    gpu_count: int,
) -> Reclaim | None:
    """`_assemble` on one node, with its victims already in victim order and their GPUs on
    that node (`_node_victims`)."""
    chosen_free = tuple(sorted(free)[:gpu_count])
    need = gpu_count - len(chosen_free)
    chosen_incoming: list[int] = []
    ready_at = state.now
    for at, gpu in arriving:
        if need <= 0:
            break
        chosen_incoming.append(gpu)
        ready_at = max(ready_at, at)
        need -= 1
    chosen_victims: list[Victim] = []
    for victim, gained in victims:
        if need <= 0:
            break
        chosen_victims.append(victim)
        chosen_incoming.extend(gained)
        ready_at = max(ready_at, victim.kill_at)
        need -= len(gained)
    if need > 0:
        return None
    return Reclaim(
        free_gpus=chosen_free,
        incoming_gpus=tuple(chosen_incoming),
        victims=tuple(chosen_victims),
        ready_at=ready_at,
    )


def _assemble(
    state: RoundState,
    free: list[int],
    arriving: list[tuple[float, int]],
    victims: Iterable[Victim],
    gpu_count: int,
    node_index: int | None,
    *,
    is_high_class: bool,
) -> Reclaim | None:
    """`_assemble_sorted` with the victims put in victim order here and the GPUs each frees
    (on ``node_index`` only, unless None) counted as the assembly reaches it."""
    ordered = (
        (
            victim,
            tuple(
                g for g in victim.running.gpu_ids if node_index is None or state.gpu_node.get(g) == node_index
            ),
        )
        for victim in sorted(victims, key=lambda v: _victim_order(state, v))
    )
    return _assemble_sorted(state, free, arriving, ordered, gpu_count)
