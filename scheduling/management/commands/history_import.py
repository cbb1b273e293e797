"""``manage.py history_import``: load a cluster's past jobs from sacct, SWF or the trace CSV.

Examples::

    sacct -a -X --parsable2 -S 2025-01-01 -E now \\
      --format=JobID,JobName,User,Account,Partition,Submit,Start,End,Timelimit,State,ExitCode,AllocTRES \\
      > sacct.txt
    manage.py history_import sacct sacct.txt --cluster slurm --tz Europe/Berlin --map-gpu-type tesla=A100
    manage.py history_import slurmrestd --cluster slurm --since 2025-01-01 --map-account vis=vision
    manage.py history_import swf KTH-SP2.swf --cluster demo --default-project vision --create-users
    manage.py history_import trace alibaba.csv.gz --cluster demo --epoch 2026-01-01T00:00Z \\
      --default-user ada --default-project vision

``slurmrestd`` reads slurmdbd's records through slurmrestd's accounting API
(``/slurmdb/v0.0.38/jobs``) instead of a file: the URL, Slurm user and JWT are the cluster's Slurm
backend settings (``BERTH_SLURMRESTD_URL``, ``BERTH_SLURM_USER``, ``BERTH_SLURM_JWT`` or a token
minted with ``scontrol token``), ``--url`` overrides the URL.

Re-running over the same file changes nothing (see ``scheduling.history.services``).  The
report lists how many rows were imported and, grouped by reason, what was skipped.
"""

from __future__ import annotations

import gzip
import math
from argparse import ArgumentParser
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.management.base import BaseCommand, CommandError

from scheduling.history.parsers import (
    Parsed,
    parse_sacct,
    parse_scontrol,
    parse_slurmdb_jobs,
    parse_swf,
    parse_trace_csv,
)
from scheduling.history.services import history_import
from scheduling.models import Cluster


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        source, sep, target = value.partition("=")
        if not sep or not source or not target:
            raise CommandError(f"{flag} takes SOURCE=TARGET, not {value!r}")
        out[source] = target
    return out


def _read(path: Path) -> str:
    if str(path) == "-":
        import sys

        return sys.stdin.read()
    if not path.is_file():
        raise CommandError(f"{path}: no such file")
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        text: str = handle.read()
    return text


def _slurm_time(text: str | None, flag: str, zone: ZoneInfo, *, now: datetime | None = None) -> str | None:
    """``--since``/``--until`` (ISO 8601; no zone: ``--tz``) as a Slurm time.

    Sent as ``now-N`` seconds (Slurm's relative form), which slurmrestd resolves on its own clock:
    the window is right even when the host's zone is not ``--tz`` (an absolute ``YYYY-MM-DDTHH:MM:SS``
    is read in the host's local zone, which the portal cannot see).
    """
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CommandError(f"{flag} {text!r}: give an ISO 8601 date or time, e.g. 2025-01-01") from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    ago = ((now or datetime.now(UTC)) - value).total_seconds()
    return f"now-{max(0, math.ceil(ago))}" if ago >= 0 else f"now+{math.floor(-ago)}"


def _slurmrestd_backend(cluster: Cluster, url: str | None) -> Any:
    """The cluster's Slurm backend (its settings: URL, user, token), else one from the environment."""
    import dataclasses

    from scheduling.backend_registry import backend_for_cluster
    from scheduling.backends.base import BackendError
    from scheduling.backends.slurm import SlurmBackend, SlurmConfig

    config = SlurmConfig.from_env()
    if cluster.backend == Cluster.Backend.SLURM:
        try:
            backend = backend_for_cluster(cluster)
        except BackendError as exc:
            raise CommandError(str(exc)) from exc
        if isinstance(backend, SlurmBackend):
            config = backend.config
    if url:
        config = dataclasses.replace(config, url=url)
    return SlurmBackend(config)


