"""``scheduling_job`` drops the single-column indexes of ``cluster_id``, ``project_id`` and
``user_id``: each is the leading column of a composite index the table keeps
(``job_cluster_status_submitted``, ``job_project_submitted``, ``job_user_submitted``), which
serves every lookup, join and foreign-key check on that column alone.

Why: a round rewrites the explanation of every pending job whose explanation changed, and an
UPDATE that is not HOT (the new row version does not fit on its page, migration 0007) adds an
entry to every index of the table: eight before, five now.  Measured on the bench lab's table
(9,703 pending jobs getting their first explanation in one statement, each run on a freshly
``VACUUM FULL``-ed table, 3 runs at load 8-9): 300-360 ms of PostgreSQL CPU with the eight,
170-220 ms with five (`docs/operations.md`, "Round speed VI").

Only the indexes are dropped (``DROP INDEX``): the foreign keys stay as they are, so the
table is not re-validated.  The names are the ones Django's ``0001_initial`` gave them.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

_INDEXES = (
    ("scheduling_job_cluster_id_b42f2fd7", "cluster_id"),
    ("scheduling_job_project_id_870817db", "project_id"),
    ("scheduling_job_user_id_dc38b1af", "user_id"),
)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0004_oidc_identity"),
        ("scheduling", "0007_job_fillfactor"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX IF EXISTS {name}",
                    reverse_sql=f"CREATE INDEX IF NOT EXISTS {name} ON scheduling_job ({column})",
                )
                for name, column in _INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="cluster",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to="scheduling.cluster",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to="accounts.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="user",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
    ]
