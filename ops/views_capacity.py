"""Staff capacity-planning pages: forecast bands per GPU type (cut at 3x capacity, the
no-signal flag said), the forecasts' track record, "when does demand exceed capacity", the
forecast refresh and what-if replays.  Split from `ops.views` (house rule: files under
600 lines); the same staff-only rules and partial rendering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods
from django.views.decorators.vary import vary_on_headers

from ops.forms import WhatIfForm
from ops.selectors import Table
from ops.views import (
    _csv_or_none,
    _is_asked_cluster,
    _query,
    _range,
    staff_required,
)
from portal.htmx import UNPROCESSABLE, HtmxHttpRequest, service_errors_add

# ---- capacity planning ----


def _fitting_text(refresh: dict[str, Any] | None) -> str:
    """'fitting…' while a forecast refresh is queued or running ("" otherwise)."""
    if not refresh or refresh.get("status") not in ("queued", "running"):
        return ""
    if refresh.get("status") == "queued":
        return "fitting… (queued for a worker)"
    return f"fitting… ({refresh.get('done', 0)} of {refresh.get('total', 0)} series)"


def _capacity_context(cluster_id: int | None) -> dict[str, Any]:
    from forecasting.models import ForecastRun
    from forecasting.selectors import cluster_capacity_by_type, forecast_band_get
    from forecasting.services import forecast_refresh_state_get

    if cluster_id is None:
        return {"bands": [], "gpu_types": []}
    now = timezone.now()
    fitting = _fitting_text(forecast_refresh_state_get(cluster_id=cluster_id))
    capacity = cluster_capacity_by_type(cluster_id=cluster_id)
    bands = []
    for type_name in sorted(capacity):
        band = forecast_band_get(
            cluster_id=cluster_id, kind=ForecastRun.Kind.GPU_TYPE, key=type_name, at=now, history_h=72
        )
        rows: list[tuple[Any, ...]] = [
            (ts.strftime("%Y-%m-%d %H:00"), round(v, 2), None, None, None, band.capacity_gpus)
            for ts, v in band.history
        ]
        rows += [
            (
                p.ts.astimezone(UTC).strftime("%Y-%m-%d %H:00"),
                None,
                round(p.yhat, 2),
                round(p.lower80, 2),
                round(p.upper80, 2),
                band.capacity_gpus,
            )
            for p in band.points
        ]
        bands.append(
            Table(
                name=f"forecast-{type_name}",
                caption=f"{type_name}: demand (GPUs), forecast with its 80% band, and capacity"
                + (
                    f" (model {band.run.model_name}, issued {band.run.issued_at:%Y-%m-%d %H:%M} UTC"
                    + (f"; {fitting}" if fitting else "")
                    + ")"
                    if band.run
                    else f" ({fitting or 'no forecast stored yet'})"
                ),
                headers=("Hour (UTC)", "Actual", "Forecast", "Lower 80%", "Upper 80%", "Capacity"),
                rows=tuple(rows),
                chart="band",
                extra={"data_columns": [1, 2], **_band_extra(band)},
                empty_reason=(
                    f"No {type_name} demand in the last 3 days (no job ran or waited on this type) and "
                    + (
                        f"the first forecast is {fitting}: this chart fills when it is stored."
                        if fitting
                        else "no forecast is stored yet: the hourly refresh or “Refresh forecasts now” "
                        "fits one."
                    )
                ),
            )
        )
    return {"bands": bands, "gpu_types": sorted(capacity), "fitting": fitting, "capacity": capacity}


# The capacity chart's y axis stops at this many times the type's capacity: a band far above it
# would squash the capacity line and the actual demand into the bottom of the chart.
Y_CLIP_CAPACITY = 3
NO_SIGNAL_TEXT = "Too little history to model: empirical last-week forecast."


def _band_extra(band: Any) -> dict[str, Any]:
    """The chart's y-axis cut (with the notice saying so) and the forecast's no-signal flag."""
    extra: dict[str, Any] = {}
    if band.run is not None and band.run.flag == "no_signal":
        extra["flag"] = "no_signal"
        extra["flag_text"] = (
            f"{NO_SIGNAL_TEXT} The series had too few busy hours to fit a model, so the forecast "
            "repeats how its last week was distributed."
        )
    capacity = band.capacity_gpus or 0
    peak = max((max(p.upper80, p.yhat) for p in band.points), default=0.0)
    if capacity > 0 and peak > Y_CLIP_CAPACITY * capacity:
        extra["y_max"] = Y_CLIP_CAPACITY * capacity
        extra["clip_text"] = (
            f"The forecast band reaches {peak:.1f} GPUs, above {Y_CLIP_CAPACITY}× this type's "
            f"{capacity} GPUs: the chart is cut at {Y_CLIP_CAPACITY * capacity} GPUs so that "
            "capacity and demand stay readable (the table has every number)."
        )
    return extra


_VERDICTS = {
    "too_new": "too new to judge (under a day of scored hours)",
    "worse_than_naive": "do not trust: worse than repeating the last day",
    "band_off": "point fine, band miscalibrated",
    "trusted": "trusted: beats seasonal naive, band calibrated",
}
TRACK_RECORD_DAYS = 7


def _track_record_table(cluster_id: int | None) -> Table:
    """Each series' rolling track record: MASE against seasonal naive and band coverage."""
    from forecasting.selectors import forecast_track_record_list

    records = (
        forecast_track_record_list(cluster_id=cluster_id, now=timezone.now(), days=TRACK_RECORD_DAYS)
        if cluster_id is not None
        else []
    )

    def series_name(kind: str, key: str) -> str:
        if kind == "gpu_type":
            return f"GPU type {key}" if key else "Cluster total"
        return f"{kind.capitalize()} {key}"

    return Table(
        name="forecast-track-record",
        caption=f"Forecast track record over the last {TRACK_RECORD_DAYS} days, per series",
        headers=(
            "Series",
            "Hours scored",
            "MAE (GPUs)",
            "MASE vs seasonal naive",
            "Inside 80% band",
            "At or below upper 95%",
            "Verdict",
        ),
        rows=tuple(
            (
                series_name(r.kind, r.key),
                r.hours,
                round(r.mae_gpus, 2),
                None if r.mase is None else round(r.mase, 2),
                f"{r.coverage_80:.0%}",
                None if r.coverage_upper_95 is None else f"{r.coverage_upper_95:.0%}",
                _VERDICTS[r.verdict],
            )
            for r in records
        ),
    )


