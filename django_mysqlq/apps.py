from django.apps import AppConfig


class MySQLQueueConfig(AppConfig):
    name = "django_mysqlq"
    verbose_name = "MySQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, routing  # noqa: F401  (checks registers the system checks)
        from .backend import setup
        from .worker.queues import placed_queues

        # A queue a router's db_for_queue alone places makes its alias a queue database.
        routing.add_queue_source(placed_queues)

        setup.ready()  # lets workers run Django's @task functions (django.tasks: names)
