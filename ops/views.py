"""Staff pages (DESIGN §7): utilization, fairness, idle reasons, capacity planning and what-if,
quotas and policy knobs, audit log.

Every view is staff only (anonymous: the sign-in page; signed-in non-staff: 403).  Pages
render in full, or one named partial for htmx (``page.html#name``, DOM id = partial name).
Every chart comes from a `Table`; ``?csv=<table name>`` downloads that same table as CSV.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, time, timedelta
from functools import wraps
from typing import Any
from urllib.parse import quote

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from ops import selectors, services
from ops.forms import (
    AuditFilterForm,
    PolicyForm,
    QuotaForm,
    QuotaNewForm,
    RangeForm,
    WeightForm,
)
from ops.selectors import Table
from portal.accounts.models import Project, Quota
from portal.htmx import UNPROCESSABLE, HtmxHttpRequest, redirect_after_post, render_page, service_errors_add

# 25 events a page: each lists its changed fields, so a page of 50 ran to about 6,000 px.
AUDIT_PAGE_SIZE = 25
IDLE_DRILL_PAGE_SIZE = 20


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Signed in (else the sign-in page) and staff (else 403)."""

    @wraps(view)
    def wrapped(request: HtmxHttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("Operations pages are for staff.")
        return view(request, *args, **kwargs)

    return login_required(wrapped)


def _csv(table: Table) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{table.name}.csv"'
    writer = csv.writer(response)
    writer.writerow(table.headers)
    for row in table.rows:
        writer.writerow(["" if v is None else v for v in row])
    return response


def _csv_or_none(request: HttpRequest, tables: Sequence[Table]) -> HttpResponse | None:
    wanted = request.GET.get("csv")
    if not wanted:
        return None
    for table in tables:
        if table.name == wanted:
            return _csv(table)
    raise Http404("No such table")


def _range(request: HttpRequest) -> tuple[RangeForm, int | None, selectors.Range]:
    clusters = selectors.cluster_list()
    data = {
        "cluster": request.GET.get("cluster") or (clusters[0].pk if clusters else ""),
        "days": request.GET.get("days") or 7,
        "bucket": request.GET.get("bucket") or "day",
    }
    form = RangeForm(data, clusters=clusters)
    if form.is_valid():
        d = form.cleaned_data
        return form, d["cluster"], selectors.range_get(days=d["days"], bucket=d["bucket"])
    return form, (clusters[0].pk if clusters else None), selectors.range_get(days=7, bucket="day")


def _is_asked_cluster(request: HttpRequest, cluster_id: int | None) -> bool:
    """Writes act on the cluster the URL names: an unknown one must not fall back to the first."""
    raw = request.GET.get("cluster")
    return cluster_id is not None and (not raw or raw == str(cluster_id))


def _query(form: RangeForm) -> str:
    return "&".join(f"{k}={form.data[k]}" for k in ("cluster", "days", "bucket") if form.data.get(k))


@staff_required
@require_GET
def home(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, "ops/home.html", {"clusters": selectors.cluster_list()})


def _range_page(
    request: HtmxHttpRequest, *, template: str, build: Callable[[int, selectors.Range], list[Table]]
) -> HttpResponse:
    form, cluster_id, rng = _range(request)
    tables = build(cluster_id, rng) if cluster_id is not None else []
    if (response := _csv_or_none(request, tables)) is not None:
        return response
    context = {"form": form, "tables": tables, "rng": rng, "query": _query(form), "cluster_id": cluster_id}
    return render_page(request, template, "ops-report", context)


def _range_view(
    template: str, build: Callable[[int, selectors.Range], list[Table]]
) -> Callable[..., HttpResponse]:
    """A staff report page over a cluster and a date range (``?cluster=&days=&bucket=``)."""

    @staff_required
    @vary_on_headers("HX-Request")
    @require_GET
    def view(request: HtmxHttpRequest) -> HttpResponse:
        return _range_page(request, template=template, build=build)

    return view


utilization = _range_view(
    "ops/utilization.html", lambda cid, rng: selectors.utilization_get(cluster_id=cid, rng=rng)
)
fairness = _range_view(
    "ops/fairness.html",
    lambda cid, rng: [
        *selectors.fairness_get(cluster_id=cid, rng=rng),
        selectors.runtime_accuracy_get(cluster_id=cid, rng=rng),
    ],
)
idle = _range_view("ops/idle.html", lambda cid, rng: [selectors.idle_get(cluster_id=cid, rng=rng)])


@staff_required
@require_GET
def idle_drill(request: HtmxHttpRequest) -> HttpResponse:
    """GPUs and pending jobs of the latest round in one period (``?cluster=&period=&bucket=``)."""
    form, cluster_id, rng = _range(request)
    raw = request.GET.get("period", "")
    try:
        fmt = "%Y-%m-%d" if rng.bucket == "day" else "%Y-%m-%d %H:00"
        start = datetime.strptime(raw, fmt).replace(tzinfo=UTC)
    except ValueError as exc:
        raise Http404("Give a period from the table") from exc
    if cluster_id is None:
        raise Http404("No cluster")
    drill = selectors.idle_drill_get(cluster_id=cluster_id, start_at=start, end_at=start + rng.step)
    if (response := _csv_or_none(request, [drill.gpus, drill.jobs])) is not None:
        return response
    # A page of node groups at a time (a large cluster has hundreds of idle GPUs); the CSV has all.
    page = Paginator(drill.gpus.rows, IDLE_DRILL_PAGE_SIZE).get_page(request.GET.get("page"))
    jobs_page = Paginator(drill.jobs.rows, IDLE_DRILL_PAGE_SIZE).get_page(request.GET.get("jobs_page"))
    drill_query = f"{_query(form)}&period={quote(raw)}"
    context = {
        "drill": drill,
        "gpus_table": Table(
            name=drill.gpus.name,
            caption=drill.gpus.caption,
            headers=drill.gpus.headers,
            rows=tuple(page),
            extra=drill.gpus.extra,
        ),
        "jobs_table": Table(
            name=drill.jobs.name,
            caption=drill.jobs.caption,
            headers=drill.jobs.headers,
            rows=tuple(jobs_page),
            extra=drill.jobs.extra,
        ),
        "page": page,
        "jobs_page": jobs_page,
        "period": raw,
        "query": _query(form),
        "drill_query": drill_query,
    }
    return render_page(request, "ops/idle_drill.html", "idle-drill", context)


# ---- quotas and policy ----


def _quotas_context(*, new_form: QuotaNewForm | None = None) -> dict[str, Any]:
    projects = selectors.project_list()
    gpu_types = selectors.gpu_type_list()
    quotas = selectors.quota_list()
    rows = [
        (
            q,
            QuotaForm(
                initial={"guaranteed_gpus": q.guaranteed_gpus, "borrow_limit_gpus": q.borrow_limit_gpus},
                quota_id=q.pk,
            ),
        )
        for q in quotas
    ]
    weights = [
        (p, WeightForm(initial={"fair_share_weight": p.fair_share_weight}, project_id=p.pk)) for p in projects
    ]
    return {
        "rows": rows,
        "weights": weights,
        "new_form": new_form or QuotaNewForm(projects=projects, gpu_types=gpu_types),
    }


@staff_required
@require_GET
def quotas(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, "ops/quotas.html", _quotas_context())


@staff_required
@require_POST
def quota_new(request: HtmxHttpRequest) -> HttpResponse:
    form = QuotaNewForm(request.POST, projects=selectors.project_list(), gpu_types=selectors.gpu_type_list())
    if form.is_valid():
        d = form.cleaned_data
        try:
            services.quota_create(
                project_id=d["project"],
                gpu_type_id=d["gpu_type"],
                user=request.user,
                guaranteed_gpus=d["guaranteed_gpus"],
                borrow_limit_gpus=d["borrow_limit_gpus"],
            )
        except ValidationError as exc:
            service_errors_add(form, exc)
        else:
            return redirect_after_post(request, reverse("ops:quotas"))
    return render_page(
        request, "ops/quotas.html", "quota-new", _quotas_context(new_form=form), status=UNPROCESSABLE
    )


@staff_required
@require_POST
def project_weight(request: HtmxHttpRequest, project_id: int) -> HttpResponse:
    project = get_object_or_404(Project, pk=project_id)
    form = WeightForm(request.POST, project_id=project.pk)
    saved, status = False, UNPROCESSABLE
    if form.is_valid():
        try:
            project = services.project_weight_update(
                project_id=project.pk,
                user=request.user,
                fair_share_weight=form.cleaned_data["fair_share_weight"],
            )
            saved, status = True, 200
        except ValidationError as exc:
            service_errors_add(form, exc)
    if not request.htmx:
        if saved:
            return HttpResponseRedirect(reverse("ops:quotas"), status=303)
        return render(
            request, "ops/quotas.html", {**_quotas_context(), "weights": [(project, form)]}, status=status
        )
    context = {"project": project, "form": form, "saved": saved}
    return render(request, "ops/quotas.html#weight-row", context, status=status)


@staff_required
@require_POST
def quota_edit(request: HtmxHttpRequest, quota_id: int) -> HttpResponse:
    quota = get_object_or_404(Quota.objects.select_related("project", "gpu_type"), pk=quota_id)
    form = QuotaForm(request.POST, quota_id=quota.pk)
    status = 200
    if form.is_valid():
        try:
            quota = services.quota_update(quota_id=quota.pk, user=request.user, **form.cleaned_data)
            saved = True
        except ValidationError as exc:
            service_errors_add(form, exc)
            saved, status = False, UNPROCESSABLE
    else:
        saved, status = False, UNPROCESSABLE
    if not request.htmx:
        if saved:
            return HttpResponseRedirect(reverse("ops:quotas"), status=303)
        return render(request, "ops/quotas.html", {"rows": [(quota, form)]}, status=status)
    return render(
        request, "ops/quotas.html#quota-row", {"quota": quota, "form": form, "saved": saved}, status=status
    )


@staff_required
@require_http_methods(["GET", "POST"])
def policy(request: HtmxHttpRequest) -> HttpResponse:
    from scheduling.snapshots import policy_config_for_cluster

    form_range, cluster_id, _ = _range(request)
    if cluster_id is None or not _is_asked_cluster(request, cluster_id):
        raise Http404("No such cluster")
    from scheduling.models import Cluster

    cluster = get_object_or_404(Cluster, pk=cluster_id)
    saved, status = False, 200
    if request.method == "POST":
        form = PolicyForm(request.POST)
        if form.is_valid():
            try:
                cluster = services.cluster_policy_update(
                    cluster_id=cluster.pk, user=request.user, **form.cleaned_data
                )
                saved = True
            except ValidationError as exc:
                service_errors_add(form, exc)
                status = UNPROCESSABLE
        else:
            status = UNPROCESSABLE
    else:
        cfg = policy_config_for_cluster(cluster=cluster)
        raw = (cluster.settings or {}).get("policy", {})
        headroom = (raw.get("interactive_headroom") if isinstance(raw, dict) else None) or []
        form = PolicyForm(
            initial={
                "name": cfg.name,
                "grace_s": cfg.grace_s,
                "min_runtime_s": cfg.min_runtime_s,
                "booking_lead_s": cfg.booking_lead_s,
                "interactive_headroom": ", ".join(f"{t}:{g}" for t, g in headroom),
            }
        )
    context = {
        "form": form,
        "range_form": form_range,
        "cluster": cluster,
        "saved": saved,
        "query": _query(form_range),
    }
    return render_page(request, "ops/policy.html", "policy-form", context, status=status)


# ---- audit log ----


@staff_required
@vary_on_headers("HX-Request")
@require_GET
def audit(request: HtmxHttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    filters: dict[str, Any] = {}
    if form.is_valid():
        d = form.cleaned_data
        filters = {k: d[k] for k in ("actor", "verb", "entity_type") if d[k]}
        if d["start"]:
            filters["start_at"] = datetime.combine(d["start"], time.min, tzinfo=UTC)
        if d["end"]:
            filters["end_at"] = datetime.combine(d["end"] + timedelta(days=1), time.min, tzinfo=UTC)
    page = Paginator(selectors.audit_event_list(**filters), AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    params = request.GET.copy()
    params.pop("page", None)
    query = params.urlencode()
    rows = [(event, selectors.audit_changes(event.before, event.after)) for event in page]
    context = {
        "form": form,
        "page": page,
        "rows": rows,
        "query": query,
        "entity_types": selectors.audit_entity_types(),
    }
    return render_page(request, "ops/audit.html", "audit-list", context)