def _whatif_form(context: dict[str, Any]) -> WhatIfForm:
    """The what-if form, on the cluster's largest GPU type by default (the first in name order
    may be a one-GPU pool, whose replay says little)."""
    capacity: dict[str, int] = context.get("capacity") or {}
    initial = {"gpu_type": max(capacity, key=lambda t: (capacity[t], t))} if capacity else {}
    return WhatIfForm(gpu_types=context["gpu_types"], initial=initial)


@staff_required
@vary_on_headers("HX-Request")
@require_GET
def capacity(request: HtmxHttpRequest) -> HttpResponse:
    form, cluster_id, _ = _range(request)
    from forecasting.selectors import capacity_exceed_run_get, capacity_study_list
    from forecasting.services import forecast_refresh_state_get

    context = {"form": form, "cluster_id": cluster_id, "query": _query(form), **_capacity_context(cluster_id)}
    context["track_record"] = _track_record_table(cluster_id)
    context["track_record_days"] = TRACK_RECORD_DAYS
    if (response := _csv_or_none(request, [*context["bands"], context["track_record"]])) is not None:
        return response
    context["refresh"] = forecast_refresh_state_get(cluster_id=cluster_id) if cluster_id else None
    context["whatif_form"] = _whatif_form(context)
    context["recent_whatifs"] = capacity_study_list(cluster_id=cluster_id, limit=10) if cluster_id else []
    newest = capacity_exceed_run_get(cluster_id=cluster_id) if cluster_id else None
    context.update(_exceed_context(newest, context["query"]))
    return render(request, "ops/capacity.html", context)


@staff_required
@vary_on_headers("HX-Request")
@require_http_methods(["GET", "POST"])
def forecast_refresh(request: HtmxHttpRequest) -> HttpResponse:
    """ "Refresh forecasts now": POST queues a refit of this hour's forecasts of the cluster the
    URL names (on a worker); GET shows its progress (htmx polls it while it runs)."""
    from forecasting.services import forecast_refresh_request, forecast_refresh_state_get

    form, cluster_id, _ = _range(request)
    if cluster_id is None or not _is_asked_cluster(request, cluster_id):
        raise Http404("Unknown cluster")
    if request.method == "POST":
        state: dict[str, Any] | None = forecast_refresh_request(cluster_id=cluster_id)
    else:
        state = forecast_refresh_state_get(cluster_id=cluster_id)
    context = {"refresh": state, "query": _query(form), "cluster_id": cluster_id}
    if request.htmx:
        return render(request, "ops/capacity.html#forecast-refresh", context)
    return HttpResponseRedirect(f"{reverse('ops:capacity')}?{_query(form)}", status=303)


