"""CapacityExceedRun: "when does demand exceed capacity" as a stored row a Celery task fills (the
ops page no longer fits Prophet inside a request)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("forecasting", "0004_capacitystudy_whatif"),
        ("scheduling", "0006_booking_is_in_use_removed"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="CapacityExceedRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("horizon_days", models.PositiveSmallIntegerField()),
                ("model_name", models.CharField(default="prophet", max_length=40)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("running", "Running"),
                            ("done", "Done"),
                            ("failed", "Failed"),
                        ],
                        default="queued",
                        max_length=16,
                    ),
                ),
                ("types_total", models.PositiveSmallIntegerField(default=0)),
                ("types_done", models.PositiveSmallIntegerField(default=0)),
                ("results", models.JSONField(blank=True, default=list)),
                ("message", models.CharField(blank=True, default="", max_length=500)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="capacity_exceed_runs",
                        to="scheduling.cluster",
                    ),
                ),
                (
                    "requested_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["-created_at", "-id"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("horizon_days__gte", 1), ("horizon_days__lte", 90)),
                        name="capacityexceedrun_horizon",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("types_done__lte", models.F("types_total"))),
                        name="capacityexceedrun_progress",
                    ),
                ],
            },
        ),
    ]
