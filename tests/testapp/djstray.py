"""A Django task in a module no worker imports: enqueue() must refuse it, with the fix."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def lost(label):
    return label
