"""The operator's admin: messages (with stuck and dead entry points), history, workers,
recurring tasks, topics (groups, messages), unique keys, rate-limit keys, and the
queue dashboard. Importing this package registers them with ``admin.site``."""

from .attempts import AttemptAdmin
from .blocked import BlockedMessageAdmin
from .dashboard import QueueDashboardAdmin
from .messages import DeadMessageAdmin, MessageAdmin, StuckMessageAdmin
from .rates import RateLimitAdmin
from .schedules import ScheduleAdmin
from .topicgroups import TopicGroupAdmin
from .topics import TopicMessageAdmin, TopicStateAdmin
from .unique import UniqueKeyAdmin
from .workers import WorkerAdmin

__all__ = ["AttemptAdmin", "BlockedMessageAdmin", "DeadMessageAdmin", "MessageAdmin",
           "QueueDashboardAdmin", "RateLimitAdmin", "ScheduleAdmin", "StuckMessageAdmin",
           "TopicGroupAdmin", "TopicMessageAdmin", "TopicStateAdmin", "UniqueKeyAdmin",
           "WorkerAdmin"]
