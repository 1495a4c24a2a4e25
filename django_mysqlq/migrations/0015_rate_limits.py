"""Global rate limits: each message's rate key and spacing, the 'throttled' status, and
the table of rate-limit keys. Rate keys and their queues compare exactly, like gate keys
(see 0011).
"""

import importlib
from typing import Any

from django.db import migrations, models

EXACT = {
    "mysqlq_message": [("rate_key", "VARCHAR(255) NULL")],
    "mysqlq_rate": [("queue", "VARCHAR(64) NOT NULL"), ("rate_key", "VARCHAR(255) NOT NULL")],
}


def exact(apps: Any, schema_editor: Any, collation: str | None = None) -> None:
    previous = importlib.import_module("django_mysqlq.migrations.0003_exact_collation")
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collate = f"COLLATE {collation or previous.exact_collation(connection)}"
    for table, columns in EXACT.items():
        changes = ", ".join(
            f"MODIFY {name} {kind.replace(' NOT NULL', '').replace(' NULL', '')} "
            f"CHARACTER SET utf8mb4 {collate} {'NOT NULL' if 'NOT NULL' in kind else 'NULL'}"
            for name, kind in columns
        )
        schema_editor.execute(f"ALTER TABLE {table} {changes}")


def back_to_default(apps: Any, schema_editor: Any) -> None:
    exact(apps, schema_editor, collation="utf8mb4_general_ci")


class Migration(migrations.Migration):
    atomic = False  # DDL on MySQL commits anyway

    dependencies = [
        ('django_mysqlq', '0014_unique_keys'),
    ]

    operations = [
        migrations.CreateModel(
            name='RateLimit',
            fields=[
                ('id', models.CharField(max_length=32, primary_key=True, serialize=False)),
                ('queue', models.CharField(max_length=64)),
                ('rate_key', models.CharField(max_length=255)),
                ('rate_limit', models.CharField(blank=True, default='', max_length=32)),
                ('next_at', models.DateTimeField()),
                ('changed_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'rate-limit key',
                'verbose_name_plural': 'rate-limit keys',
                'db_table': 'mysqlq_rate',
            },
        ),
        migrations.AddField(
            model_name='message',
            name='rate_interval',
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='message',
            name='rate_key',
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AlterField(
            model_name='message',
            name='status',
            field=models.CharField(choices=[('ready', 'Ready'), ('scheduled', 'Scheduled'), ('claimed', 'Claimed (running)'), ('blocked', 'Blocked'), ('throttled', 'Throttled (rate limit)'), ('dead', 'Dead')], max_length=10),
        ),
        migrations.AddIndex(
            model_name='message',
            index=models.Index(fields=['rate_key', 'id'], name='mysqlq_msg_rate'),
        ),
        migrations.AddIndex(
            model_name='ratelimit',
            index=models.Index(fields=['queue', 'next_at'], name='mysqlq_rate_due'),
        ),
        migrations.RunPython(exact, back_to_default),
    ]
