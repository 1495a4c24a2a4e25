"""A task of the "next release": only workers started with this module in
``MYSQLQ['TASK_MODULES']`` know it (tests/test_deploys.py). Not autodiscovered: not a
``tasks`` module."""

import os

from django_mysqlq import queue_task

from .models import Ledger


@queue_task(max_attempts=1)
def new_in_this_release(label: str) -> None:
    Ledger.objects.create(label=label, pid=os.getpid())
