from django.db import migrations, models

KINDS = [("plain", "Plain"), ("atomic", "Atomic"), ("crash", "Crash"), ("ordered", "Ordered"),
         ("limited", "Limited")]


class Migration(migrations.Migration):

    dependencies = [
        ("chaos_ledger", "0002_crash_kind"),
    ]

    operations = [
        migrations.AlterField(
            model_name="enqueued",
            name="kind",
            field=models.CharField(choices=KINDS, max_length=8),
        ),
        migrations.AlterField(
            model_name="execution",
            name="kind",
            field=models.CharField(choices=KINDS, max_length=8),
        ),
        migrations.AddField(
            model_name="enqueued",
            name="gate_key",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
