"""``@queue_task`` and the task objects it makes (the registry they go into: ``registry``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

from asgiref.sync import sync_to_async

from . import awaiting, calls, gating, limits, payload, rating, retries
from .conf import get_settings
from .cron import CronError, CronSchedule
from .cron import declare as cron_declare
from .exceptions import InvalidTaskOptions, QueueError
from .handles import MessageHandle
from .limits import QUEUE_NAME_MAX as QUEUE_NAME_MAX  # the admin imports it from here
from .messages import ClaimedMessage, NewMessage, Runner
from .registry import qualified_name, registry, unnamed_problem
from .routing import alias_for_queue
from .taskoptions import (
    checked,
    validate_dedup_key,
    validate_delay,
    validate_priority,
    validate_queue,
    validate_run_at,
)
from .uniqueness import DERIVED_KEY_PREFIX as DERIVED_KEY_PREFIX
from .uniqueness import derived_dedup_key, validate_unique_for

P = ParamSpec("P")
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class EnqueueOptions:
    """Per-call options; ``None`` means 'the task's default'."""

    queue: str | None = None
    priority: int | None = None
    delay: float | None = None
    run_at: dt.datetime | None = None
    dedup_key: str | None = None
    #: An ordered subject, or a concurrency key, for this call (see ``gating``).
    subject: str | None = None
    concurrency_key: str | None = None
    #: Unique job for this call: 0 (unique while queued) or seconds kept after success.
    unique_for: int | None = None
    #: The rate-limit key of this call, on a task with ``rate_limit`` (see ``rating``).
    rate_limit_key: str | None = None


@dataclasses.dataclass(frozen=True)
class TaskCall:
    """The arguments of one call, made by ``task.call(...)`` for ``enqueue_many()``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: The function these arguments were checked against (by ``.call()``), or None.
    checked_for: Callable[..., Any] | None = dataclasses.field(
        default=None, compare=False, repr=False)


class AttemptScope(Protocol):
    """One attempt of a task that has :class:`TaskHooks`, as the worker runs it."""

    def run(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Call the function; what it returns is the result stored in history."""

    def finished(self, outcome: str, value: Any, error: BaseException | None) -> None:
        """Called once the outcome is recorded (inside the exception handler on failure)."""


class TaskHooks(Protocol):
    """Lets a kind of task wrap its attempts (Django's ``@task``: context, signals, JSON)."""

    def begin(self, message: ClaimedMessage, runner: Runner,
              started_at: dt.datetime) -> AttemptScope:
        """Start one attempt. Must not do I/O or raise: ``run()`` does the work."""


