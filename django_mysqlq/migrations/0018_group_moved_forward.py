"""The last reset that moved a consumer group's position forward (``moved_forward_at``,
``moved_forward_by``): a lookup's trace blames a skipped offset on it, not on a replay or
a reset backwards (both also set ``changed_at``). A group changed before this migration
has its last change copied there: which way it went is not on record."""

from typing import Any

from django.db import migrations, models
from django.db.models import F


def copy_changes(apps: Any, schema_editor: Any) -> None:
    group = apps.get_model("django_mysqlq", "TopicGroup")
    group.objects.using(schema_editor.connection.alias).filter(
        changed_at__isnull=False).update(moved_forward_at=F("changed_at"),
                                         moved_forward_by=F("changed_by"))


class Migration(migrations.Migration):
    dependencies = [
        ("django_mysqlq", "0017_worker_troubles"),
    ]

    operations = [
        migrations.AddField(
            model_name="topicgroup",
            name="moved_forward_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="topicgroup",
            name="moved_forward_by",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
        migrations.RunPython(copy_changes, migrations.RunPython.noop),
    ]
