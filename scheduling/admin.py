"""Django admin for the scheduling models.

Bookings, jobs and allocations are read-only here: their state changes must go through the
services so that the exclusion constraint, quotas and the audit log stay consistent.
Inventory (GPU types, clusters, nodes, GPUs) is edited here directly.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from scheduling.models import (
    Allocation,
    AuditEvent,
    Booking,
    Cluster,
    EngineRound,
    Gpu,
    GpuType,
    Job,
    Node,
    Preemption,
)
from scheduling.services import node_gpus_sync


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Viewable and searchable, but every change goes through a service (with an audit event)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(GpuType)
class GpuTypeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "memory_gib", "precisions", "relative_speed", "value"]
    search_fields = ["name"]


class NodeForm(forms.ModelForm):  # type: ignore[type-arg]
    """Refuses a GPU count that would drop GPUs with allocation history."""

    class Meta:
        model = Node
        fields = ["cluster", "name", "gpu_type", "gpu_count", "status", "domain"]

    def clean_gpu_count(self) -> int:
        count: int = self.cleaned_data["gpu_count"]
        if (
            self.instance.pk
            and Gpu.objects.filter(node=self.instance, index__gte=count, allocations__isnull=False).exists()
        ):
            raise forms.ValidationError("GPUs above this count have allocations; they cannot be removed.")
        return count


class NodeInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Node
    form = NodeForm
    extra = 0
    fields = ["name", "gpu_type", "gpu_count", "status", "domain"]
    show_change_link = True


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "backend", "is_active", "is_degraded", "status_message"]
    list_filter = ["backend", "is_active", "is_degraded"]
    search_fields = ["name"]
    inlines = [NodeInline]

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        # Nodes added or resized inline get their GPU rows (the admin's own transaction).
        for obj in formset.new_objects + [obj for obj, _ in formset.changed_objects]:
            if isinstance(obj, Node):
                node_gpus_sync(obj)


class GpuInline(admin.TabularInline):  # type: ignore[type-arg]
    """GPU rows follow the node's gpu_count (``node_gpus_sync``): shown, not edited."""

    model = Gpu
    extra = 0
    fields = ["index"]
    readonly_fields = ["index"]
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = NodeForm
    list_display = ["name", "cluster", "gpu_type", "gpu_count", "status", "domain"]
    list_filter = ["cluster", "gpu_type", "status"]
    search_fields = ["name", "domain"]
    list_select_related = ["cluster", "gpu_type"]
    inlines = [GpuInline]

    def save_model(self, request: HttpRequest, obj: Node, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        node_gpus_sync(obj)  # GPU rows follow gpu_count (inside the admin's transaction)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["id", "node", "index"]
    list_filter = ["node__cluster", "node__gpu_type"]
    search_fields = ["node__name"]
    list_select_related = ["node__cluster"]


class AllocationInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Allocation
    extra = 0
    fields = ["gpu", "period", "state", "is_preemptible"]
    readonly_fields = ["gpu", "period", "state", "is_preemptible"]
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Booking)
class BookingAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "user",
        "project",
        "cluster",
        "gpu_type",
        "gpu_count",
        "start_at",
        "end_at",
        "status",
    ]
    list_filter = ["status", "cluster", "gpu_type", "project"]
    search_fields = ["id", "user__username", "project__name", "note"]
    list_select_related = ["user", "project", "cluster", "gpu_type"]
    date_hierarchy = "start_at"
    inlines = [AllocationInline]


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "name",
        "user",
        "project",
        "cluster",
        "gpu_count",
        "gpu_type",
        "status",
        "pending_reason",
        "submitted_at",
    ]
    list_filter = ["status", "kind", "pending_reason", "is_preemptible", "cluster", "gpu_type", "project"]
    search_fields = ["id", "name", "user__username", "project__name", "backend_ref"]
    list_select_related = ["user", "project", "cluster", "gpu_type"]
    date_hierarchy = "submitted_at"
    inlines = [AllocationInline]


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    list_display = ["id", "gpu", "booking", "job", "period", "state", "is_preemptible"]
    list_filter = ["state", "is_preemptible", "gpu__node__cluster"]
    search_fields = ["booking__id", "job__id", "job__name"]
    list_select_related = ["gpu"]


@admin.register(EngineRound)
class EngineRoundAdmin(ReadOnlyAdmin):
    list_display = ["id", "cluster", "policy", "started_at", "duration_ms", "error"]
    list_filter = ["cluster", "policy"]
    date_hierarchy = "started_at"


@admin.register(Preemption)
class PreemptionAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "signalled_at", "kill_at", "killed_at", "lost_gpu_s", "reason"]
    list_filter = ["job__cluster"]
    search_fields = ["job__name", "reason"]
    list_select_related = ["job"]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "actor", "actor_label", "verb", "entity_type", "entity_id"]
    list_filter = ["actor_label", "entity_type", "verb"]
    search_fields = ["verb", "entity_type", "entity_id", "actor__username"]
    list_select_related = ["actor"]
    date_hierarchy = "at"
