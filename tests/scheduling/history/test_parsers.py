"""History parsers on string fixtures: sacct --parsable2, SWF and the shared trace CSV."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduling.history.parsers import (
    gpus_from_tres,
    parse_sacct,
    parse_swf,
    parse_trace_csv,
    slurm_duration_s,
)

SACCT = """\
JobID|JobName|User|Account|Partition|Submit|Start|End|Timelimit|State|ExitCode|AllocTRES|ReqTRES
101|train|ada|vision|gpu|2026-11-30T10:00:00|2026-11-30T10:05:00|2026-11-30T11:05:00|02:00:00|COMPLETED|0:0|billing=2,cpu=2,gres/gpu:a100=2,gres/gpu=2,mem=8G,node=1|cpu=2,gres/gpu:a100=2
101.batch|batch|||||2026-11-30T10:05:00|2026-11-30T11:05:00||COMPLETED|0:0|cpu=2,gres/gpu:a100=2|
102|eval|grace|language|gpu|2026-11-30T12:00:00|2026-11-30T12:00:01|2026-11-30T12:00:31|1-00:00:00|FAILED|1:0|cpu=1,gres/gpu=1,node=1|
103|cpu-only|ada|vision|cpu|2026-11-30T12:00:00|2026-11-30T12:00:01|2026-11-30T12:10:00|10:00|COMPLETED|0:0|cpu=4,mem=1G,node=1|
104|queued|ada|vision|gpu|2026-11-30T13:00:00|Unknown|Unknown|UNLIMITED|PENDING|0:0||gres/gpu:a100=8
105|stopped|ada|vision|gpu|2026-11-30T13:00:00|2026-11-30T13:01:00|2026-11-30T13:31:00|Partition_Limit|CANCELLED by 0|0:15|gres/gpu:h100=4|
106|never|ada|vision|gpu|2026-11-30T13:00:00|None|2026-11-30T13:02:00|01:00:00|CANCELLED by 0|0:0||gres/gpu=1
107|oom|ada|vision|gpu|2026-11-30T14:00:00|2026-11-30T14:00:00|2026-11-30T14:20:00|30|OUT_OF_MEMORY|0:125|gres/gpu:a100=1|
"""  # noqa: E501 (sacct rows are long)


def test_sacct_fields_and_skips() -> None:
    parsed = parse_sacct(SACCT, zone=ZoneInfo("Europe/Berlin"))

    by_id = {r.external_id: r for r in parsed.records}
    assert sorted(by_id) == ["101", "102", "105", "107"]
    first = by_id["101"]
    assert (first.user, first.account, first.name, first.gpu_count, first.gpu_type) == (
        "ada", "vision", "train", 2, "a100"
    )  # fmt: skip
    assert first.started_at == datetime(2026, 11, 30, 9, 5, tzinfo=UTC)  # Berlin is UTC+1
    assert first.ended_at - first.started_at == timedelta(hours=1)
    assert (first.requested_s, first.status, first.exit_code) == (7200, "completed", 0)
    assert (by_id["102"].gpu_type, by_id["102"].status, by_id["102"].requested_s) == ("", "failed", 86400)
    assert by_id["105"].status == "cancelled"
    assert by_id["105"].requested_s is None
    assert by_id["107"].status == "failed"
    assert by_id["107"].requested_s == 1800
    reasons = {s.external_id: s.reason for s in parsed.skips}
    assert reasons["101.batch"].startswith("job step")
    assert reasons["103"] == "no GPUs (CPU-only job)"
    assert reasons["104"] == "not finished (PENDING)"
    assert reasons["106"] == "never started"
    assert {s.line for s in parsed.skips} == {3, 5, 6, 8}


def test_sacct_needs_its_header() -> None:
    with pytest.raises(ValueError, match="header"):
        parse_sacct("101|train|ada\n")
    assert parse_sacct("").records == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cpu=2,gres/gpu:a100=2,gres/gpu=2", (2, "a100")),
        ("gres/gpu=4,mem=1G", (4, "")),
        ("gres/gpu:a100=2,gres/gpu:t4=1", (3, "")),  # mixed types: count them, type unknown
        ("gpu:tesla:2(IDX:0-1)", (2, "tesla")),  # AllocGRES form
        ("cpu=4,mem=1G", None),
    ],
)
def test_gpus_from_tres(text: str, expected: tuple[int, str] | None) -> None:
    assert gpus_from_tres(text) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("02:00:00", 7200),
        ("1-00:00:00", 86400),
        ("10:00", 600),
        ("30", 1800),
        ("UNLIMITED", None),
        ("", None),
    ],
)
def test_slurm_durations(text: str, seconds: int | None) -> None:
    assert slurm_duration_s(text) == seconds


SWF = """\
; Version: 2.2
; UnixStartTime: 844072681
    1      0    10   3600   4  -1 -1   4  7200 -1  1  3  7 -1 1 -1 -1 -1
    2     60     5     30   1  -1 -1   1   600 -1  0  4  7 -1 1 -1 -1 -1
    3    120    -1     -1   2  -1 -1   2   600 -1  5  4  7 -1 1 -1 -1 -1
    4    180     0    100  -1  -1 -1  -1   600 -1  1  4  7 -1 1 -1 -1 -1
    5    200 bad
