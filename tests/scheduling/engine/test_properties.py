"""Hypothesis: the engine's invariants (DESIGN §3) over random clusters and workloads.

Every policy, every generated snapshot: no GPU allocated twice, capacity never exceeded, only
preemptible work preempted and only for higher-class demand, minimum runtime respected,
bookings protected, every pending job explained, every idle GPU given exactly one reason,
and the same input gives the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import POLICIES, plan_round
from scheduling.engine.placement import constraint_key, type_satisfies
from scheduling.engine.startability import enforces_guarantees
from scheduling.engine.types import (
    Booking,
    ClusterSnapshot,
    GpuType,
    JobKind,
    JobRequest,
    Node,
    NodeStatus,
    PendingReason,
    Plan,
    PolicyConfig,
    ProjectShare,
    RunningJob,
)

NOW = 100_000.0
TYPES = (
    GpuType("T4", memory_gib=16, precisions=frozenset({"fp16", "fp32"}), value=0.3),
    GpuType("A100", memory_gib=80, precisions=frozenset({"bf16", "fp16", "fp32", "tf32"}), value=1.0),
    GpuType("H100", memory_gib=80, precisions=frozenset({"fp8", "bf16", "fp16", "fp32", "tf32"}), value=2.0),
)
PROJECTS = ("p0", "p1", "p2")


@dataclass(frozen=True)
class Case:
    snapshot: ClusterSnapshot
    policy: PolicyConfig


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A random cluster, running work, queue, bookings, quotas and policy."""
    nodes: list[Node] = []
    gpu = 0
    for i in range(draw(st.integers(1, 6))):
        size = draw(st.sampled_from((1, 2, 4, 8)))
        status = draw(st.sampled_from((NodeStatus.UP,) * 6 + (NodeStatus.DRAINING, NodeStatus.DOWN)))
        gpu_type = draw(st.sampled_from(TYPES)).name
        nodes.append(
            Node(id=f"n{i}", gpu_type=gpu_type, gpu_ids=tuple(range(gpu, gpu + size)), status=status)
        )
        gpu += size
    up_gpus = [g for node in nodes if node.status != NodeStatus.DOWN for g in node.gpu_ids]
    free = list(up_gpus)
    running: list[RunningJob] = []
    for j in range(draw(st.integers(0, 6))):
        if not free:
            break
        count = draw(st.integers(1, min(4, len(free))))
        taken = sorted(draw(st.permutations(free))[:count])
        free = [g for g in free if g not in taken]
        preemptible = draw(st.booleans())
        started = NOW - draw(st.floats(0, 50_000))
        request = _job(draw, f"r{j}", count, kind=JobKind.BATCH, preemptible=preemptible)
        in_grace = preemptible and draw(st.integers(0, 4)) == 0
        running.append(
            RunningJob(
                job=request,
                gpu_ids=tuple(taken),
                started_at=started,
                is_preemptible=preemptible,
                grace_until=NOW + 20 if in_grace else None,
            )
        )
    pending = tuple(
        _job(
            draw,
            f"j{j}",
            draw(st.integers(1, 10)),
            kind=draw(st.sampled_from((JobKind.BATCH,) * 3 + (JobKind.INTERACTIVE,))),
            preemptible=draw(st.booleans()),
        )
        for j in range(draw(st.integers(0, 8)))
    )
    bookings: list[Booking] = []
    booked: list[tuple[float, float, tuple[int, ...]]] = []
    for b in range(draw(st.integers(0, 3))):
        start = NOW + draw(st.floats(-3_000, 20_000))
        end = start + draw(st.floats(600, 10_000))
        fixed = draw(st.booleans()) and bool(up_gpus)
        gpu_ids: tuple[int, ...] = ()
        if fixed:
            candidates = [
                g for g in up_gpus if not any(s < end and start < e and g in ids for s, e, ids in booked)
            ]
            if not candidates:
                continue
            gpu_ids = tuple(
                sorted(draw(st.permutations(candidates))[: draw(st.integers(1, min(4, len(candidates))))])
            )
            booked.append((start, end, gpu_ids))
        bookings.append(
            Booking(
                id=f"b{b}",
                user="v",
                project="p0",
                gpu_count=len(gpu_ids) if gpu_ids else draw(st.integers(1, 4)),
                start_at=start,
                end_at=end,
                gpu_ids=gpu_ids,
                is_in_use=draw(st.booleans()),
            )
        )
    projects = tuple(
        ProjectShare(
            name=name,
            weight=draw(st.floats(0.5, 4)),
            decayed_usage=draw(st.floats(0, 1_000)),
            guaranteed=(("*", draw(st.integers(0, 8))),) if draw(st.booleans()) else (),
            borrow_limit=draw(st.one_of(st.none(), st.integers(0, 16))),
        )
        for name in PROJECTS
    )
    busy_gpus = [g for r in running for g in r.gpu_ids]
    snapshot = ClusterSnapshot(
        cluster="prop",
        gpu_types=TYPES,
        nodes=tuple(nodes),
        running=tuple(running),
        pending=pending,
        bookings=tuple(bookings),
        projects=projects,
        gpus_in_use_idle=frozenset(draw(st.lists(st.sampled_from(busy_gpus), max_size=3)))
        if busy_gpus
        else frozenset(),
    )
    up_ids = [node.id for node in nodes]
    policy = PolicyConfig(
        name=draw(st.sampled_from(POLICIES)),
        grace_s=draw(st.sampled_from((0.0, 30.0, 120.0))),
        min_runtime_s=draw(st.sampled_from((0.0, 300.0, 3_600.0))),
        booking_lead_s=draw(st.sampled_from((0.0, 60.0))),
        interactive_headroom=(("*", draw(st.integers(0, 3))),),
        interactive_partition=tuple(draw(st.lists(st.sampled_from(up_ids), max_size=2, unique=True))),
        backfill_depth=draw(st.sampled_from((1, 3, 1_000))),
    )
    return Case(snapshot, policy)


