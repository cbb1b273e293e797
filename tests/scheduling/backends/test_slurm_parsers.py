"""Slurm backend parsers on recorded slurmrestd v0.0.38 answers (no Slurm needed).

The answers in ``data/`` were recorded from the project's single-host Slurm by ``data/record_slurm.py``:
n1-n2 with 4x a100, n3-n4 with 8x h100, n2 drained; Berth jobs in every state plus one job that is not
Berth's (``other-job``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from scheduling.backends.base import BackendError, ObservedState
from scheduling.backends.slurm import (
    SIGNAL_MARK,
    SlurmConfig,
    SlurmJobPayload,
    SlurmRejectedError,
    berth_jobs,
    check_errors,
    expand_hostlist,
    gpu_id_table,
    job_state,
    load_json,
    node_status,
    parse_gres,
    parse_index_list,
    parse_jobs,
    parse_nodes,
    reservation_name,
    signalled_at,
    tres_gpu_types,
)
from scheduling.engine.types import NodeStatus

Read = Callable[[str], str]


def test_nodes_inventory_types_counts_and_ids(slurm_data: Read) -> None:
    inv = parse_nodes(slurm_data("slurm_nodes.json"))
    by_id = {n.id: n for n in inv.nodes}
    assert [n.id for n in inv.nodes] == ["n1", "n2", "n3", "n4"]
    assert {k: (n.gpu_type, len(n.gpu_ids)) for k, n in by_id.items()} == {
        "n1": ("a100", 4),
        "n2": ("a100", 4),
        "n3": ("h100", 8),
        "n4": ("h100", 8),
    }
    all_ids = [g for n in inv.nodes for g in n.gpu_ids]
    assert len(all_ids) == len(set(all_ids)) == 24
    # Consecutive by node order: a GPU id names (node, GRES index) and back.
    assert inv.node_of_gpu(by_id["n3"].gpu_ids[5]) == ("n3", 5)
    assert by_id["n2"].status is NodeStatus.DRAINING
    assert {by_id[n].status for n in ("n1", "n3", "n4")} == {NodeStatus.UP}  # idle and mixed


def test_nodes_down_and_not_responding(slurm_data: Read) -> None:
    # The recorded answer with n4 edited to how a dead slurmd looks (not provoked live: it takes
    # SlurmdTimeout to happen).
    data = json.loads(slurm_data("slurm_nodes.json"))
    for raw in data["nodes"]:
        if raw["name"] == "n4":
            raw["state"], raw["state_flags"] = "down", ["NOT_RESPONDING"]
    inv = parse_nodes(json.dumps(data))
    assert {n.id: n.status for n in inv.nodes}["n4"] is NodeStatus.DOWN


@pytest.mark.parametrize(
    ("state", "flags", "expected"),
    [
        ("idle", [], NodeStatus.UP),
        ("mixed", [], NodeStatus.UP),
        ("allocated", [], NodeStatus.UP),
        ("idle", ["DRAIN"], NodeStatus.DRAINING),
        ("mixed", ["DRAIN"], NodeStatus.DRAINING),  # draining: jobs still running
        ("drained", [], NodeStatus.DRAINING),
        ("down", [], NodeStatus.DOWN),
        ("idle", ["NOT_RESPONDING"], NodeStatus.DOWN),
        ("down", ["DRAIN"], NodeStatus.DOWN),  # down wins over drain
    ],
)
def test_node_status(state: str, flags: list[str], expected: NodeStatus) -> None:
    assert node_status(state, flags) is expected


def test_gpu_ids_explicit_mapping_wins(slurm_data: Read) -> None:
    explicit = {
        "n1": (100, 101, 102, 103),
        "n2": (200, 201, 202, 203),
        "n3": tuple(range(300, 308)),
        "n4": tuple(range(400, 408)),
    }
    inv = parse_nodes(slurm_data("slurm_nodes.json"), gpu_ids=explicit)
    assert {n.id: n.gpu_ids for n in inv.nodes} == explicit
    jobs = {
        j.job_id: j for j in parse_jobs(slurm_data("slurm_jobs.json"), prefix="berth-", gpu_ids=inv.gpu_ids)
    }
    assert jobs["run1"].gpu_ids == (300, 301)


def test_gpu_ids_partial_mapping_numbers_the_rest_above_it(slurm_data: Read) -> None:
    inv = parse_nodes(
        slurm_data("slurm_nodes.json"), gpu_ids={"n3": (7, 8, 9, 10, 11, 12, 13, 14), "n1": (1, 2)}
    )
    ids = {n.id: n.gpu_ids for n in inv.nodes}
    assert ids["n3"] == (7, 8, 9, 10, 11, 12, 13, 14)
    assert ids["n1"] == (1, 2)  # only 2 of its 4 GPUs are Berth's
    assert ids["n2"] == (15, 16, 17, 18)  # above the highest configured id
    assert ids["n4"] == tuple(range(19, 27))
    jobs = {
        j.job_id: j for j in parse_jobs(slurm_data("slurm_jobs.json"), prefix="berth-", gpu_ids=inv.gpu_ids)
    }
    assert jobs["multi1"].gpu_ids == (9, 19)  # n3 IDX:2, n4 IDX:0


def test_gpu_types_are_renamed_for_berth(slurm_data: Read) -> None:
    inv = parse_nodes(slurm_data("slurm_nodes.json"), gpu_types={"a100": "A100-80GB"})
    assert {n.id: n.gpu_type for n in inv.nodes} == {
        "n1": "A100-80GB",
        "n2": "A100-80GB",
        "n3": "h100",
        "n4": "h100",
    }
    assert inv.gres_types["n1"] == "a100"  # what a submission asks Slurm for


def test_gpu_id_enumeration_is_natural_and_independent_of_input_order() -> None:
    a = gpu_id_table({"n10": 2, "n2": 1, "n1": 2})
    b = gpu_id_table({"n1": 2, "n2": 1, "n10": 2})
    assert a == b == {"n1": (0, 1), "n2": (2,), "n10": (3, 4)}


def test_jobs_states_gpus_and_times(slurm_data: Read) -> None:
    inv = parse_nodes(slurm_data("slurm_nodes.json"))
    n3 = inv.gpu_ids["n3"]
    n4 = inv.gpu_ids["n4"]
    jobs = {
        j.job_id: j for j in parse_jobs(slurm_data("slurm_jobs.json"), prefix="berth-", gpu_ids=inv.gpu_ids)
    }
    assert set(jobs) == {"done1", "fail1", "run1", "multi1", "canc1", "pre1", "pend1"}  # not other-job
    assert {k: j.state for k, j in jobs.items()} == {
        "done1": ObservedState.COMPLETED,
        "fail1": ObservedState.FAILED,
        "run1": ObservedState.RUNNING,
        "multi1": ObservedState.RUNNING,
        "canc1": ObservedState.CANCELLED,
        "pre1": ObservedState.PREEMPTED,  # requeuehold: held for Berth
        "pend1": ObservedState.PENDING,
    }
    # gres_detail gpu:h100:2(IDX:0-1) on n3; the 2-node job has IDX:2 on n3 and IDX:0 on n4.
    assert jobs["run1"].gpu_ids == (n3[0], n3[1])
    assert jobs["multi1"].gpu_ids == (n3[2], n4[0])
    assert jobs["run1"].backend_ref == "3"
    running = jobs["run1"]
    assert running.started_at is not None
    assert running.ended_at is None
    done = jobs["done1"]
    assert done.started_at is not None
    assert done.ended_at is not None
    assert done.ended_at >= done.started_at
    # Pending jobs carry an *expected* start in start_time: not reported as started.
    assert jobs["pend1"].started_at is None
    assert jobs["pend1"].gpu_ids == ()
    assert jobs["pre1"].started_at is None
    assert jobs["pre1"].gpu_ids == ()
    assert "restarts=1" in jobs["pre1"].message


@pytest.mark.parametrize(
    ("slurm", "reason", "expected"),
    [
        ("PENDING", "Resources", ObservedState.PENDING),
        ("PENDING", "JobHeldUser", ObservedState.PREEMPTED),
        ("COMPLETING", "JobHeldAdmin", ObservedState.PREEMPTED),  # requeue in progress
        ("RUNNING", "None", ObservedState.RUNNING),
        ("COMPLETING", "None", ObservedState.RUNNING),  # GPUs not free yet
        ("COMPLETED", "None", ObservedState.COMPLETED),
        ("FAILED", "NonZeroExitCode", ObservedState.FAILED),
        ("TIMEOUT", "TimeLimit", ObservedState.FAILED),
        ("CANCELLED", "None", ObservedState.CANCELLED),
        ("PREEMPTED", "None", ObservedState.PREEMPTED),
        ("REQUEUED", "None", ObservedState.PREEMPTED),
        ("NODE_FAIL", "None", ObservedState.LOST),
        ("SOMETHING_NEW", "None", ObservedState.LOST),
    ],
)
def test_job_state_mapping(slurm: str, reason: str, expected: ObservedState) -> None:
    assert job_state({"job_state": slurm, "state_reason": reason}) is expected


def test_berth_jobs_prefers_the_live_then_the_newest_job() -> None:
    raw = [
        {"job_id": 5, "name": "berth-a", "job_state": "CANCELLED"},
        {"job_id": 3, "name": "berth-a", "job_state": "RUNNING"},
        {"job_id": 7, "name": "berth-b", "job_state": "FAILED"},
        {"job_id": 9, "name": "berth-b", "job_state": "COMPLETED"},
        {"job_id": 11, "name": "berth-", "job_state": "RUNNING"},  # no id after the prefix
        {"job_id": 12, "name": "mine", "job_state": "RUNNING"},
    ]
    chosen = berth_jobs(raw, prefix="berth-")
    assert {k: v["job_id"] for k, v in chosen.items()} == {"a": 3, "b": 9}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("n1", ["n1"]),
        ("n[3-4]", ["n3", "n4"]),
        ("n[1-2,5],gpu-a[08-10]", ["n1", "n2", "n5", "gpu-a08", "gpu-a09", "gpu-a10"]),
        ("", []),
        ("(null)", []),
        ("gpu[1-2]-ib[0-1]", ["gpu1-ib0", "gpu1-ib1", "gpu2-ib0", "gpu2-ib1"]),  # two ranges in one name
    ],
)
def test_expand_hostlist(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


def test_unreadable_hostlist_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="host list"):
        expand_hostlist("n[3-")


def test_parse_gres_forms() -> None:
    assert parse_gres("gpu:a100:4") == [("gpu", "a100", 4, ())]
    assert parse_gres("gpu:h100:2(IDX:0-1)") == [("gpu", "h100", 2, (0, 1))]
    assert parse_gres("gpu:a100:0(IDX:N/A)") == [("gpu", "a100", 0, ())]
    assert parse_gres("gpu:4(S:0-1),shard:8") == [("gpu", "", 4, ()), ("shard", "", 8, ())]
    assert parse_gres("gpu:v100:1(IDX:0,2-3)") == [("gpu", "v100", 1, (0, 2, 3))]
    assert parse_gres("(null)") == []
    assert parse_index_list("N/A") == ()
    assert tres_gpu_types("gres:gpu:a100:2") == {"a100"}
    assert tres_gpu_types("gres/gpu:h100=1,gres/shard=2") == {"h100"}


def test_errors_array_rejection_vs_unreachable(slurm_data: Read) -> None:
    with pytest.raises(SlurmRejectedError, match="no_such_key"):
        load_json(slurm_data("slurm_submit_rejected.json"), doing="submit")
    with pytest.raises(BackendError, match="Failed while looking for jobs") as info:
        load_json(slurm_data("slurm_jobs_controller_down.json"), doing="list jobs")
    assert not isinstance(info.value, SlurmRejectedError)  # the controller is away: not a refusal
    with pytest.raises(BackendError, match="not JSON"):
        load_json("Authentication failure", doing="list jobs")
    check_errors({"errors": []}, doing="ok")  # empty is fine


def test_signal_mark_belongs_to_the_current_run() -> None:
    assert signalled_at({"comment": f"{SIGNAL_MARK}1000", "start_time": 900}) == 1000.0
    # Slurm requeued and restarted the job after the mark: the new run was never signalled.
    assert signalled_at({"comment": f"{SIGNAL_MARK}1000", "start_time": 1100}) is None
    assert signalled_at({"comment": "", "start_time": 900}) is None


def test_payload_from_mapping() -> None:
    p = SlurmJobPayload.from_mapping({"command": "python train.py", "time_limit_s": 120})
    assert p.script.startswith("#!/bin/bash\n")
    assert "python train.py" in p.script
    assert p.time_limit_s == 120
    with pytest.raises(SlurmRejectedError):
        SlurmJobPayload.from_mapping({"environment": {}})
    # The portal's job API: blank script, a command, ``env``, plus keys the backend does not use.
    portal = SlurmJobPayload.from_mapping(
        {"script": "", "command": "echo hi", "env": {"A": "1"}, "attempt": 2}
    )
    assert "echo hi" in portal.script
    assert portal.environment == {"A": "1"}
    assert SlurmJobPayload.from_mapping({"script": "echo x"}).script == "#!/bin/bash\necho x"
    assert SlurmJobPayload.from_mapping({"command": "x", "time_limit_s": "90"}).time_limit_s == 90
    for bad in ({"time_limit_s": "soon"}, {"cpus_per_task": 0}, {"environment": ["A=1"]}):
        with pytest.raises(SlurmRejectedError):
            SlurmJobPayload.from_mapping({"command": "x", **bad})


def test_config_from_env_and_reservation_names() -> None:
    cfg = SlurmConfig.from_env(
        {"BERTH_SLURMRESTD_URL": "http://127.0.0.1:1", "BERTH_SLURM_USER": "svc", "BERTH_SLURM_DRY_RUN": "1"}
    )
    assert (cfg.url, cfg.user, cfg.token, cfg.dry_run) == ("http://127.0.0.1:1", "svc", None, True)
    assert SlurmConfig.from_env({}).dry_run is False
    assert reservation_name("booking 7/a=b", prefix="berth-") == "berth-booking_7_a_b"
