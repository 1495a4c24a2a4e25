"""What keeps failing in a worker now (``worker.troubles``): written at each heartbeat,
shown by ``queuestats``, the dashboard and the admin's workers list."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_mysqlq", "0016_group_pump_problem"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="troubles",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
    ]
