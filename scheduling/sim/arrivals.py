"""Contention without changing a workload's shape: the same jobs, arriving faster.

Some traces are samples of a cluster's work, not its whole load (the Alibaba 2023 pod list
peaks at about 1 % of its cluster's GPUs).  Shrinking the cluster is one way to make them
queue; `scale_arrivals` is the other: every gap between consecutive submissions is divided by
``factor``, so the order of arrivals, each job's size, type constraint, runtime and user
estimate stay exactly as logged, and the offered load (GPU-hours per hour) is ``factor`` times
the logged one.
"""

from __future__ import annotations

import dataclasses

from scheduling.sim.trace import Trace


def scale_arrivals(trace: Trace, factor: float) -> Trace:
    """``trace`` with inter-arrival gaps divided by ``factor`` (1 returns it unchanged).

    Submission times are measured from the trace's first submission (0 after `load_trace`).
    The week phase is kept as it is: with ``factor != 1`` the hour-of-week of a job no longer
    matches the log's calendar, so a time-of-week study should use ``factor == 1``.
    """
    if not factor > 0:
        raise ValueError(f"arrival scale must be > 0: {factor}")
    if factor == 1 or not trace.jobs:
        return trace
    origin = trace.jobs[0].submit_at
    jobs = tuple(
        dataclasses.replace(job, submit_at=origin + (job.submit_at - origin) / factor) for job in trace.jobs
    )
    return dataclasses.replace(trace, jobs=jobs)
