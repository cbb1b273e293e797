"""``berth submit``, ``berth queue``, ``berth job``, ``berth wait``, ``berth cancel``."""

from __future__ import annotations

import shlex
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from berth_cli.app import (
    DURATION,
    api,
    console,
    default_project,
    err_console,
    json_option,
    print_json,
    usage_error,
)
from berth_cli.errors import EXIT_FAILED, BerthCliError
from berth_cli.timefmt import duration_text, local_text, now_utc, relative_text, when_text

OPEN = "pending,starting,running"
TERMINAL = {"completed", "failed", "cancelled"}


def _gpus(job: dict[str, Any]) -> str:
    return f"{job['gpu_count']}× {job['gpu_type'] or 'any'}"


def _reason(job: dict[str, Any]) -> str:
    """What the server says about the job's state (its pending sentence while it waits)."""
    if job["status"] == "pending":
        return str(job.get("pending_sentence") or job.get("status_message") or "Waiting for the next round.")
    if job["status"] == "starting":
        return "placed; waiting for the backend to start it"
    if job["status"] == "running":
        started = job.get("started_at")
        return f"running since {local_text(started)} ({relative_text(started)})" if started else "running"
    return str(job.get("status_message") or "")


def _eta(job: dict[str, Any]) -> str:
    if job["status"] != "pending" or not job.get("eta_p50_at"):
        return "-"
    return f"{relative_text(job['eta_p50_at'])} / {relative_text(job.get('eta_p90_at'))}"


def show_job(job: dict[str, Any]) -> None:
    out = console()
    out.print(f"Job [bold]{job['id']}[/] {job['name']}: {job['status']} (attempt {job['attempt']})")
    rows = [
        ("owner", f"{job['user']} / project {job['project']} on {job['cluster']}"),
        ("gpus", _gpus(job) + (f", ≥ {job['min_memory_gib']:g} GiB" if job.get("min_memory_gib") else "")),
        (
            "kind",
            f"{job['kind']}, priority {job['priority']}"
            + (", preemptible" if job["is_preemptible"] else "")
            + (", checkpoints" if job["is_checkpointable"] else ""),
        ),
        ("submitted", when_text(job["submitted_at"])),
    ]
    if job.get("requested_s"):
        rows.append(("estimate", duration_text(job["requested_s"])))
    if job.get("predicted_p50_s"):
        rows.append(
            (
                "predicted",
                f"p50 {duration_text(job['predicted_p50_s'])}, "
                f"p90 {duration_text(job.get('predicted_p90_s') or job['predicted_p50_s'])}",
            )
        )
    if job["status"] == "pending":
        rows.append(("why", _reason(job)))
        if job.get("eta_p50_at"):
            rows.append(("eta p50", when_text(job["eta_p50_at"])))
            rows.append(("eta p90", when_text(job.get("eta_p90_at"))))
    if job.get("started_at"):
        rows.append(("started", when_text(job["started_at"])))
    if job.get("ended_at"):
        rows.append(("ended", when_text(job["ended_at"])))
    if job.get("status_message") and job["status"] != "pending":
        rows.append(("message", job["status_message"]))
    payload = job.get("payload") or {}
    if payload.get("command"):
        rows.append(("command", payload["command"]))
    if payload.get("script"):
        first = payload["script"].strip().splitlines()[:1]
        rows.append(("script", f"{len(payload['script'].splitlines())} lines: {first[0] if first else ''}"))
    for label, value in rows:
        out.print(f"  {label:<10} {value}")


