from django.apps import AppConfig


class MySQLQueueConfig(AppConfig):
    name = "django_mysqlq"
    verbose_name = "MySQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .backend import setup

        setup.ready()  # lets workers run Django's @task functions (django.tasks: names)
