"""URLs of the test project: the admin, for the admin and dashboard tests."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