"""


def test_swf() -> None:
    parsed = parse_swf(SWF)
    start = datetime.fromtimestamp(844072681, UTC)
    [one, two] = parsed.records
    assert (one.user, one.account, one.gpu_count, one.requested_s, one.status) == (
        "u3",
        "g7",
        4,
        7200,
        "completed",
    )
    assert one.started_at == start + timedelta(seconds=10)
    assert one.ended_at == start + timedelta(seconds=3610)
    assert two.status == "failed"
    assert [(s.external_id, s.reason) for s in parsed.skips] == [
        ("3", "never started (no wait or run time)"),
        ("4", "no processors"),
        ("5", "not an SWF record (needs 18 fields)"),
    ]


def test_swf_without_an_epoch_is_an_error() -> None:
    with pytest.raises(ValueError, match="epoch"):
        parse_swf("1 0 10 3600 4 -1 -1 4 7200 -1 1 3 7 -1 1 -1 -1 -1\n")


TRACE = """\
job_id,user,group,submit_time,start_time,end_time,num_gpus,gpu_type,status,requested_time
j1,u1,g1,0,60,3660,2,A100,completed,7200
j2,u2,g1,10,,,1,,killed,
j3,u1,g2,20,30,40,1,,killed,
j4,u1,g2,20,30,40,0,,completed,
"""


def test_trace_csv() -> None:
    epoch = datetime(2026, 1, 1, tzinfo=UTC)
    parsed = parse_trace_csv(TRACE, epoch=epoch)
    [j1, j3] = parsed.records
    assert (j1.user, j1.account, j1.gpu_type, j1.gpu_count, j1.requested_s) == ("u1", "g1", "A100", 2, 7200)
    assert j1.started_at == epoch + timedelta(seconds=60)
    assert j3.status == "cancelled"
    assert [(s.external_id, s.reason) for s in parsed.skips] == [("j2", "never started"), ("j4", "no GPUs")]
    with pytest.raises(ValueError, match="missing column"):
        parse_trace_csv("a,b\n1,2\n", epoch=epoch)


def test_scontrol_show_job_lines_captured_from_the_real_slurm() -> None:
    """``scontrol show job -o`` of three jobs run on scripts/slurm.sh's Slurm (a100, h100, CPU-only)."""
    from pathlib import Path

    from scheduling.history.parsers import parse_scontrol

    parsed = parse_scontrol((Path(__file__).parent / "scontrol_show_job.txt").read_text())
    [a100, h100] = parsed.records
    assert (a100.user, a100.account, a100.name, a100.gpu_count, a100.gpu_type) == (
        "berth",
        "",
        "train-a100",
        2,
        "a100",
    )
    assert (a100.status, a100.exit_code, a100.requested_s) == ("completed", 0, 600)
    assert (a100.ended_at - a100.started_at).total_seconds() == 3
    assert (h100.gpu_count, h100.gpu_type, h100.status, h100.exit_code) == (4, "h100", "failed", 3)
    assert [s.reason for s in parsed.skips] == ["no GPUs (CPU-only job)"]


