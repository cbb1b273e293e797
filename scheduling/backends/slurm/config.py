"""Slurm backend configuration, job payloads and the error types (see the package docstring)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduling.backends.base import (
    BackendError,
)

SIGNAL_MARK = "berth:signalled_at="


class SlurmRejectedError(BackendError):
    """Slurm understood the request and refused it (bad payload, unknown job, invalid node)."""


class SlurmEndpointMissingError(BackendError):
    """slurmrestd answered 404: it does not serve this API (e.g. no ``openapi/dbv0.0.38`` plugin)."""


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """How to reach slurmrestd and how Berth's jobs look on Slurm (see the package docstring)."""

    url: str = "http://127.0.0.1:46820"
    user: str = "berth"
    token: str | None = None  # fixed JWT; None: mint with `scontrol token`
    token_lifespan_s: int = 3600
    token_refresh_margin_s: float = 300.0
    partition: str = "gpu"
    job_name_prefix: str = "berth-"
    reservation_prefix: str = "berth-"
    gpu_ids: Mapping[str, tuple[int, ...]] | None = None  # node -> Berth ids by GRES index
    gpu_types: Mapping[str, str] | None = None  # Slurm GRES type -> Berth GPU type name
    working_directory: str = "/tmp"  # noqa: S108  (where jobs start; the job user must be able to write)
    # Where a job's output goes (Slurm's filename pattern: %j job id, %x job name, %u user);
    # Berth reads it back for the job's owner (`SlurmBackend.job_output`), so it must be on a
    # filesystem the worker sees (a shared filesystem, or the one host here).
    standard_output: str = "/tmp/berth-%j.out"  # noqa: S108
    default_time_limit_s: int = 7 * 86_400
    preempt_signal: str = "TERM"
    timeout_s: float = 15.0  # slurmrestd itself needs ~9 s to give up on a dead controller
    dry_run: bool = False
    scontrol: tuple[str, ...] = ("scontrol",)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SlurmConfig:
        """Build a config from ``BERTH_SLURM*`` environment variables; unset ones keep the defaults."""
        env = os.environ if env is None else env
        base = cls()
        return cls(
            url=env.get("BERTH_SLURMRESTD_URL", base.url),
            user=env.get("BERTH_SLURM_USER", base.user),
            token=env.get("BERTH_SLURM_JWT") or None,
            partition=env.get("BERTH_SLURM_PARTITION", base.partition),
            standard_output=env.get("BERTH_SLURM_OUTPUT", base.standard_output),
            dry_run=env.get("BERTH_SLURM_DRY_RUN", "") in {"1", "true", "yes"},
        )


@dataclass(frozen=True, slots=True)
class SlurmJobPayload:
    """What a Berth job runs on Slurm; the Plan carries only ids."""

    script: str  # full batch script, starting with #!
    environment: Mapping[str, str] = field(default_factory=dict)
    time_limit_s: int | None = None
    working_directory: str | None = None
    standard_output: str | None = None
    cpus_per_task: int | None = None
    memory_per_node_mib: int | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SlurmJobPayload:
        """Accept ``script`` or a shell ``command`` (wrapped in a bash script) and the optional fields.

        ``env`` is accepted for ``environment`` (the portal's job API calls it that); other keys (the
        portal adds ``requested_s``, ``attempt``, ...) are ignored.
        """
        script = data.get("script")
        if not script and data.get("command"):
            script = f"#!/bin/bash\n{data['command']}\n"
        if not isinstance(script, str) or not script.strip():
            raise SlurmRejectedError("payload needs a non-empty 'script' or 'command'")
        if not script.startswith("#!"):  # Slurm refuses batch scripts without an interpreter line
            script = "#!/bin/bash\n" + script
        env = data.get("environment") or data.get("env") or {}
        if not isinstance(env, Mapping):
            raise SlurmRejectedError("payload 'environment' must be a mapping")
        return cls(
            script=script,
            environment={str(k): str(v) for k, v in env.items()},
            time_limit_s=_optional_int(data, "time_limit_s"),
            working_directory=data.get("working_directory") or None,
            standard_output=data.get("standard_output") or None,
            cpus_per_task=_optional_int(data, "cpus_per_task"),
            memory_per_node_mib=_optional_int(data, "memory_per_node_mib"),
        )


def _optional_int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise SlurmRejectedError(f"payload {key!r} must be a whole number, not {value!r}") from exc
    if number <= 0:
        raise SlurmRejectedError(f"payload {key!r} must be positive, not {number}")
    return number


PayloadSource = Callable[[str], "SlurmJobPayload | Mapping[str, Any] | None"]
Runner = Callable[[Sequence[str]], str]
