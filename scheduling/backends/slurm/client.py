"""The slurmrestd transport (JWT minting, one retry on 401, 404 as a missing endpoint) and the reads."""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import requests

from scheduling.backends.base import (
    BackendError,
    JobOutput,
    ObservedState,
)
from scheduling.backends.slurm.config import (
    PayloadSource,
    Runner,
    SlurmConfig,
    SlurmEndpointMissingError,
    SlurmRejectedError,
)
from scheduling.backends.slurm.output import exit_code_of, expand_output_path, read_tail
from scheduling.backends.slurm.parse import NodeInventory, load_json, parse_nodes
from scheduling.backends.slurm.states import berth_jobs, job_state

API = "/slurm/v0.0.38"
DB_API = "/slurmdb/v0.0.38"  # the accounting API (slurmrestd's openapi/dbv0.0.38 plugin, needs slurmdbd)
_NOTHING_FOUND = 9003  # slurmdbd: "Nothing found with query", an empty answer rather than an error
_UNREACHABLE_SCONTROL = ("Unable to contact slurm controller", "Socket timed out", "Connection refused")


def run_command(argv: Sequence[str], *, timeout_s: float = 20.0) -> str:
    """Run a Slurm command, return stdout; `BackendError`/`SlurmRejectedError` on failure."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"{argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).strip()
        if any(s in text for s in _UNREACHABLE_SCONTROL):
            raise BackendError(f"{' '.join(argv[:3])}: {text}")
        raise SlurmRejectedError(f"{' '.join(argv[:3])}: {text}")
    return proc.stdout


class SlurmClient:
    """slurmrestd and scontrol for one cluster: requests with a JWT, and the reads (no writes)."""

    def __init__(
        self,
        config: SlurmConfig | None = None,
        *,
        payload_source: PayloadSource | None = None,
        clock: Callable[[], float] = time.time,
        runner: Runner | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.config = config or SlurmConfig.from_env()
        self._payload_source = payload_source
        self._clock = clock
        self._run: Runner = runner or run_command
        self._session = session or requests.Session()
        self._token: str | None = self.config.token
        self._token_expires_at = math.inf if self.config.token else 0.0

    # -- transport --

    def _auth_headers(self, *, force_new: bool = False) -> dict[str, str]:
        if self.config.token is None and (
            force_new or self._clock() >= self._token_expires_at - self.config.token_refresh_margin_s
        ):
            self._mint_token()
        return {"X-SLURM-USER-NAME": self.config.user, "X-SLURM-USER-TOKEN": self._token or ""}

    def _mint_token(self) -> None:
        now = self._clock()
        out = self._run(
            [
                *self.config.scontrol,
                "token",
                f"username={self.config.user}",
                f"lifespan={self.config.token_lifespan_s}",
            ]
        )
        token = next((ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("SLURM_JWT=")), "")
        if not token:
            raise BackendError(f"scontrol token printed no SLURM_JWT: {out[:100]!r}")
        self._token = token
        self._token_expires_at = now + self.config.token_lifespan_s

    def _request(
        self,
        method: str,
        path: str,
        *,
        doing: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        api: str = API,
        ignore: Iterable[int] = (),
    ) -> dict[str, Any]:
        url = self.config.url.rstrip("/") + api + path
        for attempt in (0, 1):
            try:
                resp = self._session.request(
                    method,
                    url,
                    json=body,
                    params=params,
                    headers=self._auth_headers(force_new=attempt == 1),
                    timeout=self.config.timeout_s,
                )
            except requests.RequestException as exc:
                raise BackendError(f"{doing}: slurmrestd unreachable at {self.config.url}: {exc}") from exc
            # A stale minted token: mint a new one and try once more.  A fixed token cannot be renewed.
            if resp.status_code == 401 and attempt == 0 and self.config.token is None:
                continue
            break
        if resp.status_code == 401:
            raise BackendError(f"{doing}: slurmrestd refused the token for {self.config.user} (401)")
        if resp.status_code == 404 and not resp.text.lstrip().startswith("{"):
            raise SlurmEndpointMissingError(
                f"{doing}: slurmrestd at {self.config.url} does not serve {api + path} (HTTP 404)"
            )
        data = load_json(resp.text, doing=doing, ignore=ignore)
        if resp.status_code >= 400:
            raise BackendError(f"{doing}: HTTP {resp.status_code}")
        return data

    def _scontrol(self, *args: str) -> str:
        return self._run([*self.config.scontrol, *args])

    # -- reads --

    def inventory(self) -> NodeInventory:
        """Nodes, their GPUs and the Berth id table, from ``GET /nodes``."""
        data = self._request("GET", "/nodes", doing="list nodes")
        return parse_nodes(json.dumps(data), gpu_ids=self.config.gpu_ids, gpu_types=self.config.gpu_types)

    def _raw_jobs(self) -> dict[str, Mapping[str, Any]]:
        data = self._request("GET", "/jobs", doing="list jobs")
        jobs = data.get("jobs")
        if not isinstance(jobs, list):
            raise BackendError("list jobs: answer has no 'jobs' list")
        return berth_jobs(jobs, prefix=self.config.job_name_prefix)

    def controller_jobs(self) -> dict[str, Mapping[str, Any]]:
        """Every job slurmctld still knows (any name, finished ones for ``MinJobAge``), by job id."""
        data = self._request("GET", "/jobs", doing="list jobs")
        jobs = data.get("jobs")
        if not isinstance(jobs, list):
            raise BackendError("list jobs: answer has no 'jobs' list")
        return {str(j["job_id"]): j for j in jobs if isinstance(j, Mapping) and "job_id" in j}

    def accounting_jobs(
        self, *, start_time: str | None = None, end_time: str | None = None, cluster: str | None = None
    ) -> list[Mapping[str, Any]]:
        """slurmdbd's job records from ``GET /slurmdb/v0.0.38/jobs`` ("Accounting" in the package docstring).

        ``start_time``/``end_time`` are Slurm times in the slurmrestd host's zone
        (``YYYY-MM-DDTHH:MM:SS``) and select, like ``sacct -S/-E``, the jobs eligible or running
        in that window; ``cluster`` limits the answer to one Slurm cluster.
        """
        params = {
            k: v for k, v in (("start_time", start_time), ("end_time", end_time), ("cluster", cluster)) if v
        }
        data = self._request(
            "GET", "/jobs", doing="read accounting", params=params, api=DB_API, ignore=(_NOTHING_FOUND,)
        )
        jobs = data.get("jobs")
        if not isinstance(jobs, list):
            raise BackendError("read accounting: answer has no 'jobs' list")
        return [j for j in jobs if isinstance(j, Mapping)]

    def reservations(self) -> dict[str, Mapping[str, Any]]:
        """Berth's reservations by name, from ``GET /reservations``."""
        data = self._request("GET", "/reservations", doing="list reservations")
        return {
            str(r["name"]): r
            for r in data.get("reservations") or ()
            if str(r.get("name", "")).startswith(self.config.reservation_prefix)
        }

    def job_output(self, job_id: str, *, backend_ref: str = "", tail_lines: int = 200) -> JobOutput:
        """The tail of a Berth job's output file and its exit code.

        The path is the one Slurm reports for the job (``GET /job/{id}``: ``standard_output``,
        ``standard_error``, working directory), expanded like Slurm does; when slurmctld has
        forgotten the job (``MinJobAge``) the configured pattern is used.  The file is read on the
        worker's host.  Raises `BackendError` when slurmrestd is unreachable.
        """
        ref = backend_ref
        raw: Mapping[str, Any] | None = None
        if not ref:
            raw = self._raw_jobs().get(job_id)
            ref = str(raw["job_id"]) if raw is not None else ""
        if not ref:
            return JobOutput(stdout="", source="Slurm has no job for it (never submitted)")
        if raw is None:
            try:
                data = self._request("GET", f"/job/{ref}", doing=f"read job {ref}")
                found = data.get("jobs") or []
                raw = found[0] if found and isinstance(found[0], Mapping) else None
            except BackendError:
                # Unknown job id (forgotten after MinJobAge) or Slurm unreachable: listing the
                # jobs tells the two apart (it raises when Slurm is unreachable).
                self._raw_jobs()
                raw = None
        name = str((raw or {}).get("name") or self.config.job_name_prefix + job_id)
        user = str((raw or {}).get("user_name") or self.config.user)
        cwd = str((raw or {}).get("current_working_directory") or self.config.working_directory)
        out_pattern = str((raw or {}).get("standard_output") or self.config.standard_output)
        err_pattern = str((raw or {}).get("standard_error") or "")
        expand = partial(expand_output_path, job_ref=ref, name=name, user=user, working_directory=cwd)
        out_path = expand(out_pattern)
        stdout, cut = "", False
        note = ""
        if out_path == "/dev/null":
            note = " (the job wrote its output to /dev/null)"
        else:
            read = read_tail(out_path, lines=tail_lines)
            if read is None:
                note = " (not found on this host)"
            else:
                stdout, cut = read
        stderr = ""
        if err_pattern and expand(err_pattern) not in (out_path, "/dev/null"):
            err = read_tail(expand(err_pattern), lines=tail_lines)
            stderr = err[0] if err else ""
        state = job_state(raw) if raw is not None else None
        is_done = state in (
            ObservedState.COMPLETED,
            ObservedState.FAILED,
            ObservedState.CANCELLED,
            ObservedState.PREEMPTED,
        )
        return JobOutput(
            stdout=stdout,
            stderr=stderr,
            exit_code=exit_code_of(raw.get("exit_code")) if raw is not None and is_done else None,
            source=f"Slurm job {ref}: {out_path}{note}",
            is_truncated=cut,
        )
