"""A group handler past its timeout: a log line naming the topic, group and offset, and
the ``topic_handler_overran`` signal (an alert hook), once per delivery attempt."""

from __future__ import annotations

import json
import logging

from .. import broker
from ..messages import ClaimedMessage
from ..signals import topic_handler_overran
from ..topicnames import TASK_PREFIX

logger = logging.getLogger("django_mysqlq")


def _offset(message: ClaimedMessage) -> int | None:
    try:
        value = json.loads(message.payload).get("kwargs", {}).get("offset")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def report_overran(message: ClaimedMessage, seconds: float) -> bool:
    """Alert if ``message`` is a consumer group's delivery; whether it was one."""
    if not message.task_name.startswith(TASK_PREFIX):
        return False
    topic, _, group = message.task_name[len(TASK_PREFIX):].partition(":")
    offset = _offset(message)
    logger.warning("Topic handler of group %r on topic %r has run %.0fs on offset %s "
                   "(delivery #%s), past its timeout of %.0fs.", group, topic, seconds,
                   offset, message.id, message.timeout or 0)
    broker.send_robust(topic_handler_overran, topic, group=group, message_id=message.id,
                       offset=offset, seconds=seconds, timeout=message.timeout)
    return True
