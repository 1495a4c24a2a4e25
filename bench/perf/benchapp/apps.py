from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.perf.benchapp"
    label = "mysqlq_benchapp"
    default_auto_field = "django.db.models.BigAutoField"