def _parse_env(values: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise usage_error(f"--env takes KEY=VALUE, not {item!r}.")
        env[key] = value
    return env


@click.command()
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--name", "-J", help="Job name (default: the script's or command's first word).")
@click.option("--project", "-p", help="Project slug (default: your only project).")
@click.option("--gpus", "-n", "gpu_count", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--type", "-t", "gpu_type", help="GPU type (default: any type that fits).")
@click.option(
    "--min-memory", "min_memory_gib", type=click.FloatRange(min=0), default=0.0, help="GiB per GPU."
)
@click.option("--precision", "precisions", multiple=True, help="Needed precision (repeat): fp64, bf16, ...")
@click.option("--time", "requested", type=DURATION, help="Runtime estimate: 2h, 90m, 1.5 (hours).")
@click.option("--preemptible", is_flag=True, help="May run on lent GPUs and be stopped after a grace period.")
@click.option("--checkpointable", is_flag=True, help="Resumes from its last checkpoint after a preemption.")
@click.option("--checkpoint-every", "checkpoint_every", type=DURATION, help="Checkpoint interval (30m).")
@click.option("--priority", type=click.Choice(["low", "normal", "high"]), default="normal", show_default=True)
@click.option("--interactive", is_flag=True, help="An interactive session rather than batch work.")
@click.option("--cluster", "-c", help="Cluster (default: any).")
@click.option("--image", help="Container image.")
@click.option("--env", "env", multiple=True, help="Environment KEY=VALUE (repeat).")
@click.option("--script", "script", type=click.File("r"), help="Script file to run ('-' reads stdin).")
@json_option
def submit(
    command: tuple[str, ...],
    name: str | None,
    project: str | None,
    gpu_count: int,
    gpu_type: str | None,
    min_memory_gib: float,
    precisions: tuple[str, ...],
    requested: timedelta | None,
    preemptible: bool,
    checkpointable: bool,
    checkpoint_every: timedelta | None,
    priority: str,
    interactive: bool,
    cluster: str | None,
    image: str | None,
    env: tuple[str, ...],
    script: Any,
    as_json: bool,
) -> None:
    """Submit a batch job running COMMAND or a script: `berth submit -n 2 -- python train.py --lr 3e-4`
    (put the command after -- when it has flags of its own), `berth submit job.sh`, or
    `--script job.sh`. A single argument naming a file is read as a script."""
    payload: dict[str, Any] = {}
    script_name = None
    if script is not None:
        if command:
            raise usage_error("Give a command or --script, not both.")
        payload["script"] = script.read()
        script_name = Path(script.name).stem if script.name not in ("-", "<stdin>") else None
    elif len(command) == 1 and Path(command[0]).is_file():
        path = Path(command[0])
        payload["script"] = path.read_text(encoding="utf-8")
        script_name = path.stem
    elif command:
        payload["command"] = command[0] if len(command) == 1 else shlex.join(command)
    else:
        raise usage_error("Nothing to run: give a command after --, a script file, or --script FILE.")
    if image:
        payload["image"] = image
    if env:
        payload["env"] = _parse_env(env)
    job_name = name or script_name or Path(shlex.split(payload.get("command") or "job")[0]).name
    body: dict[str, Any] = {
        "name": job_name[:200],
        "project": default_project(project),
        "gpu_count": gpu_count,
        "kind": "interactive" if interactive else "batch",
        "min_memory_gib": min_memory_gib,
        "precisions": list(precisions),
        "is_preemptible": preemptible,
        "is_checkpointable": checkpointable,
        "priority": priority,
        "payload": payload,
    }
    if gpu_type:
        body["gpu_type"] = gpu_type
    if cluster:
        body["cluster"] = cluster
    if requested is not None:
        body["requested_s"] = max(1, round(requested.total_seconds()))
    if checkpoint_every is not None:
        body["checkpoint_interval_s"] = max(1, round(checkpoint_every.total_seconds()))
    job = api().post("/jobs/", body)
    if as_json:
        print_json(job)
    else:
        show_job(job)


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also the jobs of projects you manage (staff: all).")
@click.option("--status", default=OPEN, show_default=True, help="Comma-separated statuses, or 'any'.")
@click.option("--project", "-p", help="Only this project.")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True)
@json_option
def queue(show_all: bool, status: str, project: str | None, limit: int, as_json: bool) -> None:
    """Your open jobs, squeue-like: state, GPUs, why each waits and when it should start (p50 / p90)."""
    params = {"mine": "false" if show_all else "true", "project": project}
    if status != "any":
        params["status"] = status
    rows = list(api().pages("/jobs/", limit=limit, **params))
    rows.sort(key=lambda j: j["id"])
    if as_json:
        print_json(rows)
        return
    if not rows:
        console().print("No jobs.")
        return
    table = Table(
        "id", "name", *(["user", "project"] if show_all else []), "state", "gpus", "reason", "eta p50 / p90"
    )
    for job in rows:
        table.add_row(
            str(job["id"]),
            job["name"],
            *([job["user"], job["project"]] if show_all else []),
            job["status"],
            _gpus(job),
            _reason(job),
            _eta(job),
        )
    console().print(table)


@click.command("job")
@click.argument("job_id", type=click.IntRange(min=1))
@json_option
def job_detail(job_id: int, as_json: bool) -> None:
    """One job: state, why it waits, ETA, prediction, times."""
    job = api().get(f"/jobs/{job_id}/")
    if as_json:
        print_json(job)
    else:
        show_job(job)


def _reached(job: dict[str, Any], until: str) -> bool:
    if until == "started":
        # "starting": placed, the backend has not confirmed it yet; a finished job did start if
        # it has a start time (checked after the loop).
        return job["status"] in ("running", *TERMINAL)
    return job["status"] in TERMINAL


@click.command()
@click.argument("job_id", type=click.IntRange(min=1))
@click.option("--until", type=click.Choice(["started", "finished"]), default="started", show_default=True)
@click.option("--timeout", "timeout", type=DURATION, help="Give up after this long (exit 1).")
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Poll seconds."
)
@json_option
def wait(job_id: int, until: str, timeout: timedelta | None, interval: float, as_json: bool) -> None:
    """Wait until a job has started (or finished), showing its state, reason and ETA as they change.

    Exit 0 when reached (for --until finished: completed), 1 when the job failed or was
    cancelled first, or on --timeout."""
    deadline = time.monotonic() + timeout.total_seconds() if timeout else None
    out = console()
    log = err_console()
    job = api().get(f"/jobs/{job_id}/")
    last_line = ""
    interactive = sys.stdout.isatty() and not as_json
    status_ctx = out.status("", spinner="dots") if interactive else None
    try:
        if status_ctx is not None:
            status_ctx.start()
        while True:
            eta = f", ETA {relative_text(job['eta_p50_at'])}" if job.get("eta_p50_at") else ""
            line = f"job {job['id']} {job['status']}: {_reason(job)}{eta}"
            if status_ctx is not None:
                status_ctx.update(line)
            if line != last_line and not as_json:
                stamp = local_text(now_utc()).split(" ")[3]
                (out if not interactive else log).print(f"{stamp} {line}")
                last_line = line
            if _reached(job, until) or job["status"] in TERMINAL:
                break
            if deadline is not None and time.monotonic() >= deadline:
                waited = duration_text(timeout.total_seconds()) if timeout else ""
                raise BerthCliError(
                    f"Job {job_id} is still {job['status']} after {waited}.",
                    exit_code=EXIT_FAILED,
                    body={"job": job},
                )
            time.sleep(interval)
            job = api().get(f"/jobs/{job_id}/")
    finally:
        if status_ctx is not None:
            status_ctx.stop()
    ok = (
        job["status"] == "completed"
        if until == "finished"
        else _reached(job, "started") and bool(job.get("started_at"))
    )
    if not ok:
        raise BerthCliError(
            f"Job {job_id} ended {job['status']} without "
            f"{'completing' if until == 'finished' else 'starting'}"
            + (f": {job['status_message']}" if job.get("status_message") else "."),
            exit_code=EXIT_FAILED,
            body={"job": job},
        )
    if as_json:
        print_json(job)


