"""Slurm backend: Berth drives a real Slurm through slurmrestd (OpenAPI v0.0.38, Slurm 22.05) with JWT.

Configuration (`SlurmConfig`, or `SlurmConfig.from_env`)
    ``url`` of slurmrestd (``BERTH_SLURMRESTD_URL``, default ``http://127.0.0.1:46820``, the port
    ``scripts/slurm.sh`` uses) and ``user`` (``BERTH_SLURM_USER``, default ``berth``): every request is
    made, and every job runs, as this Slurm user.  Token: a fixed ``token`` (``BERTH_SLURM_JWT``, e.g. from a
    secret; the operator renews it), else the backend mints one with ``scontrol token username=<user>
    lifespan=<token_lifespan_s>`` and mints a new one ``token_refresh_margin_s`` before it expires, or
    after a 401.  Minting tokens for another user, requeueing and reservations need Slurm operator rights
    on the worker's host (``scontrol`` with a munge key; ``scontrol`` is the argv prefix, so it can be
    wrapped).  ``partition`` receives every job.  ``dry_run=True`` (``BERTH_SLURM_DRY_RUN=1``) reads for
    real and writes nothing: each action comes back ``is_ok`` with a ``dry-run:`` message.

GPU ids
    Slurm numbers GPUs per node by GRES index (0..n-1); Berth needs ids unique in the cluster.  With
    ``gpu_ids`` (node name -> Berth ids, indexed by GRES index; the portal passes its database's) the
    mapping is explicit, and production clusters should set it.  Nodes it does not list are sorted by
    name in natural order (n2 < n10) and their GPUs numbered consecutively above every configured id:
    stable while the inventory is, shifted when a node is added or removed.  A node's ``gres`` string
    gives its type and count (``gpu:a100:4`` -> type ``a100``, 4 GPUs; an untyped ``gpu:4`` is type
    ``gpu``; a node with several GPU types reports the first, with all its GPUs); ``gpu_types`` renames
    Slurm's types to Berth's names (``{"a100": "A100"}``).  Node state: idle/mixed/allocated/completing
    -> up; a DRAIN flag or drained/draining state -> draining; down, NOT_RESPONDING, fail, future,
    unknown -> down.

Jobs
    A `StartAction` submits a batch job named ``<job_name_prefix><job id>`` (the tag the snapshot uses to
    find Berth's jobs; others are ignored), pinned with ``nodelist`` to the planned nodes, asking
    ``gres=gpu:<type>:<n>`` per node.  Slurm chooses *which* GPUs of the node the job gets (gres/gpu has
    no per-index request), so the snapshot reports the indices Slurm really allocated (``gres_detail``,
    ``gpu:a100:2(IDX:0-1)``), mapped to Berth ids.  Only the count per node is guaranteed to match the
    plan; the ids often differ (Slurm takes the lowest free indices), so the caller should record the
    reported ones.  What the job runs comes from a `SlurmJobPayload` (or a
    plain mapping with the same keys) per job id: ``payloads`` given to `apply`, else ``payload_source``.
    If a planned node lies in a Berth reservation (see below) the job is submitted into it: FLEX lets it
    start now and run past the window, so Berth can lend booked GPUs, while other Slurm users stay off.
    That needs a finite time limit: ``time_limit_s`` of the payload, else ``default_time_limit_s``.

    Slurm states map to `ObservedState`: PENDING/CONFIGURING -> pending (or preempted when Berth holds
    it after a requeue), RUNNING/COMPLETING/SUSPENDED -> running, COMPLETED -> completed,
    FAILED/TIMEOUT/OUT_OF_MEMORY/BOOT_FAIL/DEADLINE -> failed, CANCELLED -> cancelled,
    PREEMPTED/REQUEUED/REQUEUE_HOLD -> preempted, NODE_FAIL -> lost, a state this table does not know ->
    lost with the state in the message.  A COMPLETING job reports no GPU ids (Slurm stops listing them
    while the GPUs are being freed).  When several Slurm jobs carry one
    Berth id (a resubmission after a terminal state) the live one, else the newest, is reported.
    slurmctld forgets finished jobs after ``MinJobAge`` (``scripts/slurm.sh`` sets an hour): the caller's
    reconcile must run more often than that.

Preemption
    `PreemptAction`, applied every round until done: before ``signal_at`` nothing; from ``signal_at`` the
    job gets ``preempt_signal`` once (the fact is kept in the job's Slurm comment, so any worker knows);
    from ``kill_at`` ``scontrol requeuehold``: Slurm kills it (SIGTERM, SIGKILL after KillWait), keeps the
    job, its id and its restart count, and holds it.  We hold rather than requeue because a plain requeue
    lets Slurm restart the job by itself on the same node, the GPUs just reclaimed; with the hold the job
    waits for Berth, whose next `StartAction` for it updates nodelist, gres and BeginTime (a requeue sets it
    about 2 min ahead) and releases it.  Cancel + resubmit would lose Slurm's job id and accounting trail,
    so it is used only where Slurm 22.05 leaves no choice: a move to another GPU *type* (a pending job whose
    GRES type is updated stays "never runnable") cancels the held job and submits the payload again under
    the same Berth id.  While the requeue is still killing the job (COMPLETING, ~KillWait) a start for it
    fails for that round and succeeds on a later one.
    `SlurmBackend.cancel` cancels (``DELETE /job/{id}``).

Reservations (bookings)
    v0.0.38 has no reservation writes, so `ReserveAction` runs ``scontrol create|update reservation``:
    named ``<reservation_prefix><holder id>``, on the nodes holding the planned GPUs, for ``user``,
    with flags FLEX (Berth's jobs in it may start early and run past it), IGNORE_JOBS (lent jobs still
    run there; Berth preempts them before the start) and OVERLAP (two bookings may share a node).
    Slurm 22.05 reservations cannot hold GPUs without slurmdbd, so a reservation covers whole nodes.
    `ReleaseAction` deletes it.  Reservations that exist with the same nodes and end are success.

Accounting (history)
    `SlurmBackend.accounting_jobs` reads slurmdbd's job records through slurmrestd's accounting API
    (``GET /slurmdb/v0.0.38/jobs``; slurmrestd must load the ``openapi/dbv0.0.38`` plugin and Slurm must
    use ``accounting_storage/slurmdbd``), with the same JWT; "Nothing found" (9003) is an empty list.
    `SlurmBackend.controller_jobs` is what slurmctld still remembers (``MinJobAge``): the history import
    takes exit codes and user names from it, which 22.05's accounting API loses (see
    ``scheduling.history.parsers.parse_slurmdb_jobs``).  A slurmrestd without the accounting plugin
    answers 404: `SlurmEndpointMissingError`.

Errors
    Everything raises `BackendError`.  Connection failures, timeouts, an unreachable controller (slurmrestd
    answers 500 after ~9 s of retries) and malformed answers raise it from `snapshot` and `apply` (the
    caller marks the cluster degraded and retries).  Slurm refusing one action (error codes >= 2000 in the
    ``errors`` array, or an ``scontrol`` refusal) is `SlurmRejectedError`, a `BackendError` that `apply`
    turns into a failed `ActionResult` so one bad payload does not block the plan.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import hostlist
import requests

from scheduling.backends.base import (
    ActionResult,
    BackendError,
    JobOutput,
    ObservedCluster,
    ObservedJob,
    ObservedState,
    tail,
)
from scheduling.engine.types import (
    Node,
    NodeStatus,
    Plan,
    PreemptAction,
    ReleaseAction,
    ReserveAction,
    StartAction,
)

API = "/slurm/v0.0.38"
DB_API = "/slurmdb/v0.0.38"  # the accounting API (slurmrestd's openapi/dbv0.0.38 plugin, needs slurmdbd)
_NOTHING_FOUND = 9003  # slurmdbd: "Nothing found with query", an empty answer rather than an error
SIGNAL_MARK = "berth:signalled_at="
# Errors that mean "slurmctld/slurmrestd is not there" rather than "Slurm refused": below 2000 are
# Slurm's communication and protocol errors, -1 is what slurmrestd says when it got no answer at all.
_REJECTION_MIN_CODE = 2000
_HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
_UNREACHABLE_SCONTROL = ("Unable to contact slurm controller", "Socket timed out", "Connection refused")


class SlurmRejectedError(BackendError):
    """Slurm understood the request and refused it (bad payload, unknown job, invalid node)."""


class SlurmEndpointMissingError(BackendError):
    """slurmrestd answered 404: it does not serve this API (e.g. no ``openapi/dbv0.0.38`` plugin)."""


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """How to reach slurmrestd and how Berth's jobs look on Slurm (see the module docstring)."""

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


