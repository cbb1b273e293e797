"""``scheduling_job`` keeps 30 % of each heap page free (``fillfactor = 70``).

Every round rewrites the explanation columns of the pending jobs whose explanation changed
(``pending_reason``, ``pending_sentence``, ``eta_p50_at``, ``eta_p90_at``; none is indexed).
With full pages (the default 100) such an UPDATE can never be HOT: the new row version goes to
another page and each of the table's eight indexes gets a new entry.  With room on the page the
new version stays there and no index is touched.  Measured on the bench lab's table (9,700
pending jobs getting their first explanation in one statement, `psql`): 200-257 ms at
fillfactor 100, 167-173 ms at 70; in `bench.round` 29 % of those first writes were HOT (a
row grows from ~240 to ~360 bytes with its sentence; `docs/operations.md`, "Round speed V").
The setting applies to pages written from now on; an existing table gets it page by page as
rows are rewritten (``VACUUM FULL scheduling_job`` applies it at once, under an exclusive lock).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0006_booking_is_in_use_removed"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE scheduling_job SET (fillfactor = 70)",
            reverse_sql="ALTER TABLE scheduling_job RESET (fillfactor)",
        ),
    ]
