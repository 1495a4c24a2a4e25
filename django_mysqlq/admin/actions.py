"""Operator actions on messages: one table of what each does and which permission it needs.

The bulk admin actions, the buttons on a message's page and "requeue all dead matching
this filter" all end here, in :mod:`django_mysqlq.ops` and the broker: never ``save()``.
Each action needs its own permission, a POST (CSRF-checked by the admin) and leaves a
history row naming the user.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern

from .. import broker, ops
from ..broker import Operator
from ..limits import row_id
from .listing import COUNT_CAP

#: Permission codenames, in the ``django_mysqlq`` app.
REQUEUE = "requeue_message"
CANCEL = "cancel_message"
PRIORITY = "change_priority"
RELEASE = "release_message"
REPLAY = "replay_attempt"
PAUSE = "pause_queue"
RELEASE_SUBJECT = "release_subject"


def allowed(request: HttpRequest, codename: str) -> bool:
    return request.user.has_perm(f"django_mysqlq.{codename}")


def who(request: HttpRequest) -> Operator:
    return ops.operator(request.user.get_username(), "admin")


#: The confirmation page's one field carrying the selected ids, comma-joined: a field per
#: id passes Django's DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000) well before COUNT_CAP.
SELECTED_IDS = "_selected_ids"


def take_selection(request: HttpRequest) -> HttpResponse | None:
    """Give a confirmation's ``_selected_ids`` to Django's action handling as its usual
    checkbox list; when it is not a list of row ids, a redirect back (nothing done)."""
    if request.method != "POST" or SELECTED_IDS not in request.POST:
        return None
    ids = [row_id(part) for part in request.POST[SELECTED_IDS].split(",")]
    if len(ids) > COUNT_CAP or any(i is None for i in ids):
        messages.error(request, "The selection sent back was not a list of message ids; "
                       "nothing was done: select them again.")
        return HttpResponseRedirect(request.get_full_path())
    post = request.POST.copy()
    del post[SELECTED_IDS]
    post.setlist(ACTION_CHECKBOX_NAME, [str(i) for i in ids])
    request.POST = post  # type: ignore[assignment]
    return None


def outside_request_transaction(urls: list[URLPattern]) -> list[URLPattern]:
    """Exempt these views from ``ATOMIC_REQUESTS``, on every database.

    The broker keeps its own short transactions: a bulk action commits batch by batch
    instead of holding its row locks for the whole request, and ``release_stuck`` judges
    other connections' liveness in autocommit (it refuses to run inside a transaction).
    """
    for pattern in urls:
        for alias in connections:
            transaction.non_atomic_requests(using=alias)(pattern.callback)
    return urls


@dataclasses.dataclass(frozen=True)
class Action:
    """An operator action on a set of message ids."""

    name: str
    label: str
    permission: str
    #: Shown on the confirmation page; empty: the action runs on the first POST.
    confirm: str
    #: Statuses it applies to, for the message page's buttons.
    statuses: tuple[str, ...]
    run: Callable[[Sequence[int], Operator, int | None], list[int]]
    done: str
    skipped: str
    needs_priority: bool = False
    #: Acts on the dead head holding each selected message's subject (the selected ones
    #: may be blocked messages behind it): ``done`` counts heads, not selected messages.
    on_heads: bool = False


def _release(ids: Sequence[int], operator: Operator, _: int | None) -> list[int]:
    return list(broker.release_stuck(ids, operator))


def _priority(ids: Sequence[int], operator: Operator, priority: int | None) -> list[int]:
    if priority is None:
        raise ValueError("Give a priority from -100 to 100.")
    return broker.set_priority(ids, priority, operator)


ACTIONS: dict[str, Action] = {action.name: action for action in (
    Action("requeue", "Requeue now", REQUEUE, "", ("ready", "scheduled", "dead"),
           lambda ids, op, _: broker.requeue(ids, op),
           "Requeued {n} message(s): ready now.",
           "{n} skipped: running, finished or not ready/scheduled/dead."),
    Action("requeue_reset", "Requeue now, resetting attempts", REQUEUE, "",
           ("ready", "scheduled", "dead"),
           lambda ids, op, _: broker.requeue(ids, op, reset_attempts=True),
           "Requeued {n} message(s) with their attempts reset.",
           "{n} skipped: running, finished or not ready/scheduled/dead."),
    Action("retry_dead", "Retry dead (full set of attempts)", REQUEUE, "", ("dead",),
           lambda ids, op, _: broker.requeue(ids, op, reset_attempts=True,
                                             statuses=("dead",)),
           "Retrying {n} dead message(s).", "{n} skipped: not dead."),
    Action("cancel", "Cancel", CANCEL,
           "Cancelled messages are deleted from the queue; history keeps their arguments, "
           "so they can be replayed.", ("ready", "scheduled", "blocked", "throttled", "dead"),
           lambda ids, op, _: broker.cancel(ids, op),
           "Cancelled {n} message(s).",
           "{n} skipped: running or finished."),
    Action("priority", "Change priority", PRIORITY, "Messages take the new priority "
           "(-100..100, higher runs first); running ones are left alone.",
           ("ready", "scheduled", "blocked", "throttled", "dead"), _priority,
           "Changed the priority of {n} message(s).",
           "{n} skipped: running or finished.", needs_priority=True),
    Action("release", "Release stuck claim", RELEASE, "", ("claimed",), _release,
           "Released {n} stuck claim(s): back in the queue (or dead if out of attempts).",
           "{n} refused: their worker is alive (or they are no longer claimed). Stop the "
           "worker, or wait for its lease to run out."),
    Action("requeue_head", "Requeue the dead head holding the subject", REQUEUE, "",
           ("blocked", "dead"), lambda ids, op, _: broker.requeue_heads(ids, op),
           "Requeued {n} dead head(s) with a full set of attempts: each runs next, then "
           "the messages behind it, in order.",
           "{n} selected: no dead head holds their subject (it is running, retrying or "
           "gone).", on_heads=True),
    Action("release_subject", "Release the subject (skip its dead head)", RELEASE_SUBJECT,
           "The dead head stays dead, with its arguments and trace (requeue it later if it "
           "should still run, out of order); the next message of its subject runs now.",
           ("blocked", "dead"), lambda ids, op, _: broker.release_subjects(ids, op),
           "Released {n} subject(s): their dead heads no longer hold them.",
           "{n} selected: no dead head holds their subject (it is running, retrying or "
           "gone).", on_heads=True),
)}


def perform(action: Action, ids: Sequence[int], request: HttpRequest,
            priority: int | None = None) -> tuple[list[int], int]:
    """Run ``action``; return (ids done, how many of ``ids`` were skipped)."""
    done = action.run(ids, who(request), priority)
    if action.on_heads:
        return done, 0 if done else len(set(ids))
    return done, len(set(ids)) - len(done)