# ---- pure parsers (tested on recorded slurmrestd answers) ----


def check_errors(payload: Mapping[str, Any], *, doing: str, ignore: Iterable[int] = ()) -> None:
    """Raise when a slurmrestd answer carries a non-empty ``errors`` array.

    `SlurmRejectedError` when some error code is a request error (>= 2000), plain `BackendError`
    otherwise (no controller, unknown failure).  Errors whose code is in ``ignore`` are not errors.
    """
    skip = set(ignore)
    errors = [
        e
        for e in payload.get("errors") or []
        if not (isinstance(e, Mapping) and e.get("error_number", e.get("error_code")) in skip)
    ]
    if not errors:
        return
    codes: list[int] = []
    texts: list[str] = []
    for err in errors:
        if not isinstance(err, Mapping):
            texts.append(str(err))
            continue
        code = err.get("error_code", err.get("error_number", err.get("errno", -1)))
        codes.append(int(code) if isinstance(code, int) else -1)
        texts.append(" / ".join(str(err[k]) for k in ("error", "description") if err.get(k)))
    message = f"{doing}: slurm: " + "; ".join(t for t in texts if t)
    if any(c >= _REJECTION_MIN_CODE for c in codes):
        raise SlurmRejectedError(message)
    raise BackendError(message)


