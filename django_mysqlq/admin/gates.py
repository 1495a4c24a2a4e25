"""What the admin shows of ordered subjects and concurrency keys: a message's gate, and the
messages holding it (the head a blocked message waits behind, and whether it is dead)."""

from __future__ import annotations

from collections.abc import Iterable

from django.urls import reverse
from django.utils.html import format_html, format_html_join

from .. import broker
from ..models import GateMode, Message, MessageStatus
from .databases import shown_suffix

#: Holders shown per gate (an ordered subject has one).
SHOWN_HOLDERS = 5


def gate_ref(message: Message) -> broker.GateRef | None:
    return broker.GateRef.of(message.queue, message.gate_mode, message.gate_key)


def gate_label(message: Message) -> str:
    """``subject 'order:42'`` (and how a dead head treats it), or the concurrency key."""
    if message.gate_key is None:
        return "-"
    if message.gate_mode == GateMode.LIMIT:
        return f"concurrency key {message.gate_key!r} (at most {message.gate_limit} at once)"
    held = "a dead head holds it" if message.gate_mode == GateMode.HOLD else \
        "skips a dead head"
    return f"ordered subject {message.gate_key!r} ({held})"


def holds_or_waits(message: Message) -> bool:
    """Whether a head action can apply: a blocked message, or a dead head that holds."""
    return message.status == MessageStatus.BLOCKED or (
        message.status == MessageStatus.DEAD and message.gate_mode == GateMode.HOLD)


def holders_of(messages: Iterable[Message]) -> dict[broker.GateRef, list[broker.Holder]]:
    """The holders of these messages' gates, in one statement."""
    refs = sorted({ref for m in messages if (ref := gate_ref(m)) is not None})
    return broker.holders(refs, SHOWN_HOLDERS) if refs else {}


def describe_holders(found: list[broker.Holder], *, exclude: int | None = None) -> str:
    """Links to the holders, the dead ones marked (empty: none holds it)."""
    shown = [h for h in found if h.id != exclude]
    if not shown:
        return ""
    return format_html_join(
        ", ", '<a href="{}">#{}</a> ({})',
        ((reverse("admin:django_mysqlq_message_change", args=[h.id]) + shown_suffix(), h.id,
          format_html("<strong class='mysqlq-dead'>{}</strong>", h.status)
          if h.status == MessageStatus.DEAD else h.status) for h in shown))


def gate_holders(message: Message) -> str | None:
    """For a message's page: who holds its gate, or None when it has no gate."""
    ref = gate_ref(message)
    if ref is None:
        return None
    found = holders_of([message]).get(ref, [])
    text = describe_holders(found, exclude=message.pk)
    if message.status == MessageStatus.BLOCKED:
        return format_html("Waiting behind {}.", text) if text else (
            "Waiting; nothing holds its gate right now (it moves at the next ack, or at the "
            "recovery leader's next check).")
    return format_html("Its gate is also held by {}.", text) if text else ""
