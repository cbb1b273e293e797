"""Cluster settings: one validated model per backend kind (``Cluster.settings``, a JSON object).

Each model lists the keys its backend reads, with their types and ranges; `cluster_settings`
checks a cluster's settings against the model of its kind and returns only the keys that were
given, so the backend's own defaults (and ``from_env``) stay in charge of the rest.  A bad
value raises `ValueError` with one line per bad key (``timeout_s: Input should be greater than
0``); the registry turns that into `BackendError`, so the cluster is marked degraded.

Rules shared by every kind:

* Switches (``dry_run``, the simulator's fault switches, ...) are JSON booleans, 0/1 or the
  words true/false, yes/no, on/off (any case): ``"false"`` means false, and anything else
  (``"maybe"``, ``2``, ``null``) is refused.
* Numbers are JSON numbers for Slurm and Kubernetes (``"soon"`` or ``true`` is refused); the
  simulator also takes numeric strings (``"4"``), as it always has.
* URLs are http(s) with a host and, when given, a port in 1..65535 (``http://h:-1`` is refused).
* Keys a kind does not know are ignored: the same JSON also holds keys other parts of Berth read
  (``policy`` and the demo lab's notes, see `SHARED_KEYS`), and a cluster whose kind changes
  keeps its old keys.  `unknown_keys` names the ones nobody reads, so the registry logs them.

No Django here: pure data in, data out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    model_validator,
)

__all__ = [
    "SHARED_KEYS",
    "KubernetesSettings",
    "SimulatorSettings",
    "SlurmSettings",
    "cluster_settings",
    "settings_model",
    "unknown_keys",
]

# Keys that are not a backend's: ``policy`` (the round's policy loader reads it) and the demo lab's
# note of where its inventory came from (``inventory``, ``scale``; `scheduling.management.demo_lab`).
SHARED_KEYS = frozenset({"policy", "inventory", "scale"})

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def _switch(value: Any) -> bool:
    """A JSON boolean, 0/1, or a word such as "false" (which ``bool()`` would read as true)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"must be true or false, not {value!r}")


def _json_number(value: Any) -> Any:
    """A JSON number and nothing else (no strings, no booleans, which are ints to Python)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number, not {value!r}")
    return value


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"must be an http(s) URL with a host, not {value!r}")
    try:
        parts.port  # noqa: B018  (raises ValueError for a port outside 0..65535 or not a number)
    except ValueError as exc:
        raise ValueError(f"has no valid port: {value!r}") from exc
    if parts.port == 0:
        raise ValueError(f"has no valid port: {value!r}")
    return value


Switch = Annotated[bool, BeforeValidator(_switch)]
HttpUrl = Annotated[StrictStr, AfterValidator(_http_url)]
Name = Annotated[StrictStr, Field(min_length=1)]
PositiveInt = Annotated[int, BeforeValidator(_json_number), Field(gt=0)]
NonNegativeInt = Annotated[int, BeforeValidator(_json_number), Field(ge=0)]
PositiveFloat = Annotated[float, BeforeValidator(_json_number), Field(gt=0)]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SlurmSettings(_Settings):
    """``slurm`` clusters: over `SlurmConfig.from_env` (the JWT comes from the environment only)."""

    url: HttpUrl = ""
    user: Name = ""
    partition: Name = ""
    job_name_prefix: StrictStr = ""
    reservation_prefix: StrictStr = ""
    default_time_limit_s: PositiveInt = 0
    dry_run: Switch = False
    timeout_s: PositiveFloat = 0.0


class KubernetesSettings(_Settings):
    """``kubernetes`` clusters: over `KubernetesConfig.from_env` (tokens come from the environment)."""

    namespace: Annotated[StrictStr, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")] = ""
    host: HttpUrl | None = None
    gpu_types: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    dry_run: Switch = False
    termination_grace_s: NonNegativeInt = 0
    timeout_s: PositiveFloat = 0.0
    verify_ssl: Switch = True


class SimulatorSettings(_Settings):
    """``simulator`` clusters (`LiveSimConfig`); numbers may be numeric strings."""

    speedup: float = Field(default=1.0, gt=0)
    runtime_fraction_lo: float = Field(default=0.3, gt=0)
    runtime_fraction_hi: float = Field(default=0.9, gt=0)
    default_runtime_s: float = Field(default=600.0, gt=0)
    fail_rate: float = Field(default=0.0, ge=0, le=1)
    seed: int = 0
    checkpoint_on_signal: Switch = True
    retention_s: float = Field(default=86_400.0, ge=0)
    lock_timeout_s: float = Field(default=30.0, gt=0)
    is_unreachable: Switch = False
    fail_apply: Switch = False
    refuse_starts: Switch = False
    block_in: Literal["", "snapshot", "apply"] = ""
    block_s: float = Field(default=0.0, ge=0)
    block_marker: StrictStr = ""

    @model_validator(mode="after")
    def _fractions_in_order(self) -> SimulatorSettings:
        if self.runtime_fraction_lo > self.runtime_fraction_hi:
            raise ValueError("need 0 < runtime_fraction_lo <= runtime_fraction_hi")
        return self


_MODELS: dict[str, type[_Settings]] = {
    "simulator": SimulatorSettings,
    "slurm": SlurmSettings,
    "kubernetes": KubernetesSettings,
}


def settings_model(kind: str) -> type[_Settings]:
    """The settings model of a backend kind (``Cluster.Backend`` value); KeyError if unknown."""
    return _MODELS[kind]


def cluster_settings(kind: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``raw`` that ``kind``'s backend reads, validated; ValueError names every bad key."""
    model = settings_model(kind)
    try:
        parsed = model.model_validate(dict(raw))
    except ValidationError as exc:
        raise ValueError("; ".join(_describe(error) for error in exc.errors())) from None
    return parsed.model_dump(exclude_unset=True)


def unknown_keys(kind: str, raw: Mapping[str, Any]) -> list[str]:
    """Keys of ``raw`` that neither ``kind``'s backend nor any other part of Berth reads."""
    known = set(settings_model(kind).model_fields) | SHARED_KEYS
    return sorted(key for key in raw if key not in known)


def _describe(error: Mapping[str, Any]) -> str:
    loc = error["loc"]
    name = ".".join(str(part) for part in loc[:1]) if loc else "settings"  # the key, not the union arm
    message = str(error["msg"])
    if message.startswith("Value error, "):  # our own validators: "dry_run must be true or false"
        text = message.removeprefix("Value error, ")
        return text if text.startswith("need ") else f"{name} {text}"
    return f"{name}: {message}"
