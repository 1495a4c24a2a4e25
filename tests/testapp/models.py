from django.db import models


class Ledger(models.Model):
    """One row per task execution, written by the test tasks."""

    label = models.CharField(max_length=100)
    value = models.IntegerField(null=True)
    pid = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.label


class GateRun(models.Model):
    """One edge of one run of an ordered or concurrency-limited test task: its start, or
    its end (with the outcome). Written in autocommit by the task itself, so the order and
    overlap of runs can be judged from the host clock (workers share the host)."""

    label = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    seq = models.IntegerField()
    edge = models.CharField(max_length=5)
    outcome = models.CharField(max_length=10, blank=True, default="")
    at = models.FloatField()
    pid = models.IntegerField()
    thread = models.CharField(max_length=100)

    class Meta:
        indexes = [models.Index(fields=["label", "key", "at"], name="testapp_gaterun_key")]

    def __str__(self) -> str:
        return f"{self.label} {self.key}#{self.seq} {self.edge}"
