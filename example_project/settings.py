"""Settings of the example shop: a small Django project that uses django-mysqlq.

Everything that differs between machines comes from the environment (django-environ):

* ``DATABASE_URL``: defaults to ``mysql://root:@127.0.0.1:3306/mysqlq_demo``.
* ``SECRET_KEY``: defaults to an obviously-insecure development key.
* ``DEBUG`` (default true) and ``ALLOWED_HOSTS`` (comma-separated).
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, True),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1"]),
)

SECRET_KEY = env("SECRET_KEY", default="django-insecure-example-project-dev-only-do-not-deploy")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django_mysqlq",  # above the admin: its admin/index.html adds the queue box
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "example_project.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default="mysql://root:@127.0.0.1:3306/mysqlq_demo"),
}
DATABASES["default"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True  # required by django-mysqlq: every queue time is UTC on the database clock

STATIC_URL = "static/"

# Demo values: short backoff and frequent summaries so `bash .ci/demo` finishes in seconds.
# Production would keep the defaults (RETRY_BACKOFF 2 s, SUMMARY_SECONDS 60).
MYSQLQ = {
    "DEFAULT_QUEUE": "default",
    "MAX_ATTEMPTS": 3,
    "RETRY_BACKOFF": 0.2,
    "RETRY_BACKOFF_MAX": 5.0,
    "BATCH_SIZE": 20,
    "POLL_SECONDS": 0.5,
    "HEARTBEAT_SECONDS": 2.0,
    "LEASE_SECONDS": 10.0,
    "RECOVERY_SECONDS": 2.0,
    "GRACE_SECONDS": 10.0,
    "SUMMARY_SECONDS": 5,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": "plain",
        },
    },
    "loggers": {
        "django_mysqlq": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
    },
}
