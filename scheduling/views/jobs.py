"""Jobs: submit (with the predicted runtime beside the estimate), my jobs, cancel, one job's output."""

from __future__ import annotations

import zlib
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from portal.accounts.selectors import project_list
from portal.htmx import (
    UNPROCESSABLE,
    HtmxHttpRequest,
    redirect_after_post,
    refusal_text,
    render_page,
    row_action_redirect,
    service_errors_add,
)
from scheduling.alternatives import job_warnings
from scheduling.engine.types import JobRequest
from scheduling.forms import (
    JobForm,
)
from scheduling.models import GpuType, Job
from scheduling.ports import prediction_port
from scheduling.selectors import (
    cluster_list,
    gpu_type_list,
    job_list,
    jobs_waits_set,
)
from scheduling.services import (
    job_cancel,
    job_submit,
)

JOBS_TEMPLATE = "scheduling/my_jobs.html"
JOB_NEW_TEMPLATE = "scheduling/job_new.html"
JOBS_PER_PAGE = 50
JOB_DETAIL_TEMPLATE = "scheduling/job_detail.html"


_JOB_FORM_FIELDS = frozenset({"project", "name", "gpu_count", "gpu_type", "min_memory_gib", "precisions"})
# Service error keys whose form field has another name (the form takes hours and minutes).
_JOB_FIELD_ALIASES = {"requested_s": "requested_h", "checkpoint_interval_s": "checkpoint_interval_min"}


def _add_job_service_errors(form: JobForm, exc: ValidationError) -> None:
    service_errors_add(form, exc, fields=_JOB_FORM_FIELDS, aliases=_JOB_FIELD_ALIASES)


@login_required
@vary_on_headers("HX-Request")
@require_http_methods(["GET", "POST"])
def job_new(request: HtmxHttpRequest) -> HttpResponse:
    """Submit a batch job through ``job_submit``; the engine places it in a later round."""
    projects = project_list(request.user)
    gpu_types = gpu_type_list().filter(nodes__cluster__is_active=True).distinct()
    if request.method == "GET":
        form = JobForm(projects=projects, gpu_types=gpu_types)
        # Predict for the initial values at once (an unbound form is never valid: use a bound copy).
        first = projects.first()
        initial = {"project": first.slug if first else "", "gpu_count": "1", "requested_h": "1"}
        prediction = _job_prediction(request, JobForm(initial, projects=projects, gpu_types=gpu_types))
        return render_page(request, JOB_NEW_TEMPLATE, "job-form", {"form": form, "prediction": prediction})

    form = JobForm(request.POST, projects=projects, gpu_types=gpu_types)
    if not form.is_valid():
        context = {"form": form, "prediction": _job_prediction(request, form)}
        return render_page(request, JOB_NEW_TEMPLATE, "job-form", context, status=UNPROCESSABLE)
    data = form.cleaned_data
    try:
        job = job_submit(
            request.user,
            project=data["project"],
            name=data["name"],
            gpu_count=data["gpu_count"],
            gpu_type=data["gpu_type"],
            min_memory_gib=data["min_memory_gib"] or 0.0,
            precisions=data["precisions"],
            requested_s=form.requested_s(),
            is_preemptible=data["is_preemptible"],
            is_checkpointable=data["is_checkpointable"],
            checkpoint_interval_s=form.checkpoint_interval_s(),
            payload={"command": data["command"]},
        )
    except ValidationError as exc:
        _add_job_service_errors(form, exc)
        return render_page(request, JOB_NEW_TEMPLATE, "job-form", {"form": form}, status=UNPROCESSABLE)
    except PermissionDenied as exc:
        form.add_error("project", str(exc) or "You may not submit jobs for this project.")
        return render_page(request, JOB_NEW_TEMPLATE, "job-form", {"form": form}, status=UNPROCESSABLE)

    warnings = job_warnings(job)
    if warnings:
        messages.warning(request, f"Submitted {job.name}, but it cannot start as it is: {' '.join(warnings)}")
    else:
        messages.success(request, f"Submitted {job.name}: it waits for the next scheduling round.")
    return redirect_after_post(request, f"{reverse('my-jobs')}#job-row-{job.pk}")


@login_required
@vary_on_headers("HX-Request")
@require_GET
def my_jobs(request: HtmxHttpRequest) -> HttpResponse:
    """The user's jobs, newest first, a page at a time, optionally by status."""
    status = request.GET.get("status", "")
    valid_statuses = {value for value, _ in Job.Status.choices}
    jobs = job_list(request.user, mine_only=True, status=[status] if status in valid_statuses else ())
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    jobs_waits_set(page.object_list)
    context = {
        "page": page,
        "status": status if status in valid_statuses else "",
        "statuses": Job.Status.choices,
    }
    return render_page(request, JOBS_TEMPLATE, "job-list", context)