@click.command()
@click.argument("ids", nargs=-1, required=True, type=click.IntRange(min=1))
@click.option("--booking", "-b", "is_booking", is_flag=True, help="The ids are bookings, not jobs.")
@json_option
def cancel(ids: tuple[int, ...], is_booking: bool, as_json: bool) -> None:
    """Cancel jobs (running ones are stopped), or bookings with --booking."""
    from berth_cli.commands.bookings import show_booking

    kind = "bookings" if is_booking else "jobs"
    results = [api().post(f"/{kind}/{item}/cancel/") for item in ids]
    if as_json:
        print_json(results if len(results) > 1 else results[0])
        return
    for item in results:
        show_booking(item) if is_booking else show_job(item)


@click.command()
@click.argument("job_id", type=click.IntRange(min=1))
@click.option("--tail", "-n", "tail", type=click.IntRange(min=1, max=2000), default=200, show_default=True)
@click.option("--stderr", "stream", flag_value="stderr", help="Only the job's stderr.")
@click.option("--stdout", "stream", flag_value="stdout", help="Only the job's stdout.")
@json_option
def logs(job_id: int, tail: int, stream: str | None, as_json: bool) -> None:
    """The last lines of your job's output, as its cluster keeps them, and its exit code.

    stdout goes to stdout and stderr to stderr (Slurm and Kubernetes usually merge them into
    one); a note saying where the text came from and the exit code goes to stderr."""
    out = api().get(f"/jobs/{job_id}/logs/", tail=tail)
    if as_json:
        print_json(out)
        return
    if stream != "stderr" and out["stdout"]:
        click.echo(out["stdout"], nl=not out["stdout"].endswith("\n"))
    if stream != "stdout" and out["stderr"]:
        click.echo(out["stderr"], nl=not out["stderr"].endswith("\n"), err=True)
    note = f"[job {out['job']} {out['status']}"
    if out.get("exit_code") is not None:
        note += f", exit code {out['exit_code']}"
    note += f"; {out['source'] or 'no output'}"
    if out.get("is_truncated"):
        note += f"; last {tail} lines"
    err_console().print(note + "]", highlight=False, markup=False, soft_wrap=True)


def register(cli: click.Group) -> None:
    for command in (submit, queue, job_detail, wait, cancel, logs):
        cli.add_command(command)
