"""A Django task outside the task modules, imported by name from tests/testapp/djtasks.py:
workers load it through that module, so enqueue() accepts it."""

import os

from .models import Ledger

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def job(label):
    Ledger.objects.create(label=label, pid=os.getpid())
    return label
