"""Cluster inventories for the simulator: a spec such as ``100x1`` or ``64x8:A100``, or a CSV.

GPU ids are dense integers ``0..capacity-1`` in node order, so a node's GPUs are contiguous.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import random
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from scheduling.engine.types import GpuType, Node

_FP = frozenset({"fp32", "fp16"})
_TF = frozenset({"fp64", "fp32", "tf32", "bf16", "fp16"})

# Published memory and precisions; relative_speed is dense fp16/bf16 training throughput
# relative to an A100 (rounded, vendor figures), value is the fair-share weight of one
# GPU-hour (roughly proportional to speed).  G1-G3 are Alibaba's undisclosed internal models:
# treated as mid-range (between T4 and V100) and documented as a guess.
KNOWN_GPU_TYPES: dict[str, GpuType] = {
    "H100": GpuType("H100", memory_gib=80, precisions=_TF | {"fp8"}, relative_speed=3.0, value=3.0),
    "A100": GpuType("A100", memory_gib=80, precisions=_TF, relative_speed=1.0, value=1.0),
    "A10": GpuType("A10", memory_gib=24, precisions=_FP | {"tf32", "bf16"}, relative_speed=0.4, value=0.4),
    "V100M32": GpuType("V100M32", memory_gib=32, precisions=_FP | {"fp64"}, relative_speed=0.45, value=0.45),
    "V100M16": GpuType("V100M16", memory_gib=16, precisions=_FP | {"fp64"}, relative_speed=0.45, value=0.4),
    "P100": GpuType("P100", memory_gib=16, precisions=_FP | {"fp64"}, relative_speed=0.2, value=0.2),
    "T4": GpuType("T4", memory_gib=16, precisions=_FP, relative_speed=0.2, value=0.2),
    "G1": GpuType("G1", memory_gib=16, precisions=_FP, relative_speed=0.3, value=0.3),
    "G2": GpuType("G2", memory_gib=24, precisions=_FP, relative_speed=0.35, value=0.35),
    "G3": GpuType("G3", memory_gib=32, precisions=_FP, relative_speed=0.4, value=0.4),
}

DEFAULT_GPU_TYPE = "A100"  # the type of ``NxG`` specs without ``:TYPE``

_SPEC_RE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*(?::\s*([A-Za-z0-9_.-]+))?\s*$")


class InventoryError(ValueError):
    """The cluster spec or inventory file cannot be understood."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """Nodes and GPU types of a simulated cluster."""

    name: str
    nodes: tuple[Node, ...]
    gpu_types: tuple[GpuType, ...]

    @property
    def capacity_gpus(self) -> int:
        return sum(len(node.gpu_ids) for node in self.nodes)


def gpu_type_spec(name: str) -> GpuType:
    """The spec of a known GPU type, or a neutral A100-like spec under the given name."""
    known = KNOWN_GPU_TYPES.get(name) or KNOWN_GPU_TYPES.get(name.upper())
    if known is not None:
        return known
    return GpuType(name)


def _build(name: str, node_specs: list[tuple[str, str, int]]) -> Inventory:
    nodes: list[Node] = []
    next_gpu = 0
    for node_id, type_name, count in node_specs:
        nodes.append(Node(id=node_id, gpu_type=type_name, gpu_ids=tuple(range(next_gpu, next_gpu + count))))
        next_gpu += count
    types = sorted({type_name for _, type_name, _ in node_specs})
    return Inventory(name=name, nodes=tuple(nodes), gpu_types=tuple(gpu_type_spec(t) for t in types))


def parse_cluster_spec(spec: str) -> Inventory:
    """``NxG[:TYPE]``: N nodes of G GPUs of one type (``DEFAULT_GPU_TYPE`` when omitted)."""
    match = _SPEC_RE.match(spec)
    if match is None:
        raise InventoryError(f"not a cluster spec NxG[:TYPE]: {spec!r}")
    count, per_node = int(match.group(1)), int(match.group(2))
    if count <= 0 or per_node <= 0:
        raise InventoryError(f"a cluster needs at least one node with one GPU: {spec!r}")
    type_name = gpu_type_spec(match.group(3) or DEFAULT_GPU_TYPE).name
    width = len(str(count - 1))
    return _build(spec, [(f"n{i:0{width}d}", type_name, per_node) for i in range(count)])


def _read_inventory_rows(path: Path) -> list[tuple[str, str, int]]:
    opener = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115
    with opener as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle:
        rows = []
        for row in csv.DictReader(handle):
            count = int(float(row["num_gpus"] or 0))
            if count > 0:
                rows.append((row["node"], (row.get("gpu_type") or "").strip() or DEFAULT_GPU_TYPE, count))
    if not rows:
        raise InventoryError(f"no GPU nodes in {path}")
    return rows


def scale_inventory_rows(
    rows: list[tuple[str, str, int]], *, scale: float, seed: int = 0
) -> list[tuple[str, str, int]]:
    """Sample whole nodes so that every (GPU type, node size) stratum keeps its share.

    Each stratum keeps ``round(n * scale)`` nodes, at least one node per GPU type, chosen
    with a seeded RNG; the result keeps the original node order.  Deterministic for a seed.
    """
    if not 0 < scale <= 1:
        raise InventoryError(f"--cluster-scale must be in (0, 1]: {scale}")
    if scale == 1:
        return list(rows)
    strata: dict[tuple[str, int], list[int]] = defaultdict(list)
    for index, (_, type_name, count) in enumerate(rows):
        strata[(type_name, count)].append(index)
    rng = random.Random(seed)
    kept: set[int] = set()
    for key in sorted(strata):
        members = strata[key]
        kept.update(rng.sample(members, round(len(members) * scale)))
    # Largest-remainder rounding can drop a small type altogether; keep one node of each type.
    present = {rows[i][1] for i in kept}
    for type_name in sorted({type_name for _, type_name, _ in rows} - present):
        candidates = [i for i, row in enumerate(rows) if row[1] == type_name]
        if math.ceil(sum(rows[i][2] for i in candidates) * scale) >= 1:
            kept.add(rng.choice(candidates))
    return [rows[i] for i in sorted(kept)]


def load_inventory(spec: str, *, scale: float = 1.0, seed: int = 0) -> Inventory:
    """An inventory from a spec (``NxG[:TYPE]``) or from an inventory CSV scaled by ``scale``.

    The CSV has columns ``node,gpu_type,num_gpus,...`` (gzip allowed).  ``scale`` applies to
    CSVs only: a spec already states its size.
    """
    if _SPEC_RE.match(spec):
        if scale != 1.0:
            raise InventoryError("--cluster-scale applies to inventory CSVs; write the size into the spec")
        return parse_cluster_spec(spec)
    path = Path(spec)
    if not path.exists():
        raise InventoryError(f"neither a cluster spec NxG[:TYPE] nor an existing file: {spec!r}")
    rows = scale_inventory_rows(_read_inventory_rows(path), scale=scale, seed=seed)
    name = path.name.removesuffix(".gz").removesuffix(".csv")
    if scale != 1.0:
        name = f"{name}@{scale:g}"
    return _build(name, rows)
