"""Every ``berth`` command against a live test server, and the error paths with their exit codes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from rest_framework.authtoken.models import Token

from portal.accounts.models import Project
from scheduling.models import Booking, Cluster, IdempotencyKey, Job
from scheduling.rounds import engine_round_run
from scheduling.services import booking_create
from tests.berth_cli.conftest import Berth, make_berth
from tests.factories import MembershipFactory

pytestmark = [pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def _hour(hours_ahead: int) -> datetime:
    return (timezone.now() + timedelta(hours=hours_ahead)).replace(minute=0, second=0, microsecond=0)


def _berlin(value: datetime) -> str:
    """``value`` as the CLI shows it in these tests' local zone (Europe/Berlin, see conftest), with
    its offset: +01:00 in winter, +02:00 in summer (a fixed "+01:00" failed from the end of March
    to the end of October)."""
    local = value.astimezone(ZoneInfo("Europe/Berlin"))
    offset = local.strftime("%z")
    return f"{local:%a %d %b %H:%M} {offset[:3]}:{offset[3:]}"


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _book(
    user: User, project: Project, cluster: Cluster, *, gpus: int, start: datetime, hours: int
) -> Booking:
    return booking_create(
        user,
        project=project,
        gpu_type=cluster.nodes.first().gpu_type,
        gpu_count=gpus,
        start_at=start,
        end_at=start + timedelta(hours=hours),
    )


# ---- login, whoami, logout ----


def test_login_stores_the_token_0600_then_whoami_and_logout(
    server: str, member: User, sim_cluster: Cluster, tmp_path: Path
) -> None:
    berth = make_berth(server, tmp_path / "cfg", None)

    result = berth("login", "--username", "ada", "--password", "pw-not-secret")

    assert result.exit_code == 0, result.output
    config = tmp_path / "cfg" / "berth" / "config.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    stored = json.loads(config.read_text())
    assert stored == {"url": server, "token": Token.objects.get(user=member).key, "username": "ada"}
    assert "Signed in" in result.output
    assert "vision (member)" in result.output
    # Later commands use the stored token (BERTH_URL unset too: the stored URL).
    who = berth("whoami", "--json", env={"BERTH_URL": None})
    assert who.exit_code == 0, who.output
    assert json.loads(who.output)["username"] == "ada"

    out = berth("logout")
    assert out.exit_code == 0, out.output
    assert not Token.objects.filter(user=member).exists()
    assert "token" not in json.loads(config.read_text())
    assert berth("whoami").exit_code == 4  # not signed in any more


def test_login_with_a_wrong_password_is_refused_and_stores_nothing(
    server: str, member: User, tmp_path: Path
) -> None:
    berth = make_berth(server, tmp_path / "cfg", None)
    result = berth("login", "-u", "ada", "--password", "wrong")
    assert result.exit_code == 2
    assert "Unable to log in" in result.output
    assert not (tmp_path / "cfg" / "berth" / "config.json").exists()


def test_login_prompts_for_the_password(server: str, member: User, tmp_path: Path) -> None:
    berth = make_berth(server, tmp_path / "cfg", None)
    result = berth("login", "-u", "ada", stdin="pw-not-secret\n")
    assert result.exit_code == 0, result.output
    assert "pw-not-secret" not in result.output  # hidden input


def test_an_environment_token_overrides_the_stored_one(
    server: str, member: User, manager: User, tmp_path: Path
) -> None:
    berth = make_berth(server, tmp_path / "cfg", None)
    assert berth("login", "-u", "ada", "--password", "pw-not-secret").exit_code == 0
    other = Token.objects.create(user=manager)
    who = berth("whoami", "--json", env={"BERTH_TOKEN": other.key})
    assert json.loads(who.output)["username"] == "grace"


# ---- availability and bookings ----


def test_avail_counts_what_the_server_counts(
    berth: Berth, member: User, project: Project, sim_cluster: Cluster
) -> None:
    start = _hour(2)
    _book(member, project, sim_cluster, gpus=3, start=start, hours=1)

    data = json.loads(berth("avail", "--type", "A100", "--at", _iso(start), "--hours", "2", "--json").output)

    [row] = data
    assert row["capacity"] == 8
    assert row["free_whole_window"] == 5  # 3 held in the first hour
    assert [s["free_gpus"] for s in row["slots"]] == [5, 8]
    human = berth("avail", "-t", "A100", "--at", _iso(start), "--hours", "2")
    assert human.exit_code == 0, human.output
    assert "5 of 8 free for the whole window" in human.output
    assert _berlin(start) in human.output
    every = berth("avail", "--hours", "1")
    assert "A100" in every.output
    assert every.exit_code == 0


def test_book_then_list_extend_and_cancel(berth: Berth, member: User, sim_cluster: Cluster) -> None:
    start = _hour(3)
    made = berth("book", "-t", "A100", "-n", "2", "--at", _iso(start), "--hours", "2", "--json")
    assert made.exit_code == 0, made.output
    booking = Booking.objects.get(pk=json.loads(made.output)["id"])
    assert (booking.user, booking.gpu_count, booking.start_at) == (member, 2, start)
    assert booking.end_at == start + timedelta(hours=2)
    assert booking.allocations.count() == 2
    # The write carried an Idempotency-Key (the CLI retries lost answers with it).
    assert IdempotencyKey.objects.filter(user=member, path="/api/v1/bookings/", status_code=201).count() == 1

    listed = berth("bookings")
    assert str(booking.pk) in listed.output
    assert "2× A100" in listed.output
    assert "(in 2 h" in listed.output or "(in 3 h" in listed.output  # human distance

    extended = berth("extend", str(booking.pk), "--by", "1h")
    assert extended.exit_code == 0, extended.output
    booking.refresh_from_db()
    assert booking.end_at == start + timedelta(hours=3)
    later_end = start + timedelta(hours=4)
    assert berth("extend", str(booking.pk), "--until", _iso(later_end)).exit_code == 0
    booking.refresh_from_db()
    assert booking.end_at == later_end

    cancelled = berth("cancel", "--booking", str(booking.pk), "--json")
    assert cancelled.exit_code == 0, cancelled.output
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CANCELLED
    assert json.loads(berth("bookings", "--json").output) == []


def test_a_taken_window_exits_3_with_the_servers_alternatives(
    berth: Berth, member: User, project: Project, sim_cluster: Cluster
) -> None:
    start = _hour(2)
    _book(member, project, sim_cluster, gpus=8, start=start, hours=2)

    result = berth("book", "-t", "A100", "-n", "2", "--at", _iso(start), "--hours", "1")

    assert result.exit_code == 3
    assert "Nearest free windows" in result.output
    assert "berth book -p vision -t A100 -n 2" in result.output  # a ready command per alternative
    assert result.output.count("are not free") == 1  # the server's message, once
    as_json = berth("book", "-t", "A100", "-n", "2", "--at", _iso(start), "--hours", "1", "--json")
    assert as_json.exit_code == 3
    error = json.loads(as_json.stdout)["error"]
    assert error["status"] == 409
    first = datetime.fromisoformat(error["alternatives"][0]["start_at"].replace("Z", "+00:00"))
    assert first >= start + timedelta(hours=2)  # after the full window
    assert Booking.objects.count() == 1


def test_an_extension_into_taken_gpus_exits_3(
    berth: Berth, member: User, project: Project, sim_cluster: Cluster
) -> None:
    start = _hour(2)
    mine = _book(member, project, sim_cluster, gpus=8, start=start, hours=1)
    _book(member, project, sim_cluster, gpus=8, start=start + timedelta(hours=1), hours=1)
    result = berth("extend", str(mine.pk), "--by", "30m")
    assert result.exit_code == 3, result.output
    mine.refresh_from_db()
    assert mine.end_at == start + timedelta(hours=1)


def test_end_a_running_booking(berth: Berth, member: User, project: Project, sim_cluster: Cluster) -> None:
    now = timezone.now().replace(microsecond=0)
    booking = _book(member, project, sim_cluster, gpus=1, start=now, hours=2)
    result = berth("end", str(booking.pk), "--json")
    assert result.exit_code == 0, result.output
    booking.refresh_from_db()
    assert booking.status == Booking.Status.COMPLETED
    assert now <= booking.ended_at < now + timedelta(minutes=5)
    assert json.loads(result.output)["status"] == "completed"


def test_a_manager_sees_the_projects_bookings_with_all(
    berth: Berth,
    berth_as: Callable[[User], Berth],
    member: User,
    manager: User,
    project: Project,
    sim_cluster: Cluster,
) -> None:
    booking = _book(member, project, sim_cluster, gpus=1, start=_hour(2), hours=1)
    as_manager = berth_as(manager)
    assert json.loads(as_manager("bookings", "--json").output) == []
    everything = json.loads(as_manager("bookings", "--all", "--json").output)
    assert [b["id"] for b in everything] == [booking.pk]
    assert "ada" in as_manager("bookings", "--all").output


# ---- jobs: submit, queue, job, wait, cancel ----


def test_submit_with_the_job_forms_flags(
    berth: Berth, member: User, sim_cluster: Cluster, tmp_path: Path
) -> None:
    result = berth(
        "submit",
        "-n",
        "2",
        "-t",
        "A100",
        "--time",
        "1h30m",
        "--preemptible",
        "--checkpointable",
        "--checkpoint-every",
        "20m",
        "--priority",
        "low",
        "--precision",
        "bf16",
        "--min-memory",
        "40",
        "--env",
        "SEED=7",
        "--json",
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    )
    assert result.exit_code == 0, result.output
    job = Job.objects.get(pk=json.loads(result.output)["id"])
    assert (job.user, job.gpu_count, job.gpu_type.name, job.requested_s) == (member, 2, "A100", 5400)
    assert job.is_preemptible
    assert job.is_checkpointable
    assert job.checkpoint_interval_s == 1200
    assert job.priority == Job.Priority.LOW
    assert job.precisions == ["bf16"]
    assert job.min_memory_gib == 40
    assert job.payload["command"] == "python train.py --lr 3e-4"
    assert job.payload["env"] == {"SEED": "7"}
    assert job.name == "python"

    script = tmp_path / "sweep.sh"
    script.write_text("#!/bin/bash\nfor lr in 1e-3 3e-4; do python train.py --lr $lr; done\n")
    from_file = berth("submit", str(script), "--json")  # options may follow the script
    job = Job.objects.get(pk=json.loads(from_file.output)["id"])
    # The server trims surrounding whitespace of text fields, the script's last newline included.
    assert job.payload["script"] == script.read_text().strip()
    assert job.name == "sweep"
    from_stdin = berth("submit", "--script", "-", "-J", "piped", "--json", stdin="echo hi\n")
    job = Job.objects.get(pk=json.loads(from_stdin.output)["id"])
    assert (job.name, job.payload["script"]) == ("piped", "echo hi")


def test_queue_shows_state_reason_and_eta_and_job_shows_one(
    berth: Berth, member: User, sim_cluster: Cluster
) -> None:
    running = json.loads(berth("submit", "-n", "8", "--time", "2h", "-J", "big", "--json", "--", "x").output)
    waiting = json.loads(berth("submit", "-n", "4", "--time", "1h", "-J", "next", "--json", "--", "y").output)
    engine_round_run(cluster_id=sim_cluster.pk, now=timezone.now())

    rows = {j["id"]: j for j in json.loads(berth("queue", "--json").output)}
    assert rows[running["id"]]["status"] == "running"
    pending = Job.objects.get(pk=waiting["id"])
    assert rows[waiting["id"]]["status"] == "pending"
    assert rows[waiting["id"]]["pending_sentence"] == pending.pending_sentence != ""
    table = berth("queue")
    assert "big" in table.output
    assert "next" in table.output
    assert pending.pending_sentence[:40] in table.output.replace("\n", " ") or "waits" in table.output
    assert "in " in table.output  # the ETA as a distance
    detail = berth("job", str(waiting["id"]))
    assert detail.exit_code == 0
    assert "eta p50" in detail.output
    assert pending.eta_p50_at is not None
    assert _berlin(pending.eta_p50_at) in detail.output
    assert json.loads(berth("job", str(running["id"]), "--json").output)["started_at"]


def test_queue_all_shows_a_managers_project(
    berth: Berth, berth_as: Callable[[User], Berth], member: User, manager: User, sim_cluster: Cluster
) -> None:
    job = json.loads(berth("submit", "-J", "ada-job", "--json", "--", "x").output)
    outsider = MembershipFactory().user
    as_manager = berth_as(manager)
    assert json.loads(as_manager("queue", "--json").output) == []
    assert [j["id"] for j in json.loads(as_manager("queue", "--all", "--json").output)] == [job["id"]]
    assert "ada" in as_manager("queue", "--all").output
    assert json.loads(berth_as(outsider)("queue", "--all", "--json").output) == []
    # Another user's job does not exist for an outsider.
    assert berth_as(outsider)("job", str(job["id"])).exit_code == 4


def _round_soon(cluster_id: int, delay_s: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        try:
            engine_round_run(cluster_id=cluster_id, now=timezone.now())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_wait_until_started_follows_a_real_round(berth: Berth, sim_cluster: Cluster) -> None:
    job = json.loads(berth("submit", "-n", "2", "--time", "1h", "--json", "--", "train").output)
    thread = _round_soon(sim_cluster.pk, 1.0)
    try:
        result = berth("wait", str(job["id"]), "--interval", "0.3", "--timeout", "60s")
    finally:
        thread.join()
    assert result.exit_code == 0, result.output
    assert "pending" in result.output
    assert "running" in result.output
    assert Job.objects.get(pk=job["id"]).status == Job.Status.RUNNING


def test_wait_times_out_and_a_cancelled_job_never_starts(berth: Berth, sim_cluster: Cluster) -> None:
    job = json.loads(berth("submit", "--json", "--", "train").output)
    timed_out = berth("wait", str(job["id"]), "--timeout", "1s", "--interval", "0.2")
    assert timed_out.exit_code == 1
    assert "still pending" in timed_out.output

    cancelled = berth("cancel", str(job["id"]))
    assert cancelled.exit_code == 0, cancelled.output
    assert Job.objects.get(pk=job["id"]).status == Job.Status.CANCELLED
    after = berth("wait", str(job["id"]), "--until", "finished", "--json")
    assert after.exit_code == 1
    assert json.loads(after.stdout)["error"]["job"]["status"] == "cancelled"


def test_cancel_a_running_job(berth: Berth, sim_cluster: Cluster) -> None:
    job = json.loads(berth("submit", "-n", "2", "--json", "--", "train").output)
    engine_round_run(cluster_id=sim_cluster.pk, now=timezone.now())
    assert Job.objects.get(pk=job["id"]).status == Job.Status.RUNNING
    result = berth("cancel", str(job["id"]), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["status"] == "cancelled"


# ---- error paths ----


def test_unknown_and_forbidden_exit_4(berth: Berth, sim_cluster: Cluster) -> None:
    missing = berth("job", "999999")
    assert missing.exit_code == 4
    assert "Not found" in missing.output
    assert berth("cancel", "--booking", "999999").exit_code == 4
    bad_token = berth("queue", env={"BERTH_TOKEN": "not-a-token"})
    assert bad_token.exit_code == 4
    assert "berth login" in bad_token.output


def test_bad_flags_and_refused_input_exit_2(berth: Berth, sim_cluster: Cluster) -> None:
    assert berth("book", "-n", "2").exit_code == 2  # --type missing
    when = berth("book", "-t", "A100", "--at", "soonish")
    assert when.exit_code == 2
    assert "Cannot read 'soonish'" in when.output
    assert berth("submit").exit_code == 2  # nothing to run
    assert berth("queue", "--status", "bogus").exit_code == 2  # the server refuses (400)
    refused = berth("book", "-t", "H900", "--at", "+2h")
    assert refused.exit_code == 2
    assert "gpu_type" in refused.output
    past = berth("book", "-t", "A100", "--at", "2020-01-01T10:00Z")
    assert past.exit_code == 2


def test_server_down_exits_5_with_a_message(tmp_path: Path) -> None:
    berth = make_berth("http://127.0.0.1:9", tmp_path, "token")  # discard port: nothing listens
    result = berth("queue")
    assert result.exit_code == 5
    assert "Cannot reach the Berth server at http://127.0.0.1:9" in result.output
    as_json = berth("queue", "--json")
    assert as_json.exit_code == 5
    assert "Cannot reach" in json.loads(as_json.stdout)["error"]["message"]


@pytest.fixture
def failing_server() -> Iterator[str]:
    """A real HTTP server on loopback that answers 503 with Retry-After (a server in maintenance)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"message": "Down for maintenance", "fields": {}}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "30")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_503_exits_5_with_retry_after(failing_server: str, tmp_path: Path) -> None:
    result = make_berth(failing_server, tmp_path, "token")("job", "1")
    assert result.exit_code == 5
    assert "HTTP 503" in result.output
    assert "Retry in 30 s" in result.output


def test_the_real_process_runs_against_the_live_server(berth: Berth, server: str, member: User) -> None:
    token = Token.objects.get(user=member).key
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BERTH_URL": server,
        "BERTH_TOKEN": token,
        "XDG_CONFIG_HOME": "/nonexistent-berth-test",
    }
    done = subprocess.run(
        [sys.executable, "-m", "berth_cli", "whoami", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["username"] == "ada"
    usage = subprocess.run(
        [sys.executable, "-m", "berth_cli", "book", "--gpus", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert usage.returncode == 2
