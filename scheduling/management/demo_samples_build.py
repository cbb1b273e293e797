"""Rebuild the small trace samples the demo lab ships, from the real traces.

    python -m scheduling.management.demo_samples_build /path/to/traces

The demo lab uses the real traces when ``settings.TRACES_DIR`` has them and these samples
otherwise, so the project runs without the shared folder.  Both files are deterministic
functions of their source, so re-running this changes nothing.
"""

from __future__ import annotations

import csv
import gzip
import io
import sys
from collections import defaultdict
from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parent / "commands" / "demo_samples"
NODES_FILE = "alibaba_openb_2023_nodes.csv.gz"
JOBS_FILE = "pwa_kth_sp2_1996.csv.gz"
# One node in four of every (GPU type, GPUs per node) group, so the mix survives; the demo lab
# divides its --scale by this fraction when it reads the sample.
NODE_SAMPLE_FRACTION = 0.25
# The last 120 days of the KTH log, one job in five: months of history with the log's real
# daily and weekly rhythm, at a fifth of its load.
JOBS_SAMPLE_DAYS = 120
JOBS_SAMPLE_EVERY = 5


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with gzip.open(path, "rt", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def _write(path: Path, header: list[str], rows: list[dict[str, str]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    # mtime=0 keeps the gzip bytes identical across rebuilds.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(buf.getvalue().encode())


def build(traces_dir: Path) -> None:
    """Write the node and job samples from the real traces in ``traces_dir``."""
    header, nodes = _read(traces_dir / NODES_FILE)
    groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for row in nodes:
        groups[(row["gpu_type"], row["num_gpus"])].append(row)
    every = round(1 / NODE_SAMPLE_FRACTION)
    picked = [row for key in sorted(groups) for row in sorted(groups[key], key=lambda r: r["node"])[::every]]
    _write(SAMPLES_DIR / NODES_FILE, header, sorted(picked, key=lambda r: r["node"]))

    header, jobs = _read(traces_dir / JOBS_FILE)
    last_submit = max(int(r["submit_time"]) for r in jobs)
    recent = [r for r in jobs if int(r["submit_time"]) >= last_submit - JOBS_SAMPLE_DAYS * 86_400]
    _write(SAMPLES_DIR / JOBS_FILE, header, recent[::JOBS_SAMPLE_EVERY])


if __name__ == "__main__":
    build(
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "shared" / "traces"
    )