@dataclasses.dataclass(frozen=True)
class QueueTask(Generic[P, R]):
    """A registered task. Call it to run inline; ``.enqueue()`` it to run on a worker."""

    func: Callable[P, R]
    name: str
    queue: str
    priority: int
    max_attempts: int
    retry_backoff: float
    timeout: float | None
    #: Run the body and its ack in one transaction on the queue's database.
    atomic: bool = False
    options: EnqueueOptions = EnqueueOptions()
    #: Set for tasks found by a resolver (see ``TaskRegistry.add_resolver``).
    hooks: TaskHooks | None = None
    #: Its ordered subject or concurrency key, as declared (see ``gating``).
    gate: gating.TaskGate = gating.NO_GATE
    #: Exceptions that alone retry (empty: all), and exceptions that never retry.
    retry_on: retries.ExceptionClasses = ()
    dont_retry: retries.ExceptionClasses = ()
    #: Delays of the n-th retry, the last repeating (empty: exponential ``retry_backoff``).
    retry_schedule: tuple[float, ...] = ()
    #: The function's first parameter receives a :class:`~django_mysqlq.context.TaskContext`.
    takes_context: bool = False
    #: Its recurring schedule (``cron=...``), enqueued by the workers; None for most tasks.
    schedule: CronSchedule | None = None
    #: Unique job: None (not unless a call gives a dedup_key), 0 (unique while queued) or
    #: seconds its key stays taken after a success. A call without a dedup_key then gets
    #: one made of its task and arguments (:func:`derived_dedup_key`).
    unique_for: int | None = None
    #: Its global rate limit (``rate_limit="100/m"``), or None.
    rate: rating.TaskRate | None = None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    def using(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        dedup_key: str | None = None,
        subject: str | None = None,
        concurrency_key: str | None = None,
        unique_for: int | dt.timedelta | None = None,
        rate_limit_key: str | None = None,
    ) -> QueueTask[P, R]:
        """A copy of this task with per-call options for the next enqueue.

        ``subject``: run in this ordered subject (one at a time, in enqueue order);
        ``concurrency_key``: count against this key of the task's ``concurrency_limit``;
        ``unique_for``: 0 (unique while queued) or seconds the dedup key stays taken after
        a success (the key: ``dedup_key``, else made of the task and its arguments);
        ``rate_limit_key``: count against this key of the task's ``rate_limit``.
        """
        if delay is not None and run_at is not None:
            raise InvalidTaskOptions("Give either delay or run_at, not both.")
        current = self.options
        if self.rate is not None and subject is not None:
            # (As at declaration: rating.check_alone. Let through, the message took the
            # gate's path and no rate key row: nothing claimed it for a while.)
            raise InvalidTaskOptions(
                f"{self.name}: .using(subject=...) on a task with a rate_limit: a message "
                "waits for one thing at a time (its ordered subject or its rate limit); "
                "declare two tasks, one calling the other.")
        subject, concurrency_key = gating.check_using(self.gate, self.name, subject,
                                                      concurrency_key)
        options = EnqueueOptions(
            queue=validate_queue(queue) if queue is not None else current.queue,
            priority=validate_priority(priority) if priority is not None else current.priority,
            delay=validate_delay(delay) if delay is not None else (
                None if run_at is not None else current.delay),
            run_at=validate_run_at(run_at) if run_at is not None else (
                None if delay is not None else current.run_at),
            dedup_key=validate_dedup_key(dedup_key) if dedup_key is not None
            else current.dedup_key,
            subject=subject if subject is not None or concurrency_key is not None
            else current.subject,
            concurrency_key=concurrency_key if subject is not None or concurrency_key
            is not None else current.concurrency_key,
            unique_for=validate_unique_for(unique_for) if unique_for is not None
            else current.unique_for,
            rate_limit_key=rating.check_using(self.rate, self.name, rate_limit_key)
            if rate_limit_key is not None else current.rate_limit_key,
        )
        return dataclasses.replace(self, options=options)

    def _new_message(self, args: Sequence[Any], kwargs: Mapping[str, Any], *,
                     checked: bool = False, where: str = "") -> NewMessage:
        if not checked:
            calls.check_call(self.name, self.func, args, kwargs, where=where,
                             skip_first=self.takes_context)
        opts = self.options
        gate = gating.for_call(self.gate, self.func, self.name, args, kwargs, opts.subject,
                               opts.concurrency_key)
        encoded = payload.encode(self.name, args, kwargs, get_settings().MAX_PAYLOAD_BYTES)
        rate = rating.for_call(self.rate, self.func, self.name, args, kwargs,
                               opts.rate_limit_key)
        unique_for = self.unique_for if opts.unique_for is None else opts.unique_for
        dedup_key = opts.dedup_key
        if dedup_key is None and unique_for is not None:
            dedup_key = derived_dedup_key(self.name, self.func, args, kwargs, encoded,
                                          skip_first=self.takes_context)
        return NewMessage(
            task_name=self.name,
            queue=opts.queue or self.queue,
            priority=self.priority if opts.priority is None else opts.priority,
            payload=encoded,
            run_at=opts.run_at,
            delay=opts.delay or 0.0,
            max_attempts=self.max_attempts,
            retry_backoff=self.retry_backoff,
            timeout=self.timeout,
            dedup_key=dedup_key,
            gate_key=gate[0] if gate else None,
            gate_mode=gate[1] if gate else None,
            gate_limit=gate[2] if gate else None,
            unique_for=unique_for or 0,
            rate_key=rate[0] if rate else None,
            rate_interval=rate[1] if rate else None,
            rate_limit=self.rate.spec if self.rate is not None else "",
        )

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> MessageHandle:
        """Write one message in the caller's transaction and return its handle.

        The message exists exactly when that transaction commits. Arguments must fit the
        function's signature (else :class:`TaskArgumentError`) and be JSON values (else
        :class:`ArgumentEncodingError`); nothing is written when they don't. With
        ``MYSQLQ['IMMEDIATE']`` the task runs in this process after the commit instead.
        """
        from . import broker

        message = self._new_message(args, kwargs)
        if get_settings().IMMEDIATE:
            from . import immediate

            [handle] = immediate.enqueue(self, [message])
            return handle
        [message_id] = broker.enqueue([message])
        return MessageHandle(message_id, self.name, alias_for_queue(message.queue))

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> MessageHandle:
        return await sync_to_async(self.enqueue)(*args, **kwargs)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> TaskCall:
        """One call's arguments, for :meth:`enqueue_many`: type-checked like a real call,
        and checked against the signature here (:class:`TaskArgumentError`)."""
        calls.check_call(self.name, self.func, args, kwargs, skip_first=self.takes_context)
        return TaskCall(tuple(args), dict(kwargs), checked_for=self.func)

    def enqueue_many(self, calls: Iterable[TaskCall | Sequence[Any]]) -> list[MessageHandle]:
        """Enqueue many calls with multi-row inserts; return their handles in order.

        Each item is ``task.call(*args, **kwargs)``, or a list or tuple of positional
        arguments. Every message is encoded before anything is written, so one bad
        argument writes none of them. A ``dedup_key`` set with ``.using()`` can't apply
        to many messages; a unique task's messages (``unique_for``) each get their own
        key and are written one by one.
        """
        from . import broker

        if self.options.dedup_key is not None:
            raise InvalidTaskOptions(
                "enqueue_many() can't share one dedup_key between messages; "
                "enqueue them one by one with .using(dedup_key=...)."
            )
        messages = []
        for index, call in enumerate(calls):
            where = f"Item {index} of enqueue_many(): "
            if isinstance(call, TaskCall):
                messages.append(self._new_message(
                    call.args, call.kwargs, checked=call.checked_for is self.func, where=where))
            elif isinstance(call, list | tuple):
                messages.append(self._new_message(call, {}, where=where))
            else:
                raise InvalidTaskOptions(
                    f"Item {index} of enqueue_many() is {call!r}: give "
                    f"{self.name.rsplit('.', 1)[-1]}.call(*args, **kwargs) or a list/tuple of "
                    "positional arguments, e.g. [(pk,) for pk in ids]."
                )
        if get_settings().IMMEDIATE:
            from . import immediate

            return list(immediate.enqueue(self, messages))
        ids = broker.enqueue(messages)
        return [MessageHandle(message_id, self.name, alias_for_queue(message.queue))
                for message_id, message in zip(ids, messages, strict=True)]

    async def aenqueue_many(
        self, calls: Iterable[TaskCall | Sequence[Any]]
    ) -> list[MessageHandle]:
        return await sync_to_async(self.enqueue_many)(calls)