@staff_required
@vary_on_headers("HX-Request")
@require_http_methods(["GET", "POST"])
def capacity_exceed(request: HtmxHttpRequest) -> HttpResponse:
    """ "When does demand exceed capacity": POST queues one forecast fit per GPU type of the
    cluster the URL names (a `CapacityExceedRun`, fitted on a worker); GET only reads: the run
    ``?run=`` or the cluster's newest (htmx polls it while it runs; ``?csv=capacity-exceed``)."""
    from forecasting.selectors import capacity_exceed_run_get

    form, cluster_id, _ = _range(request)
    if request.method == "POST":
        return _capacity_exceed_start(request, form, cluster_id)
    try:
        run_id = int(request.GET["run"]) if request.GET.get("run") else None
    except ValueError:
        raise Http404("Unknown run") from None
    run = capacity_exceed_run_get(cluster_id=cluster_id, run_id=run_id) if cluster_id else None
    if run_id is not None and run is None:
        raise Http404("Unknown run")
    context: dict[str, Any] = {
        "query": _query(form),
        "cluster_id": cluster_id,
        **_exceed_context(run, _query(form)),
    }
    if (response := _csv_or_none(request, [t for t in [context["exceed"]] if t])) is not None:
        return response
    if request.htmx:
        return render(request, "ops/capacity.html#capacity-exceed", context)
    # A reloaded or bookmarked URL: the whole capacity page, with this run in place.
    context.update(form=form, **_capacity_context(cluster_id))
    context["whatif_form"] = _whatif_form(context)
    return render(request, "ops/capacity.html", context)


def _capacity_exceed_start(request: HtmxHttpRequest, form: Any, cluster_id: int | None) -> HttpResponse:
    from forecasting.services import capacity_exceed_run_create
    from scheduling.models import Cluster

    cluster = None
    if cluster_id is not None and _is_asked_cluster(request, cluster_id):
        cluster = Cluster.objects.filter(pk=cluster_id).first()
    context: dict[str, Any] = {"query": _query(form), "cluster_id": cluster_id}
    if cluster is None:
        context.update(
            _exceed_context(None, context["query"]), exceed_error="Choose a cluster from the capacity page."
        )
        return render(request, "ops/capacity.html#capacity-exceed", context, status=UNPROCESSABLE)
    try:
        days = max(1, min(90, int(request.POST.get("horizon_days", "28"))))
    except ValueError:
        days = 28
    run = capacity_exceed_run_create(cluster=cluster, horizon_days=days, requested_by=request.user)
    if request.htmx:
        return render(
            request,
            "ops/capacity.html#capacity-exceed",
            {**context, **_exceed_context(run, context["query"])},
        )
    return HttpResponseRedirect(f"{reverse('ops:capacity')}?{_query(form)}#h-exceed", status=303)


def _exceed_context(run: Any | None, query: str) -> dict[str, Any]:
    return {
        "exceed_run": run,
        "exceed_query": f"{query}&run={run.pk}" if run else query,  # its CSV
        "exceed_status_text": _exceed_status_text(run, now=timezone.now()) if run else "",
        "exceed": _exceed_table(run),
        "horizon_days": run.horizon_days if run else 28,
    }


def _lost_worker_text(run: Any, *, now: datetime, limit_s: float, what: str, again: str) -> str | None:
    """The words for a run still marked running past its task's hard time limit (the soft limit
    plus 60 s): its worker was probably lost.  None while it may still be running."""
    running_s = (now - (run.started_at or run.created_at)).total_seconds()
    if running_s <= limit_s + 60:
        return None
    return (
        f"running for {running_s / 60:.0f} min, longer than {what} may run: its worker was "
        f"probably lost; {again} again."
    )


