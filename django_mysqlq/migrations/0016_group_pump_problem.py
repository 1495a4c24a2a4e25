"""Why a consumer group's pump can't go on, as its members last said, and since when
(``broker.topic_problems``): shown beside the group's lag by ``queuetopic groups``, the
admin and the dashboard."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_mysqlq", "0015_rate_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="topicgroup",
            name="pump_problem",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
        migrations.AddField(
            model_name="topicgroup",
            name="pump_problem_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