def load_json(text: str, *, doing: str, ignore: Iterable[int] = ()) -> dict[str, Any]:
    """Parse one slurmrestd answer and check its ``errors`` array (codes in ``ignore`` pass)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BackendError(f"{doing}: not JSON: {text[:200]!r}") from exc
    if not isinstance(data, dict):
        raise BackendError(f"{doing}: unexpected JSON {type(data).__name__}")
    check_errors(data, doing=doing, ignore=ignore)
    return data


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist (``n[1-3,5],gpu-a[01-02]``) into names, in order, keeping zero
    padding (python-hostlist, the parser Slurm sites use); Slurm's ``(null)`` is no host."""
    text = text.strip()
    if not text or text in {"(null)", "None"}:
        return []
    try:
        return [str(name) for name in hostlist.expand_hostlist(text)]
    except hostlist.BadHostlist as exc:
        raise BackendError(f"Slurm reported a host list that cannot be read: {text[:200]!r} ({exc})") from exc


def parse_index_list(text: str) -> tuple[int, ...]:
    """``0-1,3`` -> (0, 1, 3); ``N/A`` or empty -> ()."""
    out: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item or not item[0].isdigit():
            continue
        lo, _, hi = item.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


_GRES_ITEM = re.compile(
    r"(?P<name>[^:,()]+)(?::(?P<type>[^:,()]+))?(?::(?P<count>\d+))?(?:\((?P<extra>[^)]*)\))?"
)


def parse_gres(text: str) -> list[tuple[str, str, int, tuple[int, ...]]]:
    """Split a GRES string into (name, type, count, indices).

    ``gpu:a100:4`` -> [("gpu", "a100", 4, ())]; ``gpu:a100:2(IDX:0-1)`` -> [("gpu", "a100", 2, (0, 1))];
    ``gpu:4(S:0)`` -> [("gpu", "", 4, ())].  ``(null)``, ``N/A`` and empty give [].
    """
    out: list[tuple[str, str, int, tuple[int, ...]]] = []
    depth = 0
    start = 0
    items: list[str] = []
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    for raw in (i.strip() for i in items):
        if not raw or raw in {"(null)", "N/A"}:
            continue
        m = _GRES_ITEM.fullmatch(raw)
        if m is None:
            continue
        kind, count = m.group("type") or "", m.group("count")
        if count is None and kind.isdigit():  # "gpu:4": the second field is the count
            kind, count = "", kind
        idx: tuple[int, ...] = ()
        extra = m.group("extra") or ""
        if extra.startswith("IDX:"):
            idx = parse_index_list(extra[4:])
        out.append((m.group("name"), kind, int(count or 1), idx))
    return out


def tres_gpu_types(text: str) -> set[str]:
    """GPU types a job asks for, from ``tres_per_node`` (``gres:gpu:a100:2``; newer: ``gres/gpu:a100=2``)."""
    items = [re.sub(r"^gres[:/]", "", item).replace("=", ":") for item in text.split(",")]
    return {kind or "gpu" for name, kind, _, _ in parse_gres(",".join(items)) if name == "gpu"}


def node_status(state: str, flags: Iterable[str]) -> NodeStatus:
    """Map a v0.0.38 node ``state`` + ``state_flags`` to Berth's three states (a down flag wins)."""
    words = {state.upper(), *(f.upper() for f in flags)}
    if words & {"DOWN", "NOT_RESPONDING", "FAIL", "FAILING", "FUTURE", "UNKNOWN", "POWERED_DOWN", "INVAL"}:
        return NodeStatus.DOWN
    if words & {"DRAIN", "DRAINED", "DRAINING", "MAINTENANCE", "REBOOT_REQUESTED"}:
        return NodeStatus.DRAINING
    return NodeStatus.UP


def _natural_key(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(tok)) if tok.isdigit() else (1, tok) for tok in re.findall(r"\d+|\D+", name)]


def gpu_id_table(
    node_gpus: Mapping[str, int], *, explicit: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, tuple[int, ...]]:
    """Berth GPU ids of each node, by GRES index.

    A node in ``explicit`` gets its configured ids (cut to its GPU count; when fewer ids are configured
    than it has GPUs, only those are Berth's).  The others are numbered consecutively in natural name
    order, starting above every configured id so that the two never collide.
    """
    explicit = explicit or {}
    table: dict[str, tuple[int, ...]] = {}
    next_id = max((g for ids in explicit.values() for g in ids), default=-1) + 1
    for node in sorted(node_gpus, key=_natural_key):
        count = node_gpus[node]
        if node in explicit:
            table[node] = tuple(explicit[node])[:count]
        else:
            table[node] = tuple(range(next_id, next_id + count))
            next_id += count
    return table


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """Nodes as Berth sees them plus what is needed to translate back (GRES type per node, id table)."""

    nodes: tuple[Node, ...]
    gpu_ids: Mapping[str, tuple[int, ...]]
    gres_types: Mapping[str, str] = field(default_factory=dict)  # node -> Slurm's GPU type ("" untyped)

    def node_of_gpu(self, gpu_id: int) -> tuple[str, int] | None:
        """(node name, GRES index) of a Berth GPU id."""
        for node, ids in self.gpu_ids.items():
            if gpu_id in ids:
                return node, ids.index(gpu_id)
        return None


