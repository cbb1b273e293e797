from __future__ import annotations

from django.contrib import admin

from portal.accounts.models import Membership, OidcIdentity, Project, Quota


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class QuotaInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Quota
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "slug", "fair_share_weight", "is_active", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline, QuotaInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["user", "project", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "user__email", "project__name", "project__slug"]
    list_select_related = ["user", "project"]
    autocomplete_fields = ["user", "project"]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["project", "gpu_type", "guaranteed_gpus", "borrow_limit_gpus"]
    list_filter = ["gpu_type"]
    search_fields = ["project__name", "project__slug", "gpu_type__name"]
    list_select_related = ["project", "gpu_type"]


@admin.register(OidcIdentity)
class OidcIdentityAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Staff link an existing account to its single sign-on subject here (or remove a link)."""

    list_display = ["user", "issuer", "subject", "last_login_at"]
    search_fields = ["user__username", "user__email", "subject"]
    list_select_related = ["user"]
    autocomplete_fields = ["user"]
    readonly_fields = ["groups", "created_at", "last_login_at"]
