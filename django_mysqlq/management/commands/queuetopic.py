"""``manage.py queuetopic``: consumer groups' positions and lag; reset, replay, lookup,
drop."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from django_mysqlq import broker, ops, topicops
from django_mysqlq.management import cli

GROUP_COLUMNS = ("topic", "group", "position", "last", "lag", "oldest", "dead", "changed")


def _cut(text: str, limit: int) -> str:
    """``text`` up to ``limit`` characters, saying so where it was longer."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} chars; --json for all)"


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f}s"


def groups_table(states: list[broker.GroupState]) -> str:
    rows: list[tuple[str, ...]] = [GROUP_COLUMNS]
    for g in states:
        changed = (f"{cli.utc(g.changed_at, seconds=False)} {g.changed_by}" if g.changed_at
                   else "-")
        rows.append((g.topic, g.group, str(g.position), str(g.last_offset), g.lag_shown,
                     _age(g.oldest_age_seconds), str(g.dead), changed))
    widths = [max(len(row[i]) for row in rows) for i in range(len(GROUP_COLUMNS))]
    table = "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                      .rstrip() for row in rows)
    return "\n".join([table, *_problems(states)])


def _problems(states: list[broker.GroupState]) -> list[str]:
    """A line under the table for each group whose pump a member said can't go on, and
    for each whose position is past its topic's end."""
    lines = [f"{g.topic} / {g.group}: its pump can't go on"
             + (f" (since {cli.utc(g.pump_problem_at)})" if g.pump_problem_at else "")
             + f": {g.pump_problem}" for g in states if g.pump_problem]
    lines.extend(f"{g.topic} / {g.group}: {g.position_problem}" for g in states
                 if g.position_problem)
    return ["", *lines] if lines else []


def _attempts(delivery: broker.topic_lookup.DeliveryTrace) -> str:
    """``3 attempts``: the runs only; then the operator actions (``requeued by
    admin:alice``), which are history rows but not attempts."""
    runs = len(delivery.runs)
    said = f"{runs} attempt{'' if runs == 1 else 's'}"
    actions = [f"{a.outcome} by {a.actor}" if a.actor else a.outcome
               for a in delivery.actions]
    return "; ".join([said, *actions])


def _action_json(row: broker.topic_lookup.AttemptRow) -> dict[str, Any]:
    return {"action": row.outcome, "by": row.actor,
            "at": row.finished_at.isoformat() if row.finished_at else None,
            "note": row.error}


