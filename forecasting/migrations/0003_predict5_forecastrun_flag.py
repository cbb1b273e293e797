from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("forecasting", "0002_predict2_forecast_track_record"),
    ]

    operations = [
        migrations.AddField(
            model_name="forecastrun",
            name="flag",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
    ]