def _exceed_status_text(run: Any, *, now: datetime) -> str:
    """What the fits are doing, in words (after "Progress: ")."""
    if run.status == "queued":
        return _queued_text(now - run.created_at)
    if run.status == "running":
        lost = _lost_worker_text(
            run,
            now=now,
            limit_s=settings.BERTH_FORECAST_SOFT_TIME_LIMIT_S,
            what="these fits",
            again="compute",
        )
        if lost is not None:
            return lost
        if run.types_total == 0:
            return "running, reading the demand history."
        if run.types_done < run.types_total:
            return f"running, fitting GPU type {run.types_done + 1} of {run.types_total}."
        return "running, storing the results."
    if run.status == "failed":
        return "failed."
    return (
        f"done: {len(run.results)} GPU type{'s' if len(run.results) != 1 else ''} fitted with "
        f"{run.model_name}, {run.finished_at or run.created_at:%Y-%m-%d %H:%M} UTC."
    )


def _exceed_table(run: Any | None) -> Table | None:
    """A done run's crossings, one row per GPU type (None before it is done)."""
    if run is None or run.status != "done":
        return None

    def when(value: str | None) -> str:
        return f"{datetime.fromisoformat(value):%Y-%m-%d %H:00}" if value else "not within the horizon"

    return Table(
        name="capacity-exceed",
        caption=f"When forecast demand exceeds capacity (next {run.horizon_days} days)",
        headers=(
            "GPU type",
            "Capacity GPUs",
            "Forecast exceeds at",
            "Upper 80% exceeds at",
            "Peak forecast",
            "Peak upper 80%",
        ),
        rows=tuple(
            (
                c["gpu_type"],
                c["capacity_gpus"],
                when(c["yhat_exceeds_at"]),
                when(c["upper80_exceeds_at"]),
                round(c["peak_yhat"], 1),
                round(c["peak_upper80"], 1),
            )
            for c in run.results
        ),
    )


@staff_required
@require_http_methods(["GET", "POST"])
def whatif_new(request: HtmxHttpRequest) -> HttpResponse:
    """POST starts a what-if; GET (a bookmarked or reloaded result URL) is sent to the form."""
    from forecasting.selectors import cluster_capacity_by_type
    from scheduling.models import Cluster

    form_range, cluster_id, _ = _range(request)
    if request.method == "GET":
        query = _query(form_range)
        return HttpResponseRedirect(f"{reverse('ops:capacity')}?{query}#h-whatif", status=303)
    cluster = None
    if cluster_id is not None and _is_asked_cluster(request, cluster_id):
        cluster = Cluster.objects.filter(pk=cluster_id).first()
    gpu_types = sorted(cluster_capacity_by_type(cluster_id=cluster.pk)) if cluster else []
    form = WhatIfForm(request.POST, gpu_types=gpu_types)
    context: dict[str, Any] = {"whatif_form": form, "query": _query(form_range), "cluster_id": cluster_id}
    if cluster is None:
        form.add_error(None, "Choose a cluster from the capacity page.")
    if cluster is None or not form.is_valid():
        return render(request, "ops/capacity.html#whatif", context, status=UNPROCESSABLE)
    from forecasting.services import capacity_study_create

    try:
        study = capacity_study_create(cluster=cluster, requested_by=request.user, **form.cleaned_data)
    except ValidationError as exc:
        service_errors_add(form, exc)
        return render(request, "ops/capacity.html#whatif", context, status=UNPROCESSABLE)
    context.update(_whatif_context(study))
    if request.htmx:
        return render(request, "ops/capacity.html#whatif", context)
    return HttpResponseRedirect(reverse("ops:whatif", args=[study.pk]), status=303)


@staff_required
@require_GET
def whatif(request: HtmxHttpRequest, whatif_id: str) -> HttpResponse:
    """A what-if's progress (htmx polls the ``whatif-status`` partial until it is done)."""
    from forecasting.models import CapacityStudy
    from forecasting.selectors import capacity_study_get

    try:
        study = capacity_study_get(study_id=int(whatif_id))
    except (ValueError, CapacityStudy.DoesNotExist):
        raise Http404("Unknown what-if") from None
    context = _whatif_context(study)
    if (response := _csv_or_none(request, [context["compare"]])) is not None:
        return response
    if request.htmx:
        return render(request, "ops/whatif.html#whatif-status", context)
    return render(request, "ops/whatif.html", context)


# A queued what-if no worker has started after this long says so (the page would poll forever).
WHATIF_QUEUED_WARN_S = 60


def _whatif_context(study: Any) -> dict[str, Any]:
    return {
        "state": study,
        "status_text": _whatif_status_text(study, now=timezone.now()),
        "compare": _whatif_table(study.results),
        "notes": _whatif_notes(study.results),
    }


