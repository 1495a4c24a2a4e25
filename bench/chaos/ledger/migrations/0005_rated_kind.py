from django.db import migrations, models

KINDS = [("plain", "Plain"), ("atomic", "Atomic"), ("crash", "Crash"), ("ordered", "Ordered"),
         ("limited", "Limited"), ("rated", "Rated")]


class Migration(migrations.Migration):

    dependencies = [
        ("chaos_ledger", "0004_topics"),
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
    ]
