from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "bench.chaos.ledger"
    label = "chaos_ledger"
    default_auto_field = "django.db.models.BigAutoField"