def test_slurmdb_jobs_captured_from_the_real_slurmrestd() -> None:
    """``GET /slurmdb/v0.0.38/jobs`` of five jobs run on scripts/slurm.sh's Slurm with slurmdbd: jobs 1-4
    by a uid without an association (user and account null), job 5 with ``-A histlab`` after
    ``sacctmgr add user berth account=histlab``.  Job 2 exited 3 and job 5 exited 5 (sacct: ``3:0``,
    ``5:0``), yet 22.05's dumper says ``SUCCESS``/0 for both: the code comes only from ``known``."""
    import json
    from pathlib import Path

    from scheduling.history.parsers import parse_slurmdb_jobs

    answer = json.loads((Path(__file__).parent / "slurmdb_jobs.json").read_text())
    parsed = parse_slurmdb_jobs(answer["jobs"])
    by_id = {r.external_id: r for r in parsed.records}
    assert sorted(by_id) == ["1", "2", "4", "5"]
    assert [(s.external_id, s.reason) for s in parsed.skips] == [("3", "no GPUs (CPU-only job)")]
    one, two, four, five = by_id["1"], by_id["2"], by_id["4"], by_id["5"]
    assert (one.source, one.user, one.account, one.name, one.gpu_count, one.gpu_type) == (
        "sacct", "", "", "probe", 2, "a100",
    )  # fmt: skip
    assert (one.status, one.exit_code, one.requested_s) == ("completed", 0, 600)
    assert (one.ended_at - one.started_at).total_seconds() == 3
    assert one.started_at.tzinfo is UTC
    assert one.submitted_at <= one.started_at
    assert (two.gpu_count, two.gpu_type, two.status, two.exit_code, two.requested_s) == (
        4,
        "h100",
        "failed",
        None,
        300,
    )
    assert (four.gpu_count, four.gpu_type) == (16, "h100")  # -N2 --gres=gpu:h100:8: 8 per node
    assert (five.user, five.account, five.gpu_count, five.status, five.exit_code) == (
        "berth",
        "histlab",
        1,
        "failed",
        None,
    )

    # What slurmctld still remembers fills a missing user and a failed job's exit code, never overrides.
    known = {"1": ("berth", 0), "2": ("berth", 3), "5": ("someone", 5)}
    filled = {r.external_id: r for r in parse_slurmdb_jobs(answer["jobs"], known=known).records}
    assert (filled["1"].user, filled["2"].user, filled["2"].exit_code) == ("berth", "berth", 3)
    assert (filled["5"].user, filled["5"].exit_code) == ("berth", 5)
    assert filled["4"].user == ""


def test_slurmdb_jobs_states_ids_and_limits() -> None:
    from scheduling.history.parsers import parse_slurmdb_jobs

    def job(job_id: int, state: str, **extra: object) -> dict[str, object]:
        base: dict[str, object] = {
            "job_id": job_id, "name": f"j{job_id}", "user": "ada", "account": "vis",
            "state": {"current": state, "reason": "None"},
            "time": {"submission": 1_700_000_000, "start": 1_700_000_010, "end": 1_700_000_070,
                     "limit": 4294967295},
            "exit_code": {"status": "SUCCESS", "return_code": 0},
            "tres": {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": 2}], "requested": []},
            "array": {"job_id": 0, "task_id": None}, "het": {"job_id": 0, "job_offset": None},
        }  # fmt: skip
        base.update(extra)
        return base

    parsed = parse_slurmdb_jobs(
        [
            job(10, "COMPLETED"),
            job(11, "RUNNING"),
            job(12, "CANCELLED", exit_code={"status": "SIGNALED", "signal": {"signal_id": 15}}),
            job(13, "TIMEOUT", exit_code={"status": "ERROR", "return_code": 7}),
            job(14, "COMPLETED", array={"job_id": 9, "task_id": 3}),
            job(15, "COMPLETED", time={"submission": 1, "start": 0, "end": 0, "limit": 5}),
            job(
                16,
                "COMPLETED",
                tres={"allocated": [], "requested": [{"type": "gres", "name": "gpu:v100", "count": 1}]},
            ),
            "garbage",
        ]
    )
    by_id = {r.external_id: r for r in parsed.records}
    assert sorted(by_id) == ["10", "12", "13", "16", "9_3"]
    assert (by_id["10"].gpu_count, by_id["10"].gpu_type, by_id["10"].requested_s) == (2, "", None)
    assert (by_id["12"].status, by_id["12"].exit_code) == ("cancelled", None)
    assert (by_id["13"].status, by_id["13"].exit_code) == ("failed", 7)
    assert (by_id["16"].gpu_count, by_id["16"].gpu_type) == (1, "v100")  # requested when none allocated
    assert {(s.external_id, s.reason) for s in parsed.skips} == {
        ("11", "not finished (RUNNING)"),
        ("15", "never started"),
        ("", "not a job record"),
    }
