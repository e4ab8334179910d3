"""Spam guard in Python: the same rules as the Rust `spam-guard`, event for
event (the suite runs one table of events against both builds).

Drops `channel.customer_message` events whose text contains a configured
pattern, or whose client sends too many messages too fast. Config (all
optional): `patterns`, `max_messages` (default 20) per `window_secs` (default
60) and client, kept in KV under `rate:<channel_id or 0>:<sender.id>` (so the
limit needs `kv = true`; 0 turns it off), `forward_to`: a destination told
about every dropped message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from hub_plugin import Config, ConfigError, Event, Host, HostError, Level, Needs, Outcome, Plugin, export


@dataclass(frozen=True)
class Settings:
    patterns: list[str]
    limit: int
    window_secs: int
    forward_to: Optional[str]

    @staticmethod
    def read(config: Config) -> Settings:
        window_secs = config.uint_or("window_secs", 60)
        if window_secs == 0:
            raise ConfigError("config: window_secs must be at least 1")
        return Settings(
            patterns=config.strings("patterns") or [],
            limit=config.uint_or("max_messages", 20),
            window_secs=window_secs,
            forward_to=config.string("forward_to"),
        )


class SpamGuard(Plugin):
    def validate_config(self, config: Config) -> None:
        Settings.read(config)

    def needs(self, config: Config) -> Needs:
        settings = Settings.read(config)
        return Needs().with_kv(settings.limit > 0).with_destination(settings.forward_to)

    def handle(self, event: Event, host: Host) -> Outcome:
        if event.kind != "channel.customer_message":
            return Outcome.pass_()
        s = Settings.read(Config(host.config()))
        pattern = spam_pattern(event.message_text, s.patterns)
        if pattern is not None:
            reason = f'spam pattern "{pattern}"'
        elif s.limit > 0 and over_limit(event, host, s.limit, s.window_secs):
            reason = f"rate limit: more than {s.limit} messages in {s.window_secs} s"
        else:
            return Outcome.pass_()
        outcome = Outcome.drop(reason)
        if s.forward_to is None:
            return outcome
        sender = event.payload.get("sender") or {}
        return outcome.forward(
            s.forward_to,
            {
                "event_id": event.id,
                "kind": event.kind,
                "channel": event.channel,
                "chat_id": event.chat_id,
                "reason": reason,
                "sender_id": sender.get("id"),
            },
        )


def spam_pattern(text: Optional[str], patterns: list[str]) -> Optional[str]:
    """The first pattern found in the text, compared in lowercase."""
    if text is None:
        return None
    text = text.lower()
    return next((p for p in patterns if p and p.lower() in text), None)


def over_limit(event: Event, host: Host, limit: int, window_secs: int) -> bool:
    """Counts the message in its client's fixed window; true when that exceeds
    the limit. A KV the plugin cannot use turns the limit off."""
    sender = event.sender_key
    if sender is None:
        return False
    key = f"rate:{event.channel_id or 0}:{sender}"
    try:
        window = count(parse_window(host.kv_get(key)), event.at, window_secs * 1000)
        host.kv_set(key, json.dumps({"start": window[0], "count": window[1]}, separators=(",", ":")))
    except HostError as e:
        host.log(Level.WARN, f"rate limit skipped: kv: {e}")
        return False
    return window[1] > limit


def parse_window(stored: Optional[str]) -> Optional[tuple[int, int]]:
    """The stored `{"start": ms, "count": n}`; a missing or unreadable one starts afresh."""
    try:
        value = json.loads(stored) if stored is not None else None
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    start, n = value.get("start"), value.get("count")
    if type(start) is not int or type(n) is not int or n < 0:
        return None
    return start, n


def count(stored: Optional[tuple[int, int]], at: int, window_ms: int) -> tuple[int, int]:
    """Adds one message at `at`; a window that has run out (or lies in the
    future, after a clock step back) is replaced by one starting now."""
    if stored is not None and stored[0] <= at and at - stored[0] < window_ms:
        return stored[0], stored[1] + 1
    return at, 1


WitWorld = export(SpamGuard)
