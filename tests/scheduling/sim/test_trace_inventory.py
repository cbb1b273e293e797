"""Trace loading and cluster inventories."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest

from scheduling.sim.inventory import (
    InventoryError,
    load_inventory,
    parse_cluster_spec,
    scale_inventory_rows,
)
from scheduling.sim.trace import load_trace

SAMPLES = Path(__file__).resolve().parents[3] / "scheduling" / "sim" / "samples"

_CSV = """job_id,user,group,submit_time,start_time,end_time,num_gpus,gpu_type,status,requested_time
a,u1,g1,100,150,250,2,,completed,600
b,u2,g1,50,60,,1,,killed,100
c,,g2,120,,,1,,killed,
d,u3,g2,110,400,460,0,,completed,100
e,u1,g1,130,130,1130,4,A100,failed,
"""


def _write(tmp_path: Path, text: str, name: str = "mini.csv.gz") -> Path:
    path = tmp_path / name
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(text)
    return path


def test_loader_keeps_runtime_and_requested_time_and_counts_skips(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, _CSV))
    assert [job.id for job in trace.jobs] == ["a", "e"]  # submit order, shifted to start at 0
    assert trace.skipped_no_runtime == 2  # b (no end) and c (never started)
    assert trace.skipped_no_gpus == 1
    first, second = trace.jobs
    assert (first.submit_at, first.runtime_s, first.requested_s, first.gpu_count) == (0.0, 100.0, 600.0, 2)
    assert (second.submit_at, second.runtime_s, second.requested_s, second.gpu_type) == (
        30.0,
        1000.0,
        None,
        "A100",
    )
    assert trace.gpu_hours == pytest.approx((100 * 2 + 1000 * 4) / 3600)


def test_user_falls_back_to_group_and_limit_keeps_first_jobs(tmp_path: Path) -> None:
    text = _CSV.replace("c,,g2,120,,,1", "c,,g2,120,125,130,1")
    trace = load_trace(_write(tmp_path, text), limit_jobs=2)
    assert [job.id for job in trace.jobs] == ["a", "c"]
    assert trace.jobs[1].user == "g2"


def test_kth_sample_knows_its_week_phase() -> None:
    trace = load_trace(SAMPLES / "pwa_kth_sp2_1996_sample.csv.gz", limit_jobs=50)
    assert len(trace.jobs) == 50
    assert trace.jobs[0].submit_at == 0
    assert 0 < trace.week_phase_s < 7 * 86_400
    assert all(job.requested_s for job in trace.jobs)


def test_spec_builds_dense_gpu_ids() -> None:
    inventory = parse_cluster_spec("3x4:H100")
    assert inventory.capacity_gpus == 12
    assert [node.gpu_ids for node in inventory.nodes] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert {t.name for t in inventory.gpu_types} == {"H100"}
    assert "fp8" in inventory.gpu_types[0].precisions
    assert parse_cluster_spec("100x1").capacity_gpus == 100


@pytest.mark.parametrize("spec", ["x4", "0x8", "3x0", "3*4"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(InventoryError):
        load_inventory(spec)


def test_scaled_inventory_keeps_type_mix_and_node_sizes() -> None:
    full = load_inventory(str(SAMPLES / "alibaba_openb_2023_nodes.csv.gz"))
    scaled = load_inventory(str(SAMPLES / "alibaba_openb_2023_nodes.csv.gz"), scale=0.05, seed=3)
    again = load_inventory(str(SAMPLES / "alibaba_openb_2023_nodes.csv.gz"), scale=0.05, seed=3)
    assert [n.id for n in scaled.nodes] == [n.id for n in again.nodes]  # deterministic
    assert full.capacity_gpus == 6212
    assert 0.04 * full.capacity_gpus <= scaled.capacity_gpus <= 0.06 * full.capacity_gpus

    def shares(inv: object) -> dict[str, float]:
        per_type: Counter[str] = Counter()
        for node in inv.nodes:  # type: ignore[attr-defined]
            per_type[node.gpu_type] += len(node.gpu_ids)
        total = sum(per_type.values())
        return {name: count / total for name, count in per_type.items()}

    full_shares, scaled_shares = shares(full), shares(scaled)
    assert set(scaled_shares) == set(full_shares)  # every type survives
    for name in ("G2", "T4"):
        assert scaled_shares[name] == pytest.approx(full_shares[name], abs=0.05)
    full_sizes = {(n.gpu_type, len(n.gpu_ids)) for n in full.nodes}
    assert {(n.gpu_type, len(n.gpu_ids)) for n in scaled.nodes} <= full_sizes


def test_scale_rows_rejects_out_of_range() -> None:
    with pytest.raises(InventoryError):
        scale_inventory_rows([("n", "A100", 8)], scale=0)
    with pytest.raises(InventoryError):
        load_inventory("4x8", scale=0.5)
