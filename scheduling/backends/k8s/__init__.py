"""Kubernetes backend: Berth jobs as batch/v1 Jobs, driven through the official ``kubernetes`` client.

The package is named ``k8s`` so that it never shadows the ``kubernetes`` client package.  Modules: ``config``
(`KubernetesConfig`, `JobPayload`, names and labels), ``body`` (the Job manifest), ``observe`` (objects to
observed jobs, pure), ``client`` (API calls, paging, errors), ``backend`` (`KubernetesBackend`).

Configuration (`KubernetesConfig`)
    Exactly one way to reach the API server: ``host`` (+ ``token``, ``ca_cert``, ``verify_ssl``) for an
    explicit endpoint, ``in_cluster=True`` for the pod's service account, or ``kubeconfig`` (+ ``context``);
    with none of them set the default kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``) is loaded.
    `KubernetesConfig.from_env` reads ``BERTH_K8S_*`` variables (the backend's default when no config is
    given); secrets such as the token belong there, not in the cluster's stored settings.
    ``namespace`` holds every Berth Job.  ``timeout_s`` bounds every request and the client does not retry:
    the Celery task that called us retries on `BackendError`.  ``dry_run=True`` sends every write with the
    server-side ``dryRun=All``, so the API server validates and admits the object but persists nothing;
    reads are real.

Nodes and GPU ids
    `snapshot` lists the cluster's nodes.  A node counts when its allocatable ``nvidia.com/gpu``
    (``gpu_resource``) is at least 1; CPU-only nodes are not reported.  Its Berth GPU type is the value of
    the ``nvidia.com/gpu.product`` label (``gpu_product_label``, as set by NVIDIA GPU feature discovery)
    mapped through ``gpu_types`` (unmapped products keep the raw label value; a node without the label is
    ``unknown_gpu_type``).  Status: ``down`` when the ``Ready`` condition is not ``True`` or the node
    carries the not-ready/unreachable taint; ``draining`` when it is cordoned (``spec.unschedulable``) or
    carries a ``NoSchedule``/``NoExecute`` taint Berth pods do not tolerate (``tolerations`` lists the taint
    keys Berth pods tolerate, ``nvidia.com/gpu`` by default, because dedicated GPU nodes are commonly
    tainted with it); else ``up``.  Kubernetes has no GPU ids, so Berth numbers them: from ``gpu_ids`` (node
    name -> ids) when that mapping is configured, else deterministically by sorting GPU nodes by name in
    natural order (gpu-2 before gpu-10, as the Slurm backend does) and numbering their GPUs consecutively,
    above any configured id.  The enumeration shifts when a node is added, removed or changes its
    GPU count, which would mislabel the GPUs of jobs already running: production clusters should configure
    ``gpu_ids``.

Jobs, labels and annotations
    Each `StartAction` becomes one batch/v1 Job named ``berth-<job id>`` (sanitised to a DNS label), with
    ``backoffLimit: 0`` (Berth, not Kubernetes, decides about retries), pinned to the planned node by a
    required node affinity on ``metadata.name`` and selecting the node's GPU product label, requesting and
    limiting ``nvidia.com/gpu: n``, with ``priorityClassName`` from ``priority_classes`` (preemptible when
    the action is preemptible, else interactive or batch from the payload's kind).  A multi-node start
    becomes an Indexed Job with one pod per node (node affinity to the planned set plus pod anti-affinity on
    the hostname) and needs the same GPU count on every node.  Image, command, args, environment and extra
    requests come from a `JobPayload` (or a mapping for `JobPayload.from_mapping`) the caller supplies per
    job id (the Plan carries only ids): pass ``payloads`` to `apply` or a ``payload_source`` to the
    constructor; a missing or unusable payload is a failed result for that start.  The PriorityClass
    objects are the cluster admin's (Berth does not create them; a pod naming a missing class is refused
    by admission and the Job stays without pods).  Give them ``preemptionPolicy: Never`` so that
    kube-scheduler never preempts on its own: preemption is Berth's decision, with Berth's grace.  Job and
    pod template carry:

    - label ``berth.dev/job-id``: the Berth job id (a hash when the id is not a valid label value); selects
      Berth's objects;
    - label ``app.kubernetes.io/managed-by: berth`` and ``berth.dev/kind``;
    - annotation ``berth.dev/job-id``: the exact Berth job id;
    - annotation ``berth.dev/gpu-ids``: the planned GPU ids, comma separated.  Kubernetes' device plugin
      picks the devices itself and exposes no device index, so the ids Berth reports are the ones it
      *planned* when it created the Job, read back from this annotation;
    - annotation ``berth.dev/stop-reason`` (pods only): ``preempted`` or ``cancelled``, written just before
      Berth deletes a pod, so that a terminating pod is reported for what it is.

    Job/pod state maps to `ObservedState`: Job condition ``Complete`` -> completed, ``Failed`` -> failed
    (preempted when Kubernetes' own scheduler preempted the pod); a running pod -> running; a Job with no
    pod yet or a pending pod -> pending; a pod in phase ``Unknown`` -> lost; terminating pods -> preempted
    or cancelled after their stop reason, with their GPU ids still reported (the GPUs are busy until the pod
    is gone) and no end time yet.  Once Kubernetes has removed everything Berth no longer sees the job: the
    database knows it asked for the stop.

Preemption and cancel
    `PreemptAction`: delete the Job with ``propagationPolicy=Background`` and grace
    ``ceil(kill_at - signal_at)`` seconds, then annotate and delete each of its pods with the same grace
    (the kubelet sends SIGTERM now and SIGKILL after the grace).  The Job goes first so that its controller
    never counts or replaces a deleted pod.  The explicit pod deletes matter: the Job's own grace period is
    not passed on to its pods (kubernetes/kubernetes#25055), the garbage collector deletes them with the
    pod template's ``terminationGracePeriodSeconds`` (``termination_grace_s``), and a grace
    period, once set, can only shrink (kubernetes/kubernetes#8641); so the effective grace on a real
    cluster is ``min(planned, termination_grace_s)``: set ``termination_grace_s`` to at least the longest
    grace the policy grants.  `KubernetesBackend.cancel` does the same with ``termination_grace_s``.
    Before ``signal_at`` nothing is sent (as in the Slurm backend, a plan may be applied every round);
    pods already terminating are left alone.  Deleting what is already gone (404) is success; so is
    creating a Job that already exists for the same plan (409).  A 409 from a Job of an earlier attempt
    (still being deleted, finished, or on other GPUs) is a failed result: the next round retries.

Not supported
    Reservations: Kubernetes has none; `ReserveAction`/`ReleaseAction` succeed with a message saying so,
    because bookings are enforced by the engine holding the GPUs (nothing else schedules on them through
    Berth).  GPUs used by pods Berth did not create are invisible to the engine (allocatable is capacity,
    not use): keep the GPU nodes Berth schedules on dedicated to it.  Suspend/resume, checkpoint signals
    other than SIGTERM, GPU telemetry (idle detection) and watch streams are not implemented.

Errors
    Connection failures, timeouts, 401/403, 429 and 5xx raise `BackendError` (the caller retries the whole
    plan; every action is idempotent).  A 400/422 rejection of one object (an invalid image name, say) is
    specific to that action and comes back as a failed `ActionResult`, so one bad payload does not block the
    rest of the plan.
"""

from __future__ import annotations

from scheduling.backends.k8s.backend import KubernetesBackend
from scheduling.backends.k8s.config import (
    GPU_IDS_ANNOTATION,
    JOB_ID_ANNOTATION,
    JOB_ID_LABEL,
    STOP_REASON_ANNOTATION,
    JobPayload,
    KubernetesConfig,
    PayloadSource,
    PriorityClasses,
    job_label_value,
    job_name,
)

__all__ = [
    "GPU_IDS_ANNOTATION",
    "JOB_ID_ANNOTATION",
    "JOB_ID_LABEL",
    "STOP_REASON_ANNOTATION",
    "JobPayload",
    "KubernetesBackend",
    "KubernetesConfig",
    "PayloadSource",
    "PriorityClasses",
    "job_label_value",
    "job_name",
]
