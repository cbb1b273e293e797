"""Availability invalidation by PostgreSQL: every write to the tables availability is computed
from sends ``NOTIFY berth_availability`` (delivered at commit, one per transaction), which the
per-process availability cache listens for (`scheduling.selectors`)."""

from django.db import migrations

TABLES = (
    "scheduling_allocation",
    "scheduling_gpu",
    "scheduling_node",
    "scheduling_cluster",
    "scheduling_gputype",
)

FUNCTION = """
CREATE OR REPLACE FUNCTION berth_availability_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('berth_availability', '');
    RETURN NULL;
END
$$;
"""


def _triggers(create: bool) -> list[str]:
    out = []
    for table in TABLES:
        name = f"{table}_availability_notify"
        out.append(f"DROP TRIGGER IF EXISTS {name} ON {table};")
        if create:
            out.append(
                f"CREATE TRIGGER {name} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table}"
                " FOR EACH STATEMENT EXECUTE FUNCTION berth_availability_notify();"
            )
    return out


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0004_unused_statuses"),
    ]

    operations = [
        migrations.RunSQL(
            sql=[FUNCTION, *_triggers(create=True)],
            reverse_sql=[*_triggers(create=False), "DROP FUNCTION IF EXISTS berth_availability_notify();"],
        ),
    ]
