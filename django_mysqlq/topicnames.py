"""Names of topics, consumer groups and keys, and where a group starts: checked here.

Imports nothing of the package but ``limits``, so ``models`` and ``topics`` both use it.
"""

from __future__ import annotations

from . import limits

#: The queue a consumer group's deliveries live in: ``group:<name>``.
GROUP_QUEUE_PREFIX = "group:"
#: Task names of group deliveries: ``topic:<topic>:<group>``.
TASK_PREFIX = "topic:"
#: Where a consumer group begins when it is created.
LATEST = "latest"
EARLIEST = "earliest"
STARTS = (LATEST, EARLIEST)
#: Longest topic and group names (the group's queue name, ``group:<name>``, fits 64).
TOPIC_NAME_MAX = 64
GROUP_NAME_MAX = limits.QUEUE_NAME_MAX - len(GROUP_QUEUE_PREFIX)
#: Longest key: a group's deliveries' ordered subject is ``<topic>:<key>`` (255 at most).
KEY_MAX = 255 - TOPIC_NAME_MAX - 1


def _name_problem(value: object, what: str, longest: int) -> str | None:
    if (isinstance(value, str) and value and len(value) <= longest and "," not in value
            and ":" not in value and value == value.strip() and value.isprintable()
            and limits.is_utf8(value)):
        return None
    return (f"{what} must be a non-empty string of at most {longest} characters, without "
            "commas, colons, unprintable characters (a newline, a tab, NUL) or surrounding "
            f"whitespace, in valid UTF-8, not {value!r}.")


def topic_problem(value: object) -> str | None:
    return _name_problem(value, "A topic name", TOPIC_NAME_MAX)


def group_problem(value: object) -> str | None:
    return _name_problem(value, "A consumer group name", GROUP_NAME_MAX)


def group_queue(group: str) -> str:
    """The queue a group's deliveries live in."""
    return f"{GROUP_QUEUE_PREFIX}{group}"


def group_of_queue(queue: str) -> str | None:
    """The group whose deliveries live in ``queue``, or None for an ordinary queue."""
    return queue[len(GROUP_QUEUE_PREFIX):] if queue.startswith(GROUP_QUEUE_PREFIX) else None


def delivery_task_name(topic: str, group: str) -> str:
    return f"{TASK_PREFIX}{topic}:{group}"


def delivery_of_task(task_name: str) -> tuple[str, str] | None:
    """The topic and group of a delivery's task name (neither name has a colon), or None
    for a name of another form."""
    if not task_name.startswith(TASK_PREFIX):
        return None
    topic, colon, group = task_name[len(TASK_PREFIX):].partition(":")
    return (topic, group) if topic and colon and group and ":" not in group else None
