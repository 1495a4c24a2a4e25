"""The operator's admin: messages (with stuck and dead entry points), history, workers,
recurring tasks, topics (groups, messages), and the queue dashboard. Importing this
package registers them with ``admin.site``."""

from .attempts import AttemptAdmin
from .blocked import BlockedMessageAdmin
from .dashboard import QueueDashboardAdmin
from .messages import DeadMessageAdmin, MessageAdmin, StuckMessageAdmin
from .schedules import ScheduleAdmin
from .topicgroups import TopicGroupAdmin
from .topics import TopicMessageAdmin, TopicStateAdmin
from .workers import WorkerAdmin

__all__ = ["AttemptAdmin", "BlockedMessageAdmin", "DeadMessageAdmin", "MessageAdmin",
           "QueueDashboardAdmin", "ScheduleAdmin", "StuckMessageAdmin", "TopicGroupAdmin",
           "TopicMessageAdmin", "TopicStateAdmin", "WorkerAdmin"]
