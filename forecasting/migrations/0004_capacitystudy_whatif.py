"""CapacityStudy becomes the one what-if (baseline against GPUs added or removed, maybe another
policy), replacing both the wait-target search (no page ever showed it) and the ops pages' what-if
kept in the cache.  Old rows are wait-target searches, which the new shape cannot hold: dropped."""

from django.db import migrations, models


def _drop_wait_target_studies(apps, schema_editor):
    apps.get_model("forecasting", "CapacityStudy").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("forecasting", "0003_predict5_forecastrun_flag"),
    ]

    operations = [
        migrations.RunPython(_drop_wait_target_studies, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name="capacitystudy", name="capacitystudy_target_nonnegative"),
        migrations.RemoveField(model_name="capacitystudy", name="p95_wait_s"),
        migrations.RemoveField(model_name="capacitystudy", name="answer_gpus"),
        migrations.RemoveField(model_name="capacitystudy", name="points"),
        migrations.AddField(
            model_name="capacitystudy",
            name="gpu_delta",
            field=models.IntegerField(default=0),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="capacitystudy",
            name="policy",
            field=models.CharField(default="", max_length=16),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="capacitystudy",
            name="baseline_policy",
            field=models.CharField(default="", max_length=16),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="capacitystudy",
            name="current_gpus",
            field=models.PositiveIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="capacitystudy",
            name="gpus_per_node",
            field=models.PositiveSmallIntegerField(default=1),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="capacitystudy",
            name="results",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
