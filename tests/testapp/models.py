from django.db import models


class Ledger(models.Model):
    """One row per task execution, written by the test tasks."""

    label = models.CharField(max_length=100)
    value = models.IntegerField(null=True)
    pid = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.label