def _check_takes_context(function: Callable[..., Any], takes_context: object) -> None:
    if not isinstance(takes_context, bool):
        raise InvalidTaskOptions(f"takes_context must be True or False, not {takes_context!r}.")
    if not takes_context:
        return
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return  # no signature to check (some C callables): the call will tell
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    if not parameters or parameters[0].kind not in positional:
        raise InvalidTaskOptions(
            f"{qualified_name(function)} has takes_context=True, so its first parameter receives "
            "the task context: add one, e.g. def task(context, ...).")


def _declare_schedule(task: QueueTask[Any, Any], expression: object, tz: object,
                      catch_up: object, args: object, kwargs: object) -> CronSchedule:
    """Check ``cron=...`` and the arguments each occurrence is called with."""
    try:
        declared = cron_declare(task.name, expression, tz, catch_up, args, kwargs)
    except CronError as exc:
        raise InvalidTaskOptions(str(exc)) from None
    try:
        calls.check_call(task.name, task.func, declared.args, declared.kwargs,
                         skip_first=task.takes_context)
        payload.encode(task.name, declared.args, declared.kwargs,
                       get_settings().MAX_PAYLOAD_BYTES)
    except QueueError as exc:
        raise InvalidTaskOptions(
            f"{task.name}: each occurrence of cron={declared.cron!r} calls it with "
            f"cron_args={list(declared.args)!r} and cron_kwargs={declared.kwargs!r}, which "
            f"can't be used: {str(exc).replace('; nothing was enqueued', '')} Give "
            "cron_args/cron_kwargs that fit, or defaults to its parameters.") from None
    return declared