def parse_nodes(
    text: str,
    *,
    gpu_ids: Mapping[str, tuple[int, ...]] | None = None,
    gpu_types: Mapping[str, str] | None = None,
) -> NodeInventory:
    """Nodes with GPUs from a ``GET /nodes`` answer (nodes without a gpu GRES are not Berth's).

    ``gpu_types`` renames Slurm's GRES types to Berth's GPU type names (unlisted types keep theirs).
    """
    data = load_json(text, doing="list nodes")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list):
        raise BackendError("list nodes: answer has no 'nodes' list")
    kinds: dict[str, str] = {}
    counts: dict[str, int] = {}
    statuses: dict[str, NodeStatus] = {}
    for raw in raw_nodes:
        gpus = [g for g in parse_gres(str(raw.get("gres") or "")) if g[0] == "gpu"]
        if not gpus:
            continue
        name = str(raw["name"])
        kinds[name] = gpus[0][1]
        counts[name] = sum(g[2] for g in gpus)
        statuses[name] = node_status(str(raw.get("state", "unknown")), raw.get("state_flags") or ())
    table = gpu_id_table(counts, explicit=gpu_ids)
    names = gpu_types or {}
    nodes = tuple(
        Node(
            id=name,
            gpu_type=names.get(kinds[name], kinds[name] or "gpu"),
            gpu_ids=table[name],
            status=statuses[name],
        )
        for name in sorted(counts, key=_natural_key)
    )
    return NodeInventory(nodes=nodes, gpu_ids=table, gres_types=kinds)


_TERMINAL = {
    "COMPLETED": ObservedState.COMPLETED,
    "FAILED": ObservedState.FAILED,
    "TIMEOUT": ObservedState.FAILED,
    "OUT_OF_MEMORY": ObservedState.FAILED,
    "BOOT_FAIL": ObservedState.FAILED,
    "DEADLINE": ObservedState.FAILED,
    "SPECIAL_EXIT": ObservedState.FAILED,
    "CANCELLED": ObservedState.CANCELLED,
    "REVOKED": ObservedState.CANCELLED,
    "PREEMPTED": ObservedState.PREEMPTED,
    "NODE_FAIL": ObservedState.LOST,
}
_LIVE = {
    "PENDING": ObservedState.PENDING,
    "CONFIGURING": ObservedState.PENDING,
    "REQUEUED": ObservedState.PREEMPTED,
    "REQUEUE_HOLD": ObservedState.PREEMPTED,
    "REQUEUE_FED": ObservedState.PREEMPTED,
    "RUNNING": ObservedState.RUNNING,
    "COMPLETING": ObservedState.RUNNING,
    "SUSPENDED": ObservedState.RUNNING,  # still holds its GPUs
    "RESIZING": ObservedState.RUNNING,
    "SIGNALING": ObservedState.RUNNING,
    "STAGE_OUT": ObservedState.RUNNING,
}


def job_state(raw: Mapping[str, Any]) -> ObservedState:
    """Map one v0.0.38 job object to `ObservedState` (see the module docstring for the table).

    A held job is Berth's own preemption (requeuehold) or a hold Berth put before it started:
    preempted, so the engine may place it again.
    """
    state = str(raw.get("job_state", "")).upper()
    if str(raw.get("state_reason", "")) in _HELD_REASONS and state in {"PENDING", "COMPLETING"}:
        return ObservedState.PREEMPTED
    if state in _TERMINAL:
        return _TERMINAL[state]
    if state in _LIVE:
        return _LIVE[state]
    # A state this table does not know (a newer Slurm): report it lost with the reason, rather than
    # failing the whole snapshot; the caller's reconcile shows the message.
    return ObservedState.LOST


def _is_live(raw: Mapping[str, Any]) -> bool:
    return str(raw.get("job_state", "")).upper() in _LIVE


