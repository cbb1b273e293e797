"""Pure parsers of slurmrestd answers: errors, hostlists, GRES, nodes, the GPU id table; scontrol times.

Tested on recorded slurmrestd answers."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import hostlist

from scheduling.backends.base import (
    BackendError,
    natural_key,
)
from scheduling.backends.slurm.config import SlurmRejectedError
from scheduling.engine.types import (
    Node,
    NodeStatus,
)

# Errors that mean "slurmctld/slurmrestd is not there" rather than "Slurm refused": below 2000 are
# Slurm's communication and protocol errors, -1 is what slurmrestd says when it got no answer at all.
_REJECTION_MIN_CODE = 2000


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
    for node in sorted(node_gpus, key=natural_key):
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
        for name in sorted(counts, key=natural_key)
    )
    return NodeInventory(nodes=nodes, gpu_ids=table, gres_types=kinds)


def slurm_time(epoch_s: float) -> str:
    """Epoch seconds as scontrol's local ``YYYY-MM-DDTHH:MM:SS`` (scontrol parses in the same TZ)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch_s))


def reservation_name(holder_id: str, *, prefix: str) -> str:
    """A reservation name scontrol accepts for a Berth holder id (no spaces, '=' or commas)."""
    return prefix + re.sub(r"[^A-Za-z0-9_.-]", "_", holder_id)