def _queued_text(waited: timedelta) -> str:
    """A queued what-if or fit: after a minute, that no worker has started it (else it polls on)."""
    if waited.total_seconds() > WHATIF_QUEUED_WARN_S:
        return (
            f"queued for {waited.total_seconds() / 60:.0f} min: no worker has started it yet (is a "
            "Celery worker running?). This page keeps checking."
        )
    return "queued, waiting for a worker."


def _whatif_status_text(study: Any, *, now: datetime) -> str:
    """What the what-if is doing, in words (after "Progress: "): never a figure nothing measured."""
    if study.status == "queued":
        return _queued_text(now - study.created_at)
    if study.status == "running":
        lost = _lost_worker_text(
            study, now=now, limit_s=settings.BERTH_CAPACITY_TIME_BUDGET_S, what="a what-if", again="start it"
        )
        if lost is not None:
            return lost
        done = len(study.results)
        label, gpus, policy = (
            ("baseline", study.current_gpus, study.baseline_policy)
            if done == 0
            else ("what-if", study.current_gpus + study.gpu_delta, study.policy)
        )
        return f"running replay {done + 1} of 2 ({label}, about {gpus} GPUs, policy {policy})."
    if study.status == "failed":
        return "failed."
    return "done, both replays finished."


def _whatif_table(results: dict[str, Any]) -> Table:
    base, what = results.get("baseline", {}), results.get("whatif", {})

    def fmt(r: dict[str, Any], key: str, scale: float = 1.0) -> Any:
        return round(r[key] * scale, 1) if key in r else None

    return Table(
        name="whatif",
        caption="Baseline against what-if (same jobs replayed)",
        headers=("Measure", "Baseline", "What-if"),
        rows=(
            ("Policy", base.get("policy"), what.get("policy")),
            ("GPUs", base.get("gpus"), what.get("gpus")),
            ("Wait p95 (min)", fmt(base, "wait_p95_s", 1 / 60), fmt(what, "wait_p95_s", 1 / 60)),
            ("Wait mean (min)", fmt(base, "wait_mean_s", 1 / 60), fmt(what, "wait_mean_s", 1 / 60)),
            ("Utilization % (of its own GPUs)", fmt(base, "utilization", 100), fmt(what, "utilization", 100)),
            ("Useful GPU-hours", fmt(base, "useful_gpu_hours"), fmt(what, "useful_gpu_hours")),
            ("Replay span (h)", fmt(base, "span_h"), fmt(what, "span_h")),
            ("Jobs that never ran", base.get("unfinished_jobs"), what.get("unfinished_jobs")),
            ("Jobs larger than these GPUs", base.get("too_large_jobs"), what.get("too_large_jobs")),
        ),
    )


def _whatif_notes(results: dict[str, Any]) -> list[str]:
    """Sentences that explain the comparison: what utilization is relative to, and why it can
    fall when GPUs are removed (work that no longer fits never runs, so it is not counted)."""
    base, what = results.get("baseline", {}), results.get("whatif", {})
    if "utilization" not in base or "utilization" not in what:
        return []
    notes = [
        "Utilization is each replay's useful GPU-hours over its own GPUs times its span (first "
        "arrival to last completion), so the two columns are each relative to their own capacity."
    ]
    fewer = what.get("gpus", 0) < base.get("gpus", 0)
    if fewer and what["utilization"] < base["utilization"]:
        lost_jobs = int(what.get("unfinished_jobs") or 0) - int(base.get("unfinished_jobs") or 0)
        lost_h = float(base.get("useful_gpu_hours") or 0.0) - float(what.get("useful_gpu_hours") or 0.0)
        if lost_jobs > 0:
            notes.append(
                f"Utilization fell although GPUs were removed because {lost_jobs} job(s) never ran in the "
                f"what-if ({what.get('too_large_jobs', 0)} ask for more than its {what.get('gpus')} GPUs): "
                f"their {lost_h:.1f} GPU-hours are missing from the busy time, while the span stays as long."
            )
        else:
            notes.append(
                "Utilization fell although GPUs were removed: the same work ran over a longer span "
                f"({what.get('span_h', 0):.1f} h against {base.get('span_h', 0):.1f} h), with GPUs idle "
                f"while jobs waited for a whole {what.get('policy')} slot."
            )
    return notes
