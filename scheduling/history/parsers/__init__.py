"""Parsers for job-history dumps: text in, ``HistoryRecord``s and ``Skip``s out (pure, no Django).

Formats:

* ``sacct``: ``sacct --parsable2`` output with its header line (``|``-separated).  Fields read
  (others are ignored, order is free): ``JobID`` (required; steps such as ``12.batch`` are
  skipped), ``JobName``, ``User``, ``Account``, ``Partition``, ``Submit``, ``Start``, ``End``
  (``YYYY-MM-DDTHH:MM:SS`` in the Slurm host's zone, ``Unknown``/``None`` when unset),
  ``Timelimit`` (``[D-]HH:MM:SS``, ``MM:SS``, ``UNLIMITED``), ``State`` (``COMPLETED``,
  ``FAILED``, ``TIMEOUT``, ``OUT_OF_MEMORY``, ``NODE_FAIL``, ``CANCELLED by N``, ...),
  ``ExitCode`` (``code:signal``), and the GPUs from ``AllocTRES`` (else ``ReqTRES``,
  ``AllocGRES``, ``ReqGRES``): ``gres/gpu:TYPE=N`` or ``gres/gpu=N`` (or ``gpu:TYPE:N``).
  A dump to feed it::

      sacct -a -X --parsable2 -S 2025-01-01 -E now \\
        --format=JobID,JobName,User,Account,Partition,Submit,Start,End,Timelimit,State,ExitCode,AllocTRES,ReqTRES

* ``slurmrestd``: slurmdbd's job records as slurmrestd's accounting API answers them
  (``GET /slurmdb/v0.0.38/jobs``, Slurm 22.05), read by `parse_slurmdb_jobs`: the same fields as
  the ``sacct`` path, from ``job_id`` (array tasks ``<array job>_<task>``, het components
  ``<het job>+<offset>``), ``name``, ``user``, ``account``, ``state.current``, ``time.submission``/
  ``start``/``end`` (epoch seconds), ``time.limit`` (minutes), ``exit_code`` and the GPUs from
  ``tres.allocated`` (else ``tres.requested``) entries ``{"type": "gres", "name": "gpu:a100", "count": 2}``.
* ``swf``: the Standard Workload Format of the Parallel Workloads Archive (18 whitespace
  fields; ``;`` comments, ``; UnixStartTime: N`` gives the epoch).  One allocated processor
  counts as one GPU (as in the shared traces); users and groups become ``u<id>``/``g<id>``.
* ``scontrol``: ``scontrol show job -o`` (one job per line, ``Key=Value``): what a Slurm
  without slurmdbd still tells about finished jobs (for ``MinJobAge`` seconds).  GPUs come
  from ``TresPerNode``/``TresPerJob`` (``gres:gpu:a100:2``, times ``NumNodes`` per node), else
  ``AllocTRES``/``TRES``.
* ``trace``: the shared trace CSV (``job_id,user,group,submit_time,start_time,end_time,
  num_gpus,gpu_type,status[,requested_time]``; seconds since the trace's epoch).

One module per format (``sacct``, ``slurmdb``, ``scontrol``, ``swf``, ``trace``) and ``records``;
import the names below from ``scheduling.history.parsers``.
"""

from __future__ import annotations

from scheduling.history.parsers.records import HistoryRecord, Parsed, Skip, Status
from scheduling.history.parsers.sacct import gpus_from_tres, parse_sacct, slurm_duration_s
from scheduling.history.parsers.scontrol import parse_scontrol
from scheduling.history.parsers.slurmdb import parse_slurmdb_jobs
from scheduling.history.parsers.swf import parse_swf
from scheduling.history.parsers.trace import parse_trace_csv

__all__ = [
    "HistoryRecord",
    "Parsed",
    "Skip",
    "Status",
    "gpus_from_tres",
    "parse_sacct",
    "parse_scontrol",
    "parse_slurmdb_jobs",
    "parse_swf",
    "parse_trace_csv",
    "slurm_duration_s",
]