def _job(draw: st.DrawFn, job_id: str, count: int, *, kind: JobKind, preemptible: bool) -> JobRequest:
    requested = draw(st.one_of(st.none(), st.floats(60, 100_000)))
    p50 = draw(st.one_of(st.none(), st.floats(30, 50_000)))
    return JobRequest(
        id=job_id,
        user=draw(st.sampled_from(("u0", "u1", "u2"))),
        project=draw(st.sampled_from(PROJECTS)),
        gpu_count=count,
        submit_at=NOW - draw(st.floats(0, 100_000)),
        kind=kind,
        gpu_type=draw(st.sampled_from((None, None, None, "T4", "A100", "H100", "B200"))),
        min_memory_gib=draw(st.sampled_from((0.0, 0.0, 40.0))),
        precisions=draw(st.sampled_from((frozenset(), frozenset(), frozenset({"fp8"})))),
        requested_s=requested,
        predicted_p50_s=p50,
        predicted_p90_s=None if p50 is None else p50 * draw(st.floats(1, 4)),
        is_preemptible=preemptible and kind == JobKind.BATCH,
        is_checkpointable=preemptible and draw(st.booleans()),
        checkpoint_interval_s=draw(st.sampled_from((None, 600.0, 1_800.0))),
    )


def _may_claim_quota(snap: ClusterSnapshot, job: JobRequest) -> bool:
    """Whether a batch job's project has a guarantee (its reclaims are higher-class demand)."""
    return any(share.name == job.project and share.guaranteed for share in snap.projects)


