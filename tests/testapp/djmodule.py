"""A module of Django tasks that tests/testapp/djtasks.py imports as a module."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def shout(label):
    return label.upper()