def job_gpu_ids(raw: Mapping[str, Any], gpu_ids: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Berth ids of the GPUs Slurm allocated, from ``gres_detail`` (one entry per allocated node)."""
    nodes = expand_hostlist(str(raw.get("nodes") or ""))
    out: list[int] = []
    for node, detail in zip(nodes, raw.get("gres_detail") or (), strict=False):
        ids = gpu_ids.get(node, ())
        for name, _kind, _count, idx in parse_gres(str(detail)):
            if name == "gpu":
                out.extend(ids[i] for i in idx if i < len(ids))
    return tuple(sorted(out))


def _epoch_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and 0 < value < 4_000_000_000 else None


def observe_job(
    raw: Mapping[str, Any], *, job_id: str, gpu_ids: Mapping[str, tuple[int, ...]]
) -> ObservedJob:
    """One Slurm job object as an `ObservedJob` of the Berth job ``job_id``."""
    state = job_state(raw)
    started = _epoch_or_none(raw.get("start_time"))
    ended = _epoch_or_none(raw.get("end_time"))
    slurm_state = str(raw.get("job_state", ""))
    reason = str(raw.get("state_reason", "None"))
    message = slurm_state if reason in {"None", ""} else f"{slurm_state} ({reason})"
    if state is ObservedState.LOST and slurm_state.upper() not in _TERMINAL:
        message = f"unmapped Slurm state {slurm_state}"
    restarts = raw.get("restart_cnt") or 0
    if restarts:
        message += f", restarts={restarts}"
    is_live_run = state is ObservedState.RUNNING or (
        state is ObservedState.PREEMPTED and slurm_state.upper() == "COMPLETING"
    )
    return ObservedJob(
        job_id=job_id,
        state=state,
        gpu_ids=job_gpu_ids(raw, gpu_ids) if is_live_run else (),
        # Pending jobs carry the *expected* start in start_time; only report starts that happened.
        started_at=started if state not in {ObservedState.PENDING} and raw.get("nodes") else None,
        ended_at=ended if str(raw.get("job_state", "")).upper() in _TERMINAL else None,
        backend_ref=str(raw.get("job_id", "")),
        message=message,
    )


def berth_jobs(raw_jobs: Iterable[Mapping[str, Any]], *, prefix: str) -> dict[str, Mapping[str, Any]]:
    """Berth id -> the Slurm job that represents it (live first, then the newest)."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for raw in raw_jobs:
        name = str(raw.get("name") or "")
        if not name.startswith(prefix) or len(name) == len(prefix):
            continue
        job_id = name[len(prefix) :]
        old = chosen.get(job_id)
        key = (_is_live(raw), int(raw.get("job_id") or 0))
        if old is None or key > (_is_live(old), int(old.get("job_id") or 0)):
            chosen[job_id] = raw
    return chosen


def parse_jobs(text: str, *, prefix: str, gpu_ids: Mapping[str, tuple[int, ...]]) -> tuple[ObservedJob, ...]:
    """Berth's jobs from a ``GET /jobs`` answer, sorted by Berth id."""
    data = load_json(text, doing="list jobs")
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list):
        raise BackendError("list jobs: answer has no 'jobs' list")
    chosen = berth_jobs(raw_jobs, prefix=prefix)
    return tuple(observe_job(chosen[j], job_id=j, gpu_ids=gpu_ids) for j in sorted(chosen))


def signalled_at(raw: Mapping[str, Any]) -> float | None:
    """When Berth sent the grace signal to the job's current run, from its comment (None: not yet).

    A mark older than the run's start belongs to an earlier run (Slurm requeued the job by itself).
    """
    comment = str(raw.get("comment") or "")
    if not comment.startswith(SIGNAL_MARK):
        return None
    try:
        at = float(comment[len(SIGNAL_MARK) :])
    except ValueError:
        return None
    started = _epoch_or_none(raw.get("start_time"))
    return None if started is not None and at < started else at


# Bytes read from the end of an output file: the tail of a huge log costs no more than this.
_OUTPUT_READ_BYTES = 256 * 1024


def expand_output_path(pattern: str, *, job_ref: str, name: str, user: str, working_directory: str) -> str:
    """Slurm's output filename pattern (``%j``, ``%x``, ``%u``, ``%%``) for one job, made absolute."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern):
            code = pattern[i + 1]
            out.append(
                {"j": job_ref, "J": job_ref, "A": job_ref, "x": name, "u": user, "%": "%"}.get(
                    code, "%" + code
                )
            )
            i += 2
            continue
        out.append(ch)
        i += 1
    path = "".join(out)
    if not path.startswith("/"):
        path = working_directory.rstrip("/") + "/" + path
    return path


def exit_code_of(raw: Any) -> int | None:
    """A job's exit code from slurmrestd's wait status (v0.0.38: exit code << 8 | signal);
    a job killed by a signal gets 128 + the signal, as shells report it."""
    if isinstance(raw, dict):  # newer plugins: {"return_code": n, "signal": {...}}
        raw = raw.get("return_code")
    if isinstance(raw, bool) or not isinstance(raw, int):
        return None
    status = int(raw)
    if status & 0x7F:
        return 128 + (status & 0x7F)
    return status >> 8


def read_tail(path: str, *, lines: int) -> tuple[str, bool] | None:
    """The last ``lines`` lines of a file (reading at most its last 256 KiB), None if it is absent."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _OUTPUT_READ_BYTES))
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BackendError(f"read {path}: {exc}") from exc
    text, cut = tail(data.decode("utf-8", errors="replace"), lines)
    return text, cut or size > _OUTPUT_READ_BYTES


