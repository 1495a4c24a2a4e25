"""Unique jobs: a message's ``unique_for`` period, and the keys taken after a success.

Adding ``unique_for`` with a database default is an instant ALTER on MariaDB 10.3+ and
MySQL 8.0 (no table copy of the hot message table).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # DDL on MySQL commits anyway

    dependencies = [
        ('django_mysqlq', '0013_topics'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='unique_for',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.CreateModel(
            name='UniqueKey',
            fields=[
                ('id', models.CharField(max_length=32, primary_key=True, serialize=False)),
                ('dedup_key', models.CharField(max_length=255)),
                ('message_id', models.BigIntegerField()),
                ('task_name', models.CharField(blank=True, default='', max_length=255)),
                ('queue', models.CharField(blank=True, default='', max_length=64)),
                ('succeeded_at', models.DateTimeField(blank=True, null=True)),
                ('expires_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'unique key',
                'verbose_name_plural': 'unique keys (taken after success)',
                'db_table': 'mysqlq_unique_key',
                'indexes': [models.Index(fields=['expires_at'], name='mysqlq_uniq_expires')],
            },
        ),
    ]
