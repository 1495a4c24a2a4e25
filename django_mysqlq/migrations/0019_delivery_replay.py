"""A delivery link made by an operator's replay says so (``mysqlq_topic_delivery.replay``):
a lookup's trace marked as a replay any later delivery of an offset to a group, a reset
backwards' re-deliveries too. Links made before this migration are not marked: which of
them a replay made is not on record."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_mysqlq", "0018_group_moved_forward"),
    ]

    operations = [
        migrations.AddField(
            model_name="topicdelivery",
            name="replay",
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