@overload
def queue_task(func: Callable[P, R], /) -> QueueTask[P, R]: ...


@overload
def queue_task(
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    retry_backoff: float | Sequence[float] | None = None,
    timeout: float | None = None,
    name: str | None = None,
    atomic: bool = False,
    ordered_by: gating.KeySource | None = None,
    on_dead: str | None = None,
    concurrency_key: gating.KeySource | None = None,
    concurrency_limit: int | None = None,
    retry_on: type[BaseException] | Sequence[type[BaseException]] = (),
    dont_retry: type[BaseException] | Sequence[type[BaseException]] = (),
    takes_context: bool = False,
    cron: str | None = None,
    cron_tz: str | None = None,
    catch_up: str = "skip",
    cron_args: Sequence[Any] = (),
    cron_kwargs: Mapping[str, Any] | None = None,
    unique_for: int | dt.timedelta | None = None,
    rate_limit: str | None = None,
    rate_limit_key: gating.KeySource | None = None,
) -> Callable[[Callable[P, R]], QueueTask[P, R]]: ...


def queue_task(
    func: Callable[P, R] | None = None,
    /,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    retry_backoff: float | Sequence[float] | None = None,
    timeout: float | None = None,
    name: str | None = None,
    atomic: bool = False,
    ordered_by: gating.KeySource | None = None,
    on_dead: str | None = None,
    concurrency_key: gating.KeySource | None = None,
    concurrency_limit: int | None = None,
    retry_on: type[BaseException] | Sequence[type[BaseException]] = (),
    dont_retry: type[BaseException] | Sequence[type[BaseException]] = (),
    takes_context: bool = False,
    cron: str | None = None,
    cron_tz: str | None = None,
    catch_up: str = "skip",
    cron_args: Sequence[Any] = (),
    cron_kwargs: Mapping[str, Any] | None = None,
    unique_for: int | dt.timedelta | None = None,
    rate_limit: str | None = None,
    rate_limit_key: gating.KeySource | None = None,
) -> QueueTask[P, R] | Callable[[Callable[P, R]], QueueTask[P, R]]:
    """Register a function as a queue task, under ``module.qualname`` unless ``name`` is given.

    Options left out take their defaults from ``MYSQLQ`` when the decorator runs.
    ``atomic=True`` runs the body and its ack in one transaction on the queue's database:
    the task's writes there commit exactly when the message is marked done (exactly once).
    ``ordered_by`` (an argument's name or a function of the arguments) gives each message
    a subject: within a queue, a subject's messages run one at a time, in enqueue order;
    ``on_dead`` says whether a dead one holds its subject (``"hold"``) or not (``"skip"``).
    ``concurrency_limit=N`` runs at most N messages of one ``concurrency_key`` (an
    argument's name or a function; left out: one key for the whole task) at once; a dead
    one frees its slot (no ``on_dead``). See docs/ordering.md. ``unique_for`` makes a
    unique job: 0 keeps one message per key while queued, N seconds also keeps the key
    taken for N seconds after a success; the key is the call's ``dedup_key``, else made of
    the task and its arguments. ``rate_limit="100/m"`` (or /s, /h, /d) starts at most that
    many messages of one ``rate_limit_key`` (like ``concurrency_key``; left out: the whole
    task) per window, across all workers, spread evenly.
    """

    def decorate(function: Callable[P, R]) -> QueueTask[P, R]:
        conf = get_settings()
        attempts = conf.MAX_ATTEMPTS if max_attempts is None else max_attempts
        backoff: object = conf.RETRY_BACKOFF if retry_backoff is None else retry_backoff
        checked(limits.max_attempts_problem(attempts))
        schedule: tuple[float, ...] = ()
        if isinstance(backoff, list | tuple):
            schedule = retries.backoff_schedule(backoff)
            backoff = schedule[0]  # what a worker without schedules uses: the first delay
        checked(limits.seconds_problem(backoff, "retry_backoff"))
        assert isinstance(backoff, int | float)
        if timeout is not None:
            checked(limits.seconds_problem(timeout, "timeout", zero=False))
        if not isinstance(atomic, bool):
            raise InvalidTaskOptions(f"atomic must be True or False, not {atomic!r}.")
        if atomic and awaiting.is_async(function):
            raise InvalidTaskOptions(
                f"{qualified_name(function)} is async: atomic=True needs a plain function, whose "
                "queries run on the worker thread's connection inside the ack's transaction."
            )
        if name is None:
            checked(unnamed_problem(function, "A task", "pass name=... to @queue_task, or "
                                     "wrap it in a def."))
        task_name = name if name is not None else qualified_name(function)
        if not isinstance(task_name, str) or not task_name or len(task_name) > 255:
            raise InvalidTaskOptions(
                f"name must be a non-empty string of at most 255 characters, not {task_name!r}."
            )
        _check_takes_context(function, takes_context)
        task: QueueTask[P, R] = QueueTask(
            func=function,
            name=task_name,
            queue=validate_queue(conf.DEFAULT_QUEUE if queue is None else queue),
            priority=validate_priority(conf.DEFAULT_PRIORITY if priority is None else priority),
            max_attempts=attempts,
            retry_backoff=float(backoff),
            timeout=None if timeout is None else float(timeout),
            atomic=atomic,
            gate=gating.declare(function, task_name, ordered_by=ordered_by, on_dead=on_dead,
                                concurrency_key=concurrency_key,
                                concurrency_limit=concurrency_limit,
                                takes_context=takes_context),
            retry_on=retries.exception_classes(retry_on, "retry_on"),
            dont_retry=retries.exception_classes(dont_retry, "dont_retry"),
            retry_schedule=schedule,
            takes_context=takes_context,
            unique_for=None if unique_for is None else validate_unique_for(
                unique_for, f"{task_name}: unique_for"),
            rate=rating.declare(function, task_name, rate_limit=rate_limit,
                                rate_limit_key=rate_limit_key, takes_context=takes_context),
        )
        rating.check_alone(task_name, task.rate, task.gate, cron)
        if cron is not None and (alone := gating.unschedulable(task.gate, task.unique_for)):
            raise InvalidTaskOptions(
                f"{task_name}: cron=... can't be combined with {alone[0]}: {alone[1]}. Put "
                f"cron=... on a task without it whose body calls {task_name}.enqueue(...).")
        if cron is not None:
            task = dataclasses.replace(task, schedule=_declare_schedule(
                task, cron, cron_tz, catch_up, cron_args, cron_kwargs))
        elif stray := [f"{option}={value!r}" for option, value, unset in (
                ("cron_tz", cron_tz, None), ("catch_up", catch_up, "skip"),
                ("cron_args", cron_args, ()), ("cron_kwargs", cron_kwargs, None))
                if value != unset and not (option == "cron_args" and value == [])]:
            raise InvalidTaskOptions(
                f"{task_name}: {', '.join(stray)} without cron=...: cron_tz, catch_up, cron_args "
                "and cron_kwargs go with a schedule; give its cron=... too, or leave them out.")
        registry.register(task)
        return task

    if func is not None:
        return decorate(func)
    return decorate
