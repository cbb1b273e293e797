"""`engine.startability`: which jobs can never start, and the idle GPUs their quota explains."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine import plan_round
from scheduling.engine.startability import never_startable, unstartable_jobs
from scheduling.engine.types import (
    GpuType,
    IdleReason,
    NodeStatus,
    PendingReason,
    PolicyConfig,
    ProjectShare,
)
from tests.scheduling.engine.conftest import job, make_nodes, running, snapshot

NOW = 1_000_000.0
TYPES = (GpuType("V100M32", memory_gib=32.0), GpuType("A100", memory_gib=80.0))


def _inventory() -> tuple:
    return make_nodes(2, 4, gpu_type="V100M32") + make_nodes(2, 8, gpu_type="A100", first_gpu=8, prefix="a")


def _check(request, share, *, enforced: bool = True, nodes=None):
    return never_startable(
        request,
        gpu_types=TYPES,
        nodes=_inventory() if nodes is None else nodes,
        share=share,
        is_guarantee_enforced=enforced,
    )


def test_a_job_above_its_types_guarantee_and_borrowing_limit_can_never_start() -> None:
    share = ProjectShare("climate", guaranteed=(("V100M32", 0), ("A100", 4)), borrow_limits=(("V100M32", 0),))
    verdict = _check(job("era5", 2, project="climate", gpu_type="V100M32"), share)
    assert verdict is not None
    assert verdict.reason == PendingReason.QUOTA
    assert verdict.sentence.startswith("Cannot start:")
    assert "guaranteed 0 V100M32" in verdict.sentence
    assert "borrowing limit" in verdict.unblock
    assert "ask an admin" in verdict.unblock
    # preemptible or not, it cannot borrow past the limit, under every policy
    assert (
        _check(job("era5", 2, project="climate", gpu_type="V100M32", is_preemptible=True), share) is not None
    )
    assert _check(job("era5", 2, project="climate", gpu_type="V100M32"), share, enforced=False) is not None
    # what unblocks it does unblock it: a guarantee or a borrowing limit that covers it
    raised = ProjectShare("climate", guaranteed=(("V100M32", 2),), borrow_limits=(("V100M32", 0),))
    assert _check(job("era5", 2, project="climate", gpu_type="V100M32"), raised) is None
    borrowing = ProjectShare("climate", guaranteed=(("V100M32", 0),), borrow_limits=(("V100M32", 2),))
    assert _check(job("era5", 2, project="climate", gpu_type="V100M32"), borrowing) is None
    # another fitting type with room: not hopeless
    assert _check(job("era5", 2, project="climate", min_memory_gib=16.0), share) is None


def test_a_non_preemptible_job_above_its_guarantee_is_startable_it_borrows() -> None:
    """Kueue semantics: being above the guarantee is not a verdict, the job borrows."""
    share = ProjectShare("climate", guaranteed=(("V100M32", 0), ("A100", 4)), borrow_limit=8)
    assert _check(job("era5", 2, project="climate", gpu_type="V100M32"), share) is None


def test_a_guarantee_in_use_is_not_never_startable() -> None:
    # guaranteed 2 but busy right now: it waits (with an ETA), it is not hopeless
    share = ProjectShare("p", guaranteed=(("A100", 2),), borrow_limit=0)
    assert _check(job("j", 2, gpu_type="A100"), share) is None
    # an unconstrained job may use any type whose guarantee covers it
    assert _check(job("j", 2), share) is None
    assert _check(job("j", 3), share) is not None


def test_inventory_and_limit_verdicts() -> None:
    big = _check(job("j", 17, gpu_type="A100"), None)
    assert big is not None
    assert big.reason == PendingReason.CONSTRAINT
    assert "at most 16" in big.unblock
    # nodes that are down do not count
    nodes = tuple(
        n if n.gpu_type != "V100M32" else type(n)(n.id, n.gpu_type, n.gpu_ids, NodeStatus.DOWN)
        for n in _inventory()
    )
    down = _check(job("j", 1, gpu_type="V100M32"), None, nodes=nodes)
    assert down is not None
    assert down.reason == PendingReason.CONSTRAINT
    assert _check(job("j", 1, gpu_type="V100M32"), None) is None
    limited = ProjectShare("p", guaranteed=(("A100", 1),), borrow_limit=2)
    over = _check(job("j", 4, gpu_type="A100", is_preemptible=True), limited)
    assert over is not None
    assert "at most 3 GPUs" in over.sentence


def test_unstartable_jobs_matches_the_engine_which_never_starts_them() -> None:
    """Whatever the verdict says can never start, the engine does not start on an empty cluster."""
    shares = (
        ProjectShare(
            "climate",
            guaranteed=(("V100M32", 0), ("A100", 2)),
            borrow_limit=8,
            borrow_limits=(("V100M32", 1),),
        ),
    )
    pending = [
        job("era5", 2, project="climate", gpu_type="V100M32"),
        job("ok", 2, project="climate", gpu_type="A100"),
        job("borrowing", 1, project="climate", gpu_type="V100M32"),
        job("lent", 2, project="climate", gpu_type="A100", is_preemptible=True),
    ]
    snap = snapshot(_inventory(), pending=pending, projects=shares, gpu_types=TYPES)
    never = unstartable_jobs(snap, pending, is_guarantee_enforced=True)
    assert set(never) == {"era5"}
    for name in ("berth", "easy"):
        plan = plan_round(snap, PolicyConfig(name=name), NOW)
        starts = {s.job_id: s for s in plan.starts}
        assert "era5" not in starts
        assert {"ok", "lent", "borrowing"} <= set(starts)
        if name == "berth":
            # above its guarantee of 0 V100M32 it runs as borrowed, preemptible work
            assert starts["borrowing"].is_preemptible
            assert not starts["ok"].is_preemptible


def test_quota_blocked_idle_gpus_are_only_as_many_as_the_blocked_jobs_could_use() -> None:
    shares = (
        ProjectShare(
            "climate",
            guaranteed=(("V100M32", 1), ("A100", 0)),
            borrow_limit=16,
            borrow_limits=(("V100M32", 1),),
        ),
    )
    busy = running(job("r", 2, project="climate", gpu_type="V100M32", requested_s=50_000), (0, 1))
    pending = [job("era5", 2, project="climate", gpu_type="V100M32")]
    snap = snapshot(_inventory(), running_jobs=[busy], pending=pending, projects=shares, gpu_types=TYPES)
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    # the project runs 2 = guarantee 1 + borrowing 1 V100M32: era5 waits on its quota
    assert {p.job_id: p.reason for p in plan.pending}["era5"] == PendingReason.QUOTA
    idle = Counter(reason for _gpu, reason in plan.idle)
    assert idle[IdleReason.QUOTA_BLOCKED] == 2  # the job's 2 GPUs, not all 6 idle V100M32
    assert (
        idle[IdleReason.QUOTA_BLOCKED] + idle[IdleReason.NO_DEMAND] + idle[IdleReason.CONSTRAINT_MISMATCH]
        == 22
    )
    blocked_types = {
        n.gpu_type for n in snap.nodes for g in n.gpu_ids if (g, IdleReason.QUOTA_BLOCKED) in plan.idle
    }
    assert blocked_types == {"V100M32"}


@settings(max_examples=60, deadline=None)
@given(
    guarantee=st.integers(0, 6),
    count=st.integers(1, 9),
    is_preemptible=st.booleans(),
    borrow=st.one_of(st.none(), st.integers(0, 8)),
    type_borrow=st.one_of(st.none(), st.integers(0, 8)),
)
def test_never_startable_jobs_never_start_even_on_an_empty_cluster(
    guarantee: int, count: int, is_preemptible: bool, borrow: int | None, type_borrow: int | None
) -> None:
    limits = () if type_borrow is None else (("A100", type_borrow),)
    shares = (
        ProjectShare("p", guaranteed=(("A100", guarantee),), borrow_limit=borrow, borrow_limits=limits),
    )
    request = job("j", count, gpu_type="A100", is_preemptible=is_preemptible)
    snap = snapshot(_inventory(), pending=[request], projects=shares, gpu_types=TYPES)
    never = unstartable_jobs(snap, [request], is_guarantee_enforced=True)
    plan = plan_round(snap, PolicyConfig(name="berth"), NOW)
    starts = {s.job_id for s in plan.starts}
    if "j" in never:
        assert "j" not in starts
    else:
        assert "j" in starts  # the verdict is not over-cautious on an empty cluster


def test_the_engine_explains_a_never_startable_job_with_the_verdict_and_no_eta() -> None:
    """The plan's own explanation (what the portal stores and the replay reads) is the
    startability verdict, with no ETA, under every policy that can never start the job."""
    shares = (
        ProjectShare(
            "climate",
            guaranteed=(("V100M32", 0), ("A100", 2)),
            borrow_limit=8,
            borrow_limits=(("V100M32", 0),),
        ),
    )
    pending = [
        job("era5", 2, project="climate", gpu_type="V100M32"),  # no V100M32 even by borrowing
        job("wide", 12, project="climate", gpu_type="A100"),  # every policy: over the limit
    ]
    snap = snapshot(_inventory(), pending=pending, projects=shares, gpu_types=TYPES)
    berth = {p.job_id: p for p in plan_round(snap, PolicyConfig(name="berth"), NOW).pending}
    assert berth["era5"].reason == PendingReason.QUOTA
    assert berth["era5"].sentence.startswith("Cannot start:")
    assert "borrowing limit" in berth["era5"].sentence
    assert berth["era5"].eta_p50_at is None
    assert berth["era5"].eta_p90_at is None
    for name in ("easy", "fifo", "berth"):
        wide = {p.job_id: p for p in plan_round(snap, PolicyConfig(name=name), NOW).pending}["wide"]
        assert wide.sentence.startswith("Cannot start:"), name
        assert wide.eta_p50_at is None, name