def slurm_time(epoch_s: float) -> str:
    """Epoch seconds as scontrol's local ``YYYY-MM-DDTHH:MM:SS`` (scontrol parses in the same TZ)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch_s))


def reservation_name(holder_id: str, *, prefix: str) -> str:
    """A reservation name scontrol accepts for a Berth holder id (no spaces, '=' or commas)."""
    return prefix + re.sub(r"[^A-Za-z0-9_.-]", "_", holder_id)


# ---- the backend ----


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


class SlurmBackend:
    """`ClusterBackend` for a Slurm cluster reached through slurmrestd (see the module docstring)."""

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
        """slurmdbd's job records from ``GET /slurmdb/v0.0.38/jobs`` (see "Accounting" above).

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

    def snapshot(self) -> ObservedCluster:
        """What really runs: GPU nodes and Berth's jobs.  Raises `BackendError` when Slurm is unreachable."""
        inventory = self.inventory()
        raw = self._raw_jobs()
        jobs = tuple(observe_job(raw[j], job_id=j, gpu_ids=inventory.gpu_ids) for j in sorted(raw))
        return ObservedCluster(at=self._clock(), nodes=inventory.nodes, jobs=jobs)

    # -- writes --

    def apply(
        self,
        plan: Plan,
        *,
        payloads: Mapping[str, SlurmJobPayload | Mapping[str, Any]] | None = None,
    ) -> list[ActionResult]:
        """Carry out the plan's starts, preemptions, reservations and releases, one result each.

        Idempotent: call it every round with the current plan.  Raises `BackendError` when Slurm is
        unreachable (nothing after that point was attempted); per-action refusals are failed results.
        """
        results: list[ActionResult] = []
        if not (plan.starts or plan.preemptions or plan.reservations or plan.releases):
            return results
        inventory = self.inventory()
        jobs = self._raw_jobs()
        reservations = self.reservations() if (plan.starts or plan.reservations or plan.releases) else {}
        for release in plan.releases:
            results.append(self._guard("release", release.holder_id, partial(self._release, release)))
        for reserve in plan.reservations:
            do_reserve = partial(self._reserve, reserve, inventory=inventory, existing=reservations)
            results.append(self._guard("reserve", reserve.holder_id, do_reserve))
        if plan.reservations:
            reservations = self.reservations()  # starts below may go into the ones just made
        for preempt in plan.preemptions:
            do_preempt = partial(self._preempt, preempt, jobs.get(preempt.job_id))
            results.append(self._guard("preempt", preempt.job_id, do_preempt))
        for start in plan.starts:
            payload = (payloads or {}).get(start.job_id)
            if payload is None and self._payload_source is not None:
                payload = self._payload_source(start.job_id)
            do_start = partial(
                self._start,
                start,
                payload,
                inventory=inventory,
                existing=jobs.get(start.job_id),
                reservations=reservations,
            )
            results.append(self._guard("start", start.job_id, do_start))
        return results

    def cancel(self, job_id: str) -> ActionResult:
        """Cancel Berth job ``job_id``; a job that is gone or already ended counts as cancelled."""

        def do() -> tuple[str, str]:
            raw = self._raw_jobs().get(job_id)
            if raw is None or not _is_live(raw):
                return "nothing to cancel: " + ("not in Slurm" if raw is None else str(raw["job_state"])), ""
            ref = str(raw["job_id"])
            if self.config.dry_run:
                return f"dry-run: would cancel Slurm job {ref}", ref
            self._request("DELETE", f"/job/{ref}", doing=f"cancel job {ref}")
            return f"cancelled Slurm job {ref}", ref

        return self._guard("cancel", job_id, do)

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

    def _guard(self, action: str, target: str, do: Callable[[], tuple[str, str]]) -> ActionResult:
        """Run one action: refusals become a failed result, unreachable Slurm propagates."""
        try:
            message, ref = do()
        except SlurmRejectedError as exc:
            return ActionResult(action, target, is_ok=False, message=str(exc))
        return ActionResult(action, target, is_ok=True, message=message, backend_ref=ref)

    def _start(
        self,
        action: StartAction,
        payload: SlurmJobPayload | Mapping[str, Any] | None,
        *,
        inventory: NodeInventory,
        existing: Mapping[str, Any] | None,
        reservations: Mapping[str, Mapping[str, Any]],
    ) -> tuple[str, str]:
        placement = self._placement(action, inventory)
        gres = ",".join(
            f"gpu:{kind}:{count}" if kind else f"gpu:{count}"
            for kind, count in sorted(set(placement.values()))
        )
        nodelist = ",".join(placement)
        resv = self._covering_reservation(list(placement), reservations)
        replaced = ""
        if existing is not None and job_state(existing) is ObservedState.PREEMPTED and _is_live(existing):
            if str(existing.get("job_state", "")).upper() == "COMPLETING":
                # Still being killed by the requeue: released now it would look running while it is
                # stopping.  Refuse this round; the next one finds it pending and held.
                raise SlurmRejectedError(
                    f"Slurm job {existing['job_id']} is still stopping after its preemption; retry"
                )
            held_types = tres_gpu_types(str(existing.get("tres_per_node") or ""))
            if held_types == {kind or "gpu" for kind, _ in placement.values()}:
                return self._release_held(existing, nodelist=nodelist, gres=gres, reservation=resv)
            # Slurm 22.05 leaves a pending job whose GRES *type* is updated never runnable
            # (BadConstraints), so a move to another GPU type is a fresh submission.
            if payload is None:
                raise SlurmRejectedError("moving a requeued job to another GPU type needs its payload")
            replaced = str(existing["job_id"])
        elif existing is not None and _is_live(existing):
            return f"already submitted as Slurm job {existing['job_id']}", str(existing["job_id"])
        if payload is None:
            raise SlurmRejectedError("no payload for this job")
        spec = payload if isinstance(payload, SlurmJobPayload) else SlurmJobPayload.from_mapping(payload)
        limit_s = spec.time_limit_s or self.config.default_time_limit_s
        job: dict[str, Any] = {
            "name": self.config.job_name_prefix + action.job_id,
            "partition": self.config.partition,
            "nodelist": nodelist,  # accepted by v0.0.38 though its spec omits it
            "gres": gres,
            "requeue": True,
            "time_limit": max(1, math.ceil(limit_s / 60)),
            "current_working_directory": spec.working_directory or self.config.working_directory,
            "standard_output": spec.standard_output or self.config.standard_output,
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", **spec.environment},
        }
        if resv:
            job["reservation"] = resv
        if spec.cpus_per_task:
            job["cpus_per_task"] = spec.cpus_per_task
        if spec.memory_per_node_mib:
            job["memory_per_node"] = spec.memory_per_node_mib
        if self.config.dry_run:
            return f"dry-run: would submit on {nodelist} with gres {gres}", ""
        if replaced:
            self._request("DELETE", f"/job/{replaced}", doing=f"cancel held job {replaced}")
        data = self._request("POST", "/job/submit", doing="submit", body={"script": spec.script, "job": job})
        ref = str(data.get("job_id", ""))
        message = f"submitted on {nodelist} with gres {gres}" + (f" in {resv}" if resv else "")
        if replaced:
            message += f", replacing requeued Slurm job {replaced} (other GPU type)"
        return message, ref

    def _placement(self, action: StartAction, inventory: NodeInventory) -> dict[str, tuple[str, int]]:
        """Planned node -> (GPU type, GPU count) from the action's GPU ids."""
        counts: dict[str, int] = {}
        for gpu in action.gpu_ids:
            where = inventory.node_of_gpu(gpu)
            if where is None:
                raise SlurmRejectedError(f"GPU id {gpu} is on no Slurm node")
            counts[where[0]] = counts.get(where[0], 0) + 1
        for node in action.node_ids:
            counts.setdefault(node, 0)
        if not counts or set(counts) != set(action.node_ids or counts):
            raise SlurmRejectedError(
                f"GPU ids {action.gpu_ids} are not on the planned nodes {action.node_ids}"
            )
        if len(set(counts.values())) > 1:
            raise SlurmRejectedError("Slurm's gres is per node: every planned node needs the same GPU count")
        out: dict[str, tuple[str, int]] = {}
        for node in sorted(counts, key=_natural_key):
            if node not in inventory.gres_types:
                raise SlurmRejectedError(f"node {node} has no GPUs in Slurm")
            out[node] = (inventory.gres_types[node], counts[node])
        return out

    def _covering_reservation(
        self, nodes: Sequence[str], reservations: Mapping[str, Mapping[str, Any]]
    ) -> str | None:
        now = self._clock()
        for name in sorted(reservations):
            resv = reservations[name]
            if (resv.get("end_time") or 0) <= now:
                continue
            if set(nodes) <= set(expand_hostlist(str(resv.get("node_list") or ""))):
                return name
        return None

    def _release_held(
        self, raw: Mapping[str, Any], *, nodelist: str, gres: str, reservation: str | None
    ) -> tuple[str, str]:
        ref = str(raw["job_id"])
        if self.config.dry_run:
            return f"dry-run: would release held Slurm job {ref} on {nodelist}", ref
        # begin_time "now": a requeue pushes BeginTime ~2 min ahead; the comment loses the signal mark.
        update: dict[str, Any] = {"nodelist": nodelist, "gres": gres, "begin_time": "now", "comment": ""}
        if reservation:
            update["reservation"] = reservation
        self._request("POST", f"/job/{ref}", doing=f"place job {ref}", body=update)
        self._request("POST", f"/job/{ref}", doing=f"release job {ref}", body={"hold": False})
        return f"released requeued Slurm job {ref} on {nodelist} with gres {gres}", ref

    def _preempt(self, action: PreemptAction, raw: Mapping[str, Any] | None) -> tuple[str, str]:
        if raw is None:
            raise SlurmRejectedError("no Slurm job for this Berth id")
        ref = str(raw["job_id"])
        state = job_state(raw)
        if state is ObservedState.PREEMPTED:
            return "already requeued and held", ref
        if not _is_live(raw):
            return f"already ended ({raw.get('job_state')})", ref
        if state is ObservedState.PENDING:
            # Never started: nothing to signal or requeue (Slurm refuses both); hold it for Berth.
            if self.config.dry_run:
                return f"dry-run: would hold pending Slurm job {ref}", ref
            self._request("POST", f"/job/{ref}", doing=f"hold job {ref}", body={"hold": True})
            return "held before it started", ref
        now = self._clock()
        if now < action.signal_at:
            return f"signal due at {slurm_time(action.signal_at)}", ref
        notes: list[str] = []
        if signalled_at(raw) is None:
            if self.config.dry_run:
                notes.append(f"dry-run: would send SIG{self.config.preempt_signal}")
            else:
                self._request(
                    "DELETE",
                    f"/job/{ref}",
                    doing=f"signal job {ref}",
                    params={"signal": self.config.preempt_signal},
                )
                self._request(
                    "POST",
                    f"/job/{ref}",
                    doing=f"mark job {ref}",
                    body={"comment": f"{SIGNAL_MARK}{math.ceil(now)}"},
                )
                notes.append(f"sent SIG{self.config.preempt_signal}")
                if now >= action.kill_at:
                    notes.append("the grace period had already passed")
        else:
            notes.append("already signalled")
        if now >= action.kill_at:
            if self.config.dry_run:
                notes.append("dry-run: would requeue and hold")
            else:
                self._requeue_hold(ref)
                notes.append("requeued and held")
        return ", ".join(notes), ref

    def _requeue_hold(self, ref: str) -> None:
        try:
            self._scontrol("requeuehold", ref)
        except SlurmRejectedError:
            # Lost a race (it ended or was requeued meanwhile): fine if it is now held or over.
            data = self._request("GET", f"/job/{ref}", doing=f"show job {ref}")
            raw = (data.get("jobs") or [{}])[0]
            if job_state(raw) is not ObservedState.PREEMPTED and _is_live(raw):
                raise

    def _reserve(
        self,
        action: ReserveAction,
        *,
        inventory: NodeInventory,
        existing: Mapping[str, Mapping[str, Any]],
    ) -> tuple[str, str]:
        name = reservation_name(action.holder_id, prefix=self.config.reservation_prefix)
        now = self._clock()
        if action.end_at <= now:
            return "window already over: nothing to reserve", name
        nodes: set[str] = set()
        for gpu in action.gpu_ids:
            where = inventory.node_of_gpu(gpu)
            if where is None:
                raise SlurmRejectedError(f"GPU id {gpu} is on no Slurm node")
            nodes.add(where[0])
        if not nodes:
            raise SlurmRejectedError("a reservation needs GPU ids")
        node_list = ",".join(sorted(nodes, key=_natural_key))
        end = slurm_time(action.end_at)
        current = existing.get(name)
        if current is not None:
            same_nodes = set(expand_hostlist(str(current.get("node_list") or ""))) == nodes
            if same_nodes and abs(float(current.get("end_time") or 0) - math.floor(action.end_at)) < 1:
                return "already reserved", name
            args = [
                "update",
                "reservation",
                f"ReservationName={name}",
                f"Nodes={node_list}",
                f"EndTime={end}",
            ]
            if float(current.get("start_time") or 0) > now and action.start_at > now:
                args.append(f"StartTime={slurm_time(action.start_at)}")
            verb = "updated"
        else:
            start = "now" if action.start_at <= now else slurm_time(action.start_at)
            args = [
                "create",
                "reservation",
                f"ReservationName={name}",
                f"StartTime={start}",
                f"EndTime={end}",
                f"Nodes={node_list}",
                f"Users={self.config.user}",
                "Flags=FLEX,IGNORE_JOBS,OVERLAP",
            ]
            verb = "created"
        if self.config.dry_run:
            return f"dry-run: would run scontrol {' '.join(args)}", name
        self._scontrol(*args)
        return f"{verb} reservation on {node_list} until {end}", name

    def _release(self, action: ReleaseAction) -> tuple[str, str]:
        name = reservation_name(action.holder_id, prefix=self.config.reservation_prefix)
        if name not in self.reservations():
            return "no such reservation: nothing to release", name
        if self.config.dry_run:
            return f"dry-run: would delete reservation {name}", name
        try:
            self._scontrol("delete", f"ReservationName={name}")
        except SlurmRejectedError:
            if name in self.reservations():
                raise
        return "deleted reservation", name