def check_invariants(case: Case, plan: Plan) -> None:
    snap = case.snapshot
    policy = case.policy
    node_of = {g: node for node in snap.nodes for g in node.gpu_ids}
    types = {t.name: t for t in snap.gpu_types}
    pending = {job.id: job for job in snap.pending}
    running = {r.job.id: r for r in snap.running}
    busy = {g for r in snap.running for g in r.gpu_ids}
    chosen = {r.holder_id: r.gpu_ids for r in plan.reservations}
    active_booking_gpus = {
        g for b in snap.bookings if b.start_at <= NOW < b.end_at for g in (b.gpu_ids or chosen.get(b.id, ()))
    }

    # starts: distinct jobs from the queue, distinct GPUs, only free GPUs on UP nodes
    started_ids = [s.job_id for s in plan.starts]
    assert len(started_ids) == len(set(started_ids))
    started_gpus: list[int] = [g for s in plan.starts for g in s.gpu_ids]
    assert len(started_gpus) == len(set(started_gpus)), "a GPU was allocated twice"
    assert not set(started_gpus) & busy, "a start uses a running job's GPU"
    assert not set(started_gpus) & active_booking_gpus, "a start uses an active booking's GPU"
    up_free = {g for g, node in node_of.items() if node.status == NodeStatus.UP and g not in busy}
    assert len(started_gpus) <= len(up_free), "capacity exceeded"
    for start in plan.starts:
        job = pending[start.job_id]
        assert len(start.gpu_ids) == job.gpu_count
        nodes = {node_of[g] for g in start.gpu_ids}
        assert all(node.status == NodeStatus.UP for node in nodes)
        (gpu_type,) = {node.gpu_type for node in nodes}
        assert type_satisfies(types[gpu_type], constraint_key(job))
        max_node = max(len(n.gpu_ids) for n in snap.nodes if n.gpu_type == gpu_type)
        if job.gpu_count <= max_node:
            assert len(nodes) == 1, "a gang that fits one node was split"
        if start.is_preemptible and not job.is_preemptible:
            # only the quota makes work preemptible that its owner did not mark so: above its
            # project's guarantee, under a policy that enforces guarantees (Kueue borrowing)
            assert enforces_guarantees(policy.name), "non-preemptible work started as preemptible"
            assert any(
                share.name == job.project
                and (share.guaranteed or share.borrow_limit is not None or share.borrow_limits)
                for share in snap.projects
            ), "non-preemptible work started as preemptible"
        if policy.name == "static" and policy.interactive_partition:
            on_partition = {n.id for n in nodes} <= set(policy.interactive_partition)
            off_partition = not ({n.id for n in nodes} & set(policy.interactive_partition))
            if job.kind == JobKind.INTERACTIVE:
                assert on_partition
            elif not off_partition:
                # only a job that no set of up batch-side nodes could ever hold may span the partition
                batch_sizes = [
                    len(n.gpu_ids)
                    for n in snap.nodes
                    if n.status == NodeStatus.UP
                    and n.id not in policy.interactive_partition
                    and type_satisfies(types[n.gpu_type], constraint_key(job))
                ]
                if len(nodes) == 1:
                    assert all(size < job.gpu_count for size in batch_sizes), "batch job on the partition"
                else:
                    assert sum(batch_sizes) < job.gpu_count, "batch job on the partition"
        # a booking's fixed GPUs are given only to work that leaves them in time
        for booking in snap.bookings:
            if booking.start_at <= NOW or not set(booking.gpu_ids) & set(start.gpu_ids):
                continue
            need_at = booking.start_at - policy.booking_lead_s
            if start.is_preemptible:
                assert NOW + policy.min_runtime_s + policy.grace_s <= need_at + 1e-6
            else:
                assert start.expected_end_at <= need_at + 1e-6

    # preemptions: berth only, lent work only, once, for higher-class demand, after min runtime
    if policy.name != "berth":
        assert plan.preemptions == ()
    demand_ids = {b.id for b in snap.bookings} | set(pending)
    victims = [p.job_id for p in plan.preemptions]
    assert len(victims) == len(set(victims))
    reasons = {e.job_id: e.reason for e in plan.pending}
    for preemption in plan.preemptions:
        victim = running[preemption.job_id]
        assert victim.is_preemptible or victim.job.is_preemptible, "work without consent preempted"
        assert victim.grace_until is None, "a job in grace was signalled again"
        assert preemption.signal_at == NOW
        # sessions, bookings and quota claims wait at most the grace; a batch job suspending
        # another waits the whole minimum runtime
        is_batch_for_batch = preemption.for_id in pending and pending[preemption.for_id].kind == JobKind.BATCH
        floor = policy.min_runtime_s if is_batch_for_batch else min(policy.min_runtime_s, policy.grace_s)
        if is_batch_for_batch and _may_claim_quota(snap, pending[preemption.for_id]):
            floor = min(policy.min_runtime_s, policy.grace_s)
        assert preemption.kill_at >= victim.started_at + floor - 1e-6
        assert preemption.kill_at >= preemption.signal_at + policy.grace_s - 1e-6
        assert preemption.for_id in demand_ids
        if preemption.for_id in pending:
            assert reasons[preemption.for_id] == PendingReason.PREEMPTING
        assert preemption.reason

    # berth: lent work on a booking's GPUs is signalled in time for the booking
    if policy.name == "berth":
        for booking in snap.bookings:
            signal_due = booking.start_at - policy.booking_lead_s - policy.grace_s
            if not booking.gpu_ids or booking.end_at <= NOW or signal_due > NOW:
                continue
            for r in snap.running:
                if set(r.gpu_ids) & set(booking.gpu_ids) and r.is_preemptible and r.grace_until is None:
                    (preemption,) = [p for p in plan.preemptions if p.job_id == r.job.id]
                    need_at = booking.start_at - policy.booking_lead_s
                    if r.started_at + policy.min_runtime_s <= need_at and signal_due >= NOW:
                        assert preemption.kill_at <= need_at + 1e-6, "booking GPUs not back by its start"

    # explanations: exactly the jobs not started, each with a sentence; p50 <= p90
    explained = [e.job_id for e in plan.pending]
    assert sorted(explained) == sorted(set(pending) - set(started_ids))
    for explanation in plan.pending:
        assert explanation.sentence
        if explanation.eta_p50_at is not None and explanation.eta_p90_at is not None:
            assert explanation.eta_p50_at <= explanation.eta_p90_at + 1e-6

    # idle: one reason per GPU; idle + busy = total
    idle_gpus = [g for g, _reason in plan.idle]
    assert len(idle_gpus) == len(set(idle_gpus)), "a GPU has two idle reasons"
    booking_gpus = {r.holder_id: r.gpu_ids for r in plan.reservations}
    in_use_booking = {
        g
        for b in snap.bookings
        if b.start_at <= NOW < b.end_at and b.is_in_use
        for g in (b.gpu_ids or booking_gpus.get(b.id, ()))
    } - busy
    working = (busy | set(started_gpus) | in_use_booking) - set(snap.gpus_in_use_idle & busy)
    assert not set(idle_gpus) & working
    assert len(idle_gpus) + len(working) == len(node_of)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_plans_keep_the_invariants(case: Case) -> None:
    plan = plan_round(case.snapshot, case.policy, NOW)
    check_invariants(case, plan)
    assert plan_round(case.snapshot, case.policy, NOW) == plan, "not deterministic"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_policy_keeps_the_invariants_on_the_same_input(case: Case) -> None:
    for name in POLICIES:
        policy = PolicyConfig(
            **{**{f: getattr(case.policy, f) for f in PolicyConfig.__slots__}, "name": name}
        )
        check_invariants(Case(case.snapshot, policy), plan_round(case.snapshot, policy, NOW))
