"""``scheduling_job`` keeps 60 % of each heap page free (``fillfactor = 40``, was 70: 0007).

A pending job's first explanation (reason, sentence, two ETAs; no indexed column) grows its
row from ~240 to ~360 bytes.  An UPDATE is HOT (no index entry, the new version on the same
page) only if the page has room for the new version: at fillfactor 70 a page of ~23 such rows
has room for ~6 of them, so most first explanations went to another page and added an entry to
each of the table's five indexes.  At 40 a page holds ~13 rows and room for all 13 new
versions (the knee is old / (old + new) = 240 / 600 of the page).  Measured in `psql` on the
bench lab's table (9,703 first explanations in one statement, freshly packed copies, four runs
each, load ~1.8): 191-246 ms at 70, 166 ms at 50, 52-83 ms at 40 (90 % HOT), 36 ms at 30.
The price is space: the heap of a table that also keeps every finished job is ~1.75x what it
is at 70 (index sizes do not change).  Applies to pages written from now on (``VACUUM FULL
scheduling_job`` applies it at once, under an exclusive lock).  See `docs/operations.md`,
"Round speed VII".
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0008_job_fk_indexes_in_composites"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE scheduling_job SET (fillfactor = 40)",
            reverse_sql="ALTER TABLE scheduling_job SET (fillfactor = 70)",
        ),
    ]