def _more(found: broker.Lookup, options: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """What a lookup that matched more than ``--limit`` says, and the options of its next
    page (``next`` in ``--json``): older messages of a key below the oldest shown, later
    ones of a time range after the last shown (its publish time and id: many messages
    can share one time, a publish_many() gives its rows one). ("", None) when it didn't."""
    if not found.truncated or not found.messages:
        return "", None
    shown, last = len(found.messages), found.messages[-1]
    limit = (f", or raise --limit (up to {broker.topic_lookup.LOOKUP_MAX})"
             if shown < broker.topic_lookup.LOOKUP_MAX else "")
    if options["key"] is not None and last.offset is not None:
        return (f"More messages of key {options['key']!r} match: only the newest {shown} "
                f"are shown, down to offset {last.offset}. For the older ones, run the same "
                f"lookup with --before-offset {last.offset}{limit}."), {
                    "before_offset": last.offset}
    if options["offset"] is None and last.published_at is not None:
        since = last.published_at.isoformat()
        return (f"More messages match: only the first {shown} published in the range are "
                f"shown, up to {since}. For the later ones, run the same lookup with "
                f"--since {since} --after-id {last.id}{limit}, or narrow the range."), {
                    "since": since, "after_id": last.id}
    return f"More messages match: only the first {shown} are shown{limit}.", None


class Command(cli.SaysDatabaseErrors):
    help = ("Topics' consumer groups: 'groups' (position, lag, oldest unhandled, dead "
            "letter), 'reset' a group's position, 'replay' a range into one group, "
            "'lookup' messages by offset, key or time with their trace, 'drop' a retired "
            "group.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        cli.explain_dashed_durations(parser)
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("groups", help="Every group: position, lag, dead letter.")
        listing.add_argument("--topic", default=None)
        listing.add_argument("--json", action="store_true")
        reset = sub.add_parser("reset", help="Move a group's position (its waiting "
                               "deliveries are cancelled; the next offset it gets is the "
                               "target: waiting ones before it never run, the output says "
                               "which).")
        reset.add_argument("group")
        reset.add_argument("--topic", required=True)
        where = reset.add_mutually_exclusive_group(required=True)
        where.add_argument("--to-offset", type=int, help="The next offset the group gets.")
        where.add_argument("--to-time", help="The first message published at or after this "
                           "time: ISO (UTC unless it has an offset) or a duration ago (2h, "
                           "no dash), as lookup --since takes. None published at or after "
                           "it yet: the latest offset.")
        where.add_argument("--earliest", action="store_true", help="The earliest kept message.")
        where.add_argument("--latest", action="store_true", help="Only messages from now on.")
        replay = sub.add_parser("replay", help="New deliveries of a range for one group.")
        replay.add_argument("--topic", required=True)
        replay.add_argument("--group", required=True)
        replay.add_argument("--from-offset", type=int, required=True)
        replay.add_argument("--to-offset", type=int, required=True)
        drop = sub.add_parser("drop", help="Retire a group whose subscription was removed "
                              "from the code: its waiting and dead deliveries are cancelled, "
                              "its delivery links and row deleted (running ones finish).")
        drop.add_argument("group")
        drop.add_argument("--topic", required=True)
        drop.add_argument("--json", action="store_true")
        lookup = sub.add_parser("lookup", help="Messages by offset, key or time, traced.")
        lookup.add_argument("--topic", required=True)
        lookup.add_argument("--offset", type=int, default=None)
        lookup.add_argument("--key", default=None, help="Its messages, newest first; with "
                            "--since/--until, those published then.")
        lookup.add_argument("--before-offset", type=int, default=None,
                            help="With --key: only its messages below this offset (the "
                            "next page back, as a lookup that matched more says).")
        lookup.add_argument("--since", default=None, help="ISO time or a duration ago (2h).")
        lookup.add_argument("--after-id", type=int, default=None,
                            help="With --since T: only the messages after the one of this "
                            "id published at T (the next page of a time range, as a lookup "
                            "that matched more says).")
        lookup.add_argument("--until", default=None, help="ISO time or a duration ago.")
        lookup.add_argument("--limit", type=int, default=100,
                            help=f"At most this many (up to {broker.topic_lookup.LOOKUP_MAX}).")
        lookup.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            getattr(self, f"do_{action}")(options)
        except (ValueError, LookupError) as exc:
            raise CommandError(str(exc)) from None

    def do_groups(self, options: dict[str, Any]) -> None:
        states = broker.groups(options["topic"])
        if options["json"]:
            self.stdout.write(json.dumps([g.as_json() for g in states]))
        elif not states and options["topic"] is not None:
            topic = options["topic"]
            if broker.topic_bounds(topic) is None:
                self.stdout.write(f"No topic {topic!r} is known: no message of it has an "
                                  "offset and no consumer group reads it.")
            else:
                self.stdout.write(f"Topic {topic!r} has no consumer groups yet (a worker "
                                  "creates a group when it first runs its handler).")
        elif not states:
            self.stdout.write("No consumer groups yet (a worker creates its groups).")
        else:
            self.stdout.write(groups_table(states))

    def do_reset(self, options: dict[str, Any]) -> None:
        target = broker.ResetTarget(
            to_offset=options["to_offset"],
            to_time=(ops.parse_since(options["to_time"]) if options["to_time"] is not None
                     else None),
            edge="earliest" if options["earliest"] else "latest" if options["latest"] else None)
        done = topicops.reset(options["topic"], options["group"], target, ops.cli_operator(),
                              names=broker.topic_ops.CLI_NAMES)
        cancelled = topicops.reset_cancelled(
            done, lambda first, last: f"queuetopic replay --topic {done.topic} --group "
            f"{done.group} --from-offset {first} --to-offset {last}",
            lambda first: f"reset with --to-offset {first}")
        self.stdout.write(f"Group {done.group!r} of topic {done.topic!r}: position "
                          f"{done.old_position} -> {done.new_position} (next offset "
                          f"{done.new_position + 1}); {cancelled}")
        summary = topicops.reset_summary(done, target)
        if summary:
            self.stdout.write(summary)

    def do_replay(self, options: dict[str, Any]) -> None:
        done = topicops.replay(options["topic"], options["group"], options["from_offset"],
                               options["to_offset"], ops.cli_operator())
        self.stdout.write(f"Replayed offsets {done.first}..{done.last} of topic "
                          f"{done.topic!r} into group {done.group!r}: {done.replayed} new "
                          "deliveries.")
        shortfall = topicops.replay_shortfall(done)
        if shortfall:
            self.stdout.write(f"WARNING: {shortfall}")

    def do_drop(self, options: dict[str, Any]) -> None:
        done = topicops.drop(options["topic"], options["group"], ops.cli_operator())
        if options["json"]:
            self.stdout.write(json.dumps(done.as_json()))
        else:
            self.stdout.write(topicops.drop_summary(done))

    def do_lookup(self, options: dict[str, Any]) -> None:
        since = ops.parse_since(options["since"]) if options["since"] is not None else None
        until = ops.parse_since(options["until"]) if options["until"] is not None else None
        if since is not None and until is not None and until < since:
            raise CommandError(
                f"--until ({until.isoformat()}) is before --since ({since.isoformat()}): no "
                "message can match. A duration is time ago: --since 2h --until 1h is the "
                "hour that ended an hour ago.")
        if options["offset"] is not None and options["offset"] < 1:
            raise CommandError(f"--offset must be 1 or more (offsets start at 1), not "
                               f"{options['offset']}.")
        if options["before_offset"] is not None and options["before_offset"] < 2:
            raise CommandError(f"--before-offset must be 2 or more (offsets start at 1: "
                               f"none is below {options['before_offset']}).")
        topic = options["topic"]
        found = broker.lookup(topic, offset=options["offset"], key=options["key"],
                              since=since, until=until, before_offset=options["before_offset"],
                              after_id=options["after_id"], limit=options["limit"])
        more, next_page = _more(found, options)
        traces = broker.trace(topic, [m.offset for m in found.messages if m.offset is not None])
        sequenced = {m.offset: m.sequenced_at for m in found.messages if m.offset is not None}
        missing = broker.without_delivery(topic, sequenced, traces)
        if options["json"]:
            reason = None if found.messages else topicops.no_match(topic, options["offset"])
            self.stdout.write(json.dumps({"truncated": found.truncated, "next": next_page,
                                          "reason": reason,
                                          "messages": [
                {"id": m.id, "offset": m.offset, "key": m.key, "payload": m.payload,
                 "published_at": m.published_at.isoformat() if m.published_at else None,
                 "deliveries": [{"group": d.group, "message_id": d.message_id,
                                 "outcome": d.outcome, "worker": d.handled_by,
                                 "handled_at": d.handled_at.isoformat() if d.handled_at
                                 else None, "attempts": len(d.runs),
                                 "operator_actions": [_action_json(a) for a in d.actions],
                                 "replay": d.replay,
                                 "error": d.last_error or None,
                                 "next_try_at": d.next_try_at.isoformat() if d.next_try_at
                                 else None}
                                for d in traces.get(m.offset or 0, [])],
                 "no_delivery": [{"group": n.group, "reason": n.reason}
                                 for n in missing.get(m.offset or 0, [])]}
                for m in found.messages]}))
            return
        if not found.messages:
            self.stdout.write(topicops.no_match(topic, options["offset"]))
        for m in found.messages:
            published = (cli.utc(m.published_at) if m.published_at
                         else "- (a zero date: changed by hand)")
            self.stdout.write(f"{topic}@{m.offset} key={m.key!r} published {published} "
                              f"payload={_cut(m.payload, 200)}")
            for d in traces.get(m.offset or 0, []):
                mark = " (replay)" if d.replay else ""
                when = f" at {cli.utc(d.handled_at)}" if d.handled_at else ""
                then = f", next try at {cli.utc(d.next_try_at)}" if d.next_try_at else ""
                error = f"; last error: {_cut(d.last_error, 300)}" if d.last_error else ""
                self.stdout.write(f"  {d.group}{mark}: #{d.message_id} {d.outcome}{when}"
                                  f" by {d.handled_by or '-'} ({_attempts(d)}){then}{error}")
            for n in missing.get(m.offset or 0, []):
                self.stdout.write(f"  {n.group}: {n.reason}")
        if more:
            self.stdout.write(more)