def _epoch(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CommandError(f"--epoch {text!r}: give an ISO 8601 time, e.g. 2026-01-01T00:00Z") from exc
    if value.tzinfo is None:
        raise CommandError("--epoch needs a zone (…Z or …+01:00)")
    return value


class Command(BaseCommand):
    help = "Import finished jobs from sacct --parsable2, an SWF log or the shared trace CSV (idempotent)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("format", choices=["sacct", "scontrol", "slurmrestd", "swf", "trace"])
        parser.add_argument(
            "path",
            type=Path,
            nargs="?",
            help="the dump ('-' reads stdin; .gz is unpacked); not for slurmrestd",
        )
        parser.add_argument("--cluster", required=True, help="cluster name the jobs ran on")
        parser.add_argument(
            "--tz",
            default="UTC",
            help="sacct/scontrol: the zone of the dump's times; slurmrestd: of a --since/--until "
            "without one (default UTC)",
        )
        parser.add_argument("--url", help="slurmrestd: its URL (default: the cluster's Slurm settings)")
        parser.add_argument(
            "--since", help="slurmrestd: jobs eligible or running since (ISO 8601; default: all)"
        )
        parser.add_argument("--until", help="slurmrestd: ... and until (ISO 8601; default: now)")
        parser.add_argument(
            "--slurm-cluster", help="slurmrestd: only this Slurm cluster's jobs (ClusterName)"
        )
        parser.add_argument("--epoch", help="swf/trace: time 0 as ISO 8601 with a zone")
        parser.add_argument("--map-user", action="append", default=[], metavar="SRC=USERNAME")
        parser.add_argument("--map-account", action="append", default=[], metavar="ACCOUNT=PROJECT_SLUG")
        parser.add_argument("--map-gpu-type", action="append", default=[], metavar="SRC=GPU_TYPE")
        parser.add_argument("--default-user", help="user for rows without one")
        parser.add_argument("--default-project", help="project slug for accounts without a project")
        parser.add_argument("--create-users", action="store_true", help="create unknown users (no password)")
        parser.add_argument("--dry-run", action="store_true", help="report only; write nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster named {options['cluster']!r}")
        if options["format"] == "slurmrestd":
            if options["path"] is not None:
                raise CommandError("slurmrestd reads from the server, not a file: drop the path")
            parsed = self._from_slurmrestd(cluster, options)
        else:
            if options["path"] is None:
                raise CommandError(f"{options['format']}: give the dump's path ('-' for stdin)")
            parsed = self._parse(options["format"], _read(options["path"]), options)
        report = history_import(
            parsed.records,
            cluster=cluster,
            skips=parsed.skips,
            user_map=_pairs(options["map_user"], "--map-user"),
            account_map=_pairs(options["map_account"], "--map-account"),
            gpu_type_map=_pairs(options["map_gpu_type"], "--map-gpu-type"),
            default_user=options["default_user"],
            default_project=options["default_project"],
            create_users=options["create_users"],
            dry_run=options["dry_run"],
        )
        verb = "would import" if options["dry_run"] else "imported"
        total = len(parsed.records) + len(parsed.skips)
        self.stdout.write(
            f"{verb} {report.created} job(s) into {cluster.name}; "
            f"skipped {len(report.skipped)} of {total} row(s)"
        )
        if report.users_created:
            self.stdout.write(f"users created: {', '.join(sorted(set(report.users_created)))}")
        for reason, count in report.reasons().most_common():
            examples = [s for s in report.skipped if s.reason.startswith(reason)][:3]
            where = ", ".join(
                f"{s.external_id or '?'}" + (f" (line {s.line})" if s.line else "") for s in examples
            )
            self.stdout.write(f"  skipped {count:>6}  {reason}: e.g. {where}")

    def _from_slurmrestd(self, cluster: Cluster, options: dict[str, Any]) -> Parsed:
        """Records from slurmrestd's accounting API, completed with what slurmctld still knows."""
        from scheduling.backends.base import BackendError
        from scheduling.backends.slurm import SlurmEndpointMissingError, exit_code_of

        try:
            zone = ZoneInfo(options["tz"])
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise CommandError(f"--tz {options['tz']!r}: not a time zone") from exc
        since = _slurm_time(options["since"], "--since", zone) or "1970-01-02T00:00:00"  # all
        until = _slurm_time(options["until"], "--until", zone)
        backend = _slurmrestd_backend(cluster, options["url"])
        url = backend.config.url
        try:
            jobs = backend.accounting_jobs(start_time=since, end_time=until, cluster=options["slurm_cluster"])
        except SlurmEndpointMissingError as exc:
            raise CommandError(
                f"{exc}. The accounting API needs slurmdbd (AccountingStorageType="
                "accounting_storage/slurmdbd) and slurmrestd started with the dbv0.0.38 plugin "
                "(-s openapi/v0.0.38,openapi/dbv0.0.38)."
            ) from exc
        except BackendError as exc:
            raise CommandError(f"cannot read Slurm accounting from slurmrestd at {url}: {exc}") from exc
        known: dict[str, tuple[str, int | None]] = {}
        try:
            for job_id, raw in backend.controller_jobs().items():
                known[job_id] = (str(raw.get("user_name") or ""), exit_code_of(raw.get("exit_code")))
        except BackendError as exc:  # only a refinement (recent exit codes): import without it
            self.stderr.write(
                f"note: slurmctld's job list unavailable ({exc}); exit codes of failed jobs unknown"
            )
        return parse_slurmdb_jobs(jobs, known=known)

    def _parse(self, fmt: str, text: str, options: dict[str, Any]) -> Parsed:
        try:
            if fmt in ("sacct", "scontrol"):
                try:
                    zone = ZoneInfo(options["tz"])
                except (ZoneInfoNotFoundError, ValueError) as exc:
                    raise CommandError(f"--tz {options['tz']!r}: not a time zone") from exc
                return (parse_sacct if fmt == "sacct" else parse_scontrol)(text, zone=zone)
            if fmt == "swf":
                return parse_swf(text, epoch=_epoch(options["epoch"]))
            epoch = _epoch(options["epoch"])
            if epoch is None:
                raise CommandError("the trace format has relative times: give --epoch")
            return parse_trace_csv(text, epoch=epoch)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
