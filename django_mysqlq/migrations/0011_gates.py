"""Ordered subjects and concurrency limits: the gate table, and each message's gate.

``ordering_key`` (reserved, never written) becomes ``gate_key``. Gate keys and queue names
compare exactly, like dedup keys (see 0003): a subject 'Order:1' is not 'order:1'.
"""

import importlib
from typing import Any

from django.db import migrations, models

#: Columns that compare exactly, with their types (see 0003_exact_collation).
EXACT = {
    "mysqlq_message": [("gate_key", "VARCHAR(255) NULL")],
    "mysqlq_gate": [("queue", "VARCHAR(64) NOT NULL"), ("gate_key", "VARCHAR(255) NOT NULL")],
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
        ('django_mysqlq', '0010_schedules'),
    ]

    operations = [
        migrations.CreateModel(
            name='Gate',
            fields=[
                ('id', models.CharField(max_length=32, primary_key=True, serialize=False)),
                ('queue', models.CharField(max_length=64)),
                ('ordered', models.BooleanField()),
                ('gate_key', models.CharField(max_length=255)),
                ('slots', models.PositiveIntegerField()),
                ('active', models.IntegerField(default=0)),
                ('blocked', models.IntegerField(default=0)),
                ('changed_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'subject or concurrency key',
                'verbose_name_plural': 'subjects and concurrency keys',
                'db_table': 'mysqlq_gate',
            },
        ),
        migrations.CreateModel(
            name='BlockedMessage',
            fields=[
            ],
            options={
                'verbose_name': 'blocked message',
                'verbose_name_plural': 'blocked messages',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('django_mysqlq.message',),
        ),
        migrations.AlterModelOptions(
            name='message',
            options={'permissions': [('requeue_message', 'Can requeue a message or retry a dead one'), ('cancel_message', 'Can cancel a ready, scheduled or dead message'), ('change_priority', 'Can change the priority of a waiting message'), ('release_message', 'Can release the claim of a stuck message'), ('replay_attempt', 'Can replay a finished message from history'), ('pause_queue', 'Can pause and resume a queue'), ('release_subject', 'Can release an ordered subject held by its dead head')]},
        ),
        migrations.RenameField(
            model_name='message',
            old_name='ordering_key',
            new_name='gate_key',
        ),
        migrations.AddField(
            model_name='message',
            name='gate_limit',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='message',
            name='gate_mode',
            field=models.CharField(blank=True, choices=[('hold', 'Ordered subject (a dead head holds it)'), ('skip', 'Ordered subject (skips a dead head)'), ('limit', 'Concurrency key')], max_length=5, null=True),
        ),
        migrations.AlterField(
            model_name='attempt',
            name='outcome',
            field=models.CharField(choices=[('succeeded', 'Succeeded'), ('retried', 'Failed, retried'), ('failed', 'Failed, dead'), ('lost', 'Lost (worker died)'), ('cancelled', 'Cancelled'), ('requeued', 'Requeued by an operator'), ('released', 'Stuck claim released by an operator'), ('priority', 'Priority changed by an operator'), ('replayed', 'Replayed (a copy enqueued) by an operator'), ('deferred', "Given back: the worker didn't know its task"), ('skipped', 'Dead head skipped: its subject released by an operator')], max_length=10),
        ),
        migrations.RunPython(exact, back_to_default, atomic=False),
        migrations.AddIndex(
            model_name='message',
            index=models.Index(fields=['gate_key', 'id'], name='mysqlq_msg_gate'),
        ),
        migrations.AddIndex(
            model_name='gate',
            index=models.Index(fields=['changed_at'], name='mysqlq_gate_changed'),
        ),
        migrations.AddIndex(
            model_name='gate',
            index=models.Index(fields=['gate_key'], name='mysqlq_gate_key'),
        ),
    ]