@login_required
@vary_on_headers("HX-Request")
@require_POST
def job_cancel_view(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """Cancel one of the user's pending or running jobs; htmx gets the updated row back."""
    job = job_list(request.user, mine_only=True).filter(pk=job_id).first()
    if job is None:
        raise Http404("No such job.")
    error = ""
    try:
        job_cancel(job, user=request.user)
    except (ValidationError, PermissionDenied) as exc:
        error = refusal_text(exc)
    if request.htmx:
        job = job_list(request.user, mine_only=True).get(pk=job_id)
        jobs_waits_set([job])
        return render(request, f"{JOBS_TEMPLATE}#job-row", {"job": job, "row_error": error})
    return row_action_redirect(request, error=error, success=f"Cancelled job {job.name}.", to="my-jobs")


@login_required
@vary_on_headers("HX-Request")
@require_GET
def job_detail(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """One of the user's jobs with the tail of its output and its exit code; htmx refreshes the output."""
    from scheduling.backends.base import BackendError
    from scheduling.selectors import job_output_get

    if not job_list(request.user, mine_only=True).filter(pk=job_id).exists():
        raise Http404("No such job.")
    error = ""
    try:
        job, output = job_output_get(request.user, job_id=job_id, tail_lines=200)
    except BackendError as exc:
        job, output = job_list(request.user, mine_only=True).get(pk=job_id), None
        error = f"The cluster cannot be reached right now ({exc}); try again in a minute."
    jobs_waits_set([job])
    context = {"job": job, "output": output, "output_error": error}
    return render_page(request, JOB_DETAIL_TEMPLATE, "job-output", context)


def runtime_predict(*, cluster_id: int, requests: list[JobRequest]) -> list[tuple[float, float]]:
    """(p50_s, p90_s) per request, from the forecasting app through the prediction port."""
    return prediction_port().runtime_predict(cluster_id=cluster_id, requests=requests)


def _job_prediction(request: HtmxHttpRequest, form: JobForm) -> dict[str, Any]:
    """The runtime predictor's p50/p90 for the job the form describes, and the user's estimate.

    Only the fields the predictor keys on matter (project, name, GPU type and count, the
    estimate); the others may still be incomplete.
    """
    form.is_valid()
    data = form.cleaned_data
    estimate_s = round(data["requested_h"] * 3600) if data.get("requested_h") else None
    result: dict[str, Any] = {"estimate_s": estimate_s, "p50_s": None, "p90_s": None}
    project, gpu_count = data.get("project"), data.get("gpu_count")
    if project is None or not gpu_count:
        return result
    gpu_type: GpuType | None = data.get("gpu_type")
    clusters = cluster_list().filter(is_active=True)
    if gpu_type is not None:
        clusters = clusters.filter(nodes__gpu_type=gpu_type)
    cluster = clusters.distinct().order_by("pk").first()
    if cluster is None:
        return result
    features = (
        request.user.get_username(),
        project.slug,
        data.get("name") or "",
        gpu_count,
        estimate_s,
        gpu_type.name if gpu_type else None,
    )
    request_ = prediction_port().job_engine_request(
        # The predictor caches a prediction per job id until it observes more history: a
        # preview's id is its features (negative, never a real job's), so equal forms share it
        # and different ones never get each other's answer.
        job_id=-1 - zlib.crc32(repr(features).encode()),
        username=features[0],
        project_slug=features[1],
        name=features[2],
        gpu_count=gpu_count,
        submitted_at=timezone.now(),
        requested_s=estimate_s,
        kind=Job.Kind.BATCH,
        gpu_type=features[5],
    )
    ((p50_s, p90_s),) = runtime_predict(cluster_id=cluster.pk, requests=[request_])
    result.update({"p50_s": p50_s, "p90_s": p90_s})
    # With no history for jobs like this one the predictor answers the estimate itself.
    result["is_estimate_only"] = estimate_s is not None and p50_s == p90_s == float(estimate_s)
    if estimate_s and p50_s:
        result["ratio"] = estimate_s / p50_s
    return result


@login_required
@vary_on_headers("HX-Request")
@require_GET
def job_prediction(request: HtmxHttpRequest) -> HttpResponse:
    """The "predicted runtime" box for the job form's values (htmx), or the form with it."""
    form = JobForm(
        request.GET,
        projects=project_list(request.user),
        gpu_types=gpu_type_list().filter(nodes__cluster__is_active=True).distinct(),
    )
    prediction = _job_prediction(request, form)
    if request.htmx:
        return render(request, f"{JOB_NEW_TEMPLATE}#job-prediction", {"prediction": prediction})
    return render(request, JOB_NEW_TEMPLATE, {"form": form, "prediction": prediction})
