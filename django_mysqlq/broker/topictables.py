"""The topic tables' names and the offset index: below every module that writes SQL for
topics (``topics`` re-exports them, where they were first defined)."""

from __future__ import annotations

TOPIC_TABLE = "mysqlq_topic"
TOPIC_MESSAGE_TABLE = "mysqlq_topic_message"
GROUP_TABLE = "mysqlq_topic_group"
#: The (topic, offset) unique index: also walks a topic's unsequenced rows (NULL offsets
#: first) in id order.
OFFSET_INDEX = "mysqlq_tmsg_offset"
