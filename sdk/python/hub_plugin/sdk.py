"""The plugin author's view of the hub: events, outcomes and the host's
capabilities as plain Python, free of any wasm binding so it tests with pytest.

The same shape as the Rust SDK (`plugin_api::sdk`), in Python's names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Optional, Protocol, TypeVar, cast

__all__ = [
    "Config",
    "ConfigError",
    "Direction",
    "Event",
    "Forward",
    "Host",
    "HostError",
    "Level",
    "Needs",
    "Outcome",
    "Plugin",
    "PluginError",
    "Response",
    "bot_buttons",
    "bot_invite_agent",
    "bot_markdown",
    "bot_text",
    "channel_reply_text",
    "glob_matches",
]

JSON = Any
"""A value as `json.loads` returns it."""

T = TypeVar("T")

# A bot's `BUTTONS` message carries at most this many buttons (plugin_api::bot::MAX_BUTTONS).
MAX_BUTTONS = 3


class PluginError(Exception):
    """Raise it to fail the call with exactly this message; the route's
    `on_error` decides what happens to the event. Any other exception fails
    the call too, with its type, message and the line that raised it."""


class ConfigError(PluginError, ValueError):
    """A config table the plugin cannot work with; the message names the key."""


class HostError(Exception):
    """A host call the hub refused (KV not granted, a quota, a destination
    not granted or unreachable)."""


class Direction(str, Enum):
    """Which way an event crosses the hub's boundary."""

    INBOUND = "inbound"
    """Received by the hub (a customer message, a delivery result)."""
    OUTBOUND = "outbound"
    """About to be sent by the hub (an agent message, a webhook)."""


class Level(str, Enum):
    """Severity of a log line."""

    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"


class Event:
    """One event on its way through a route's plugin chain.

    The payload and the context arrive as JSON text and are parsed the first
    time `payload` or `context` is read: a plugin that decides on the kind or
    the channel alone pays nothing for them.
    """

    __slots__ = ("id", "kind", "direction", "channel_id", "channel", "chat_id", "at",
                 "_payload_text", "_payload", "_context_text", "_context")

    def __init__(
        self,
        *,
        id: str,
        kind: str,
        direction: Direction,
        channel_id: Optional[int],
        channel: Optional[str],
        chat_id: Optional[int],
        at: int,
        payload: JSON = None,
        context: Optional[dict[str, JSON]] = None,
        payload_text: Optional[str] = None,
        context_text: Optional[str] = None,
    ) -> None:
        self.id = id
        """UUID, stable for the event's whole life."""
        self.kind = kind
        """Dotted kind, for example `channel.customer_message`."""
        self.direction = direction
        self.channel_id = channel_id
        self.channel = channel
        self.chat_id = chat_id
        self.at = at
        """When the event was made, Unix milliseconds."""
        self._payload_text = payload_text
        self._payload = payload
        self._context_text = context_text
        self._context = context

    @property
    def payload(self) -> JSON:
        """The payload, as the event kind's wire format has it (see `hub_plugin.payloads`)."""
        if self._payload_text is not None:
            self._payload = _parse(self._payload_text, None)
            self._payload_text = None
        return self._payload

    @payload.setter
    def payload(self, value: JSON) -> None:
        self._payload_text = None
        self._payload = value

    @property
    def context(self) -> dict[str, JSON]:
        """What the hub knows around the event, e.g. `{"agents_online": 2}`; `{}` when nothing."""
        if self._context_text is not None:
            self._context = _parse(self._context_text, {})
            self._context_text = None
        if self._context is None:
            self._context = {}
        return self._context

    def payload_as(self, kind: type[T]) -> T:
        """The payload typed for a checker (`event.payload_as(CustomerMessage)`);
        the hub has checked it against the kind's wire rules already."""
        payload = self.payload
        if not isinstance(payload, dict):
            raise PluginError(f"payload of {self.kind} is not a JSON object")
        return cast(T, payload)

    def kind_matches(self, pattern: str) -> bool:
        """Whether the kind matches a glob such as `channel.*`."""
        return glob_matches(pattern, self.kind)

    @property
    def agents_online(self) -> Optional[int]:
        """The number of the channel's agents online, when the hub said so."""
        n = self.context.get("agents_online")
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None

    @property
    def message_text(self) -> Optional[str]:
        """`message.text` of the payload, the field most filters look at."""
        message = self.payload.get("message") if isinstance(self.payload, dict) else None
        text = message.get("text") if isinstance(message, dict) else None
        return text if isinstance(text, str) else None

    @property
    def sender_key(self) -> Optional[str]:
        """`sender.id` of the payload as text: `7` and `"7"` name the same client."""
        sender = self.payload.get("sender") if isinstance(self.payload, dict) else None
        sid = sender.get("id") if isinstance(sender, dict) else None
        if isinstance(sid, str) and sid.strip():
            return sid
        if isinstance(sid, (int, float)) and not isinstance(sid, bool):
            return json.dumps(sid)
        return None

    def __repr__(self) -> str:
        return f"Event(id={self.id!r}, kind={self.kind!r}, payload={self.payload!r})"


def _parse(text: str, empty: JSON) -> JSON:
    # The hub writes this text with a JSON serializer; text that is not JSON
    # would be a hub bug, and reads as the empty value.
    if not text.strip():
        return empty
    try:
        return json.loads(text)
    except ValueError:
        return empty


def glob_matches(pattern: str, text: str) -> bool:
    """Glob match where `*` stands for any run of characters (also none) and
    every other character stands for itself."""
    pi = ti = 0
    star: Optional[tuple[int, int]] = None
    while ti < len(text):
        if pi < len(pattern) and pattern[pi] == "*":
            star = (pi, ti)
            pi += 1
        elif pi < len(pattern) and pattern[pi] == text[ti]:
            pi += 1
            ti += 1
        elif star is not None:
            pi, ti = star[0] + 1, star[1] + 1
            star = (star[0], star[1] + 1)
        else:
            return False
    return all(c == "*" for c in pattern[pi:])


@dataclass(frozen=True)
class Forward:
    """A payload for a destination named in `hub.toml`, delivered durably."""

    destination: str
    payload: JSON


@dataclass(frozen=True)
class Outcome:
    """The result of handling one event: an action plus any forwards.

    Build one with `Outcome.pass_()`, `replace`, `drop`, `reply` or
    `bot_answers`, then chain `.forward(...)`.
    """

    action: Literal["continue", "drop", "reply"]
    value: JSON = None
    """The new payload (continue; `None`: unchanged), the reason (drop) or the answer (reply)."""
    forwards: tuple[Forward, ...] = field(default=())

    @staticmethod
    def pass_() -> Outcome:
        """Continue with the event unchanged (`pass` is a keyword, hence the `_`)."""
        return Outcome("continue")

    @staticmethod
    def replace(payload: JSON) -> Outcome:
        """Continue with a changed payload (checked by the hub against the kind's type)."""
        return Outcome("continue", payload)

    @staticmethod
    def drop(reason: str) -> Outcome:
        """Stop the event; the reason is logged and counted by the hub."""
        return Outcome("drop", str(reason))

    @staticmethod
    def reply(payload: JSON) -> Outcome:
        """Answer on the hub's behalf, e.g. `channel_reply_text(...)` for a customer message."""
        return Outcome("reply", payload)

    @staticmethod
    def bot_answers(answers: list[JSON]) -> Outcome:
        """A bot's answer to `bot.client_message`: `bot_text`, `bot_markdown`,
        `bot_buttons` and `bot_invite_agent` values, applied in order. One is
        replied as itself, several as an array (the hub takes at most 5), none
        means the bot stays silent."""
        if not answers:
            return Outcome.pass_()
        if len(answers) == 1:
            return Outcome.reply(answers[0])
        return Outcome.reply(list(answers))

    def forward(self, destination: str, payload: JSON) -> Outcome:
        """Also sends `payload` to `destination` through the hub's outbox."""
        return Outcome(self.action, self.value, (*self.forwards, Forward(destination, payload)))

    @property
    def is_pass(self) -> bool:
        """Whether the event goes on unchanged."""
        return self.action == "continue" and self.value is None


@dataclass(frozen=True)
class Response:
    """A destination's answer to `Host.send`."""

    status: int
    body: str

    @property
    def ok(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status < 300

    def json(self) -> JSON:
        return json.loads(self.body)


@dataclass(frozen=True)
class Needs:
    """What a plugin needs granted in `hub.toml`: `Needs(kv=True, destinations=["crm"])`."""

    kv: bool = False
    """A key-value namespace of its own (`kv = true`)."""
    destinations: tuple[str, ...] = ()
    """Destinations it sends or forwards to (`destinations = [...]`)."""

    def with_kv(self, needed: bool = True) -> Needs:
        return Needs(self.kv or needed, self.destinations)

    def with_destination(self, name: Optional[str]) -> Needs:
        """Also the destination `name` (once; `None` adds nothing)."""
        if name is None or name in self.destinations:
            return self
        return Needs(self.kv, (*self.destinations, name))


class Host(Protocol):
    """The capabilities the hub grants a plugin; nothing else reaches the outside.
    Failed calls raise `HostError`."""

    def log(self, level: Level, message: str) -> None:
        """Writes a line to the hub's log, tagged with the plugin and the event."""
        ...

    def config(self) -> dict[str, JSON]:
        """The plugin's `config` table from `hub.toml` (`{}` when absent)."""
        ...

    def kv_get(self, key: str) -> Optional[str]:
        """Reads from the plugin's own key-value namespace."""
        ...

    def kv_set(self, key: str, value: str) -> None: ...

    def kv_delete(self, key: str) -> None: ...

    def send(self, destination: str, payload: JSON) -> Response:
        """POSTs JSON to a granted destination and waits for the answer."""
        ...


class Config:
    """Typed reads of a plugin's config table, so every plugin reports a wrong
    setting the same way: `config: <key> must be …` (raised as `ConfigError`).
    `None` values count as absent."""

    def __init__(self, value: JSON) -> None:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"config must be an object, not {json.dumps(value)}")
        self._map: dict[str, JSON] = value

    def get(self, key: str) -> JSON:
        return self._map.get(key)

    def bool_or(self, key: str, default: bool) -> bool:
        v = self.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise _must(key, "be a boolean")
        return v

    def uint_or(self, key: str, default: int) -> int:
        """A non-negative integer (`u64` in the Rust SDK)."""
        v = self.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _must(key, "be a non-negative integer")
        return v

    def string(self, key: str) -> Optional[str]:
        v = self.get(key)
        if v is not None and not isinstance(v, str):
            raise _must(key, "be a string")
        return v

    def string_or(self, key: str, default: str) -> str:
        v = self.string(key)
        return default if v is None else v

    def required_string(self, key: str) -> str:
        """A string that must be present and not blank."""
        v = self.string(key)
        if v is None or not v.strip():
            raise ConfigError(f"config: {key} is required")
        return v

    def strings(self, key: str) -> Optional[list[str]]:
        """An array of strings; a single string counts as an array of one."""
        v = self.get(key)
        if v is None:
            return None
        if isinstance(v, str):
            return [v]
        if isinstance(v, list) and all(isinstance(i, str) for i in v):
            return list(v)
        raise _must(key, "be a string or an array of strings")


def _must(key: str, what: str) -> ConfigError:
    return ConfigError(f"config: {key} must {what}")


class Plugin:
    """A plugin: one call per event, each in a fresh instance, so nothing is
    kept between calls except through the KV store. Subclass it and override
    `handle`; `validate_config` and `needs` are optional."""

    def handle(self, event: Event, host: Host) -> Outcome:
        """Handles one event; raising fails this call only, and the route's
        `on_error` decides what happens to the event."""
        raise NotImplementedError

    def validate_config(self, config: Config) -> None:
        """Checks the config table when the hub loads the plugin, before any
        event: raise `ConfigError` naming the key (the `Config` readers do).
        The default accepts any table."""

    def needs(self, config: Config) -> Needs:
        """What the plugin needs granted in its `[[plugins]]` entry to work with
        this config; the hub refuses an entry that does not grant it. The
        default needs nothing."""
        return Needs()


def channel_reply_text(text: str, sender_name: Optional[str] = None) -> dict[str, JSON]:
    """A text reply to `channel.customer_message`, sent to the customer as an
    automatic message: `{"sender":{"name"},"message":{"type":"text","text"}}`."""
    reply: dict[str, JSON] = {}
    if sender_name is not None:
        reply["sender"] = {"name": sender_name}
    reply["message"] = {"type": "text", "text": text}
    return reply


# Bot answers. The guest has no clock worth trusting, so the timestamps come
# from the event: pass `event.at` as `at_ms`.


def _bot_message(message: dict[str, JSON]) -> dict[str, JSON]:
    return {"event": "BOT_MESSAGE", "message": message}


def bot_text(text: str, at_ms: int) -> dict[str, JSON]:
    """A plain text answer: `{"event":"BOT_MESSAGE","message":{"type":"TEXT",…}}`."""
    return _bot_message({"type": "TEXT", "text": text, "timestamp": at_ms // 1000})


def bot_markdown(content: str, text: str, at_ms: int) -> dict[str, JSON]:
    """A Markdown answer; `text` is what channels without Markdown show instead."""
    return _bot_message(
        {"type": "MARKDOWN", "content": content, "text": text, "timestamp": at_ms // 1000}
    )


def bot_buttons(title: str, text: str, buttons: list[str], at_ms: int) -> dict[str, JSON]:
    """An answer offering prepared replies as buttons with ids "1", "2", "3";
    buttons past the third are left out."""
    return _bot_message(
        {
            "type": "BUTTONS",
            "title": title,
            "text": text,
            "buttons": [{"text": b, "id": str(n)} for n, b in enumerate(buttons[:MAX_BUTTONS], 1)],
            "timestamp": at_ms // 1000,
        }
    )


def bot_invite_agent() -> dict[str, JSON]:
    """Hands the chat to a human agent: `{"event":"INVITE_AGENT"}`."""
    return {"event": "INVITE_AGENT"}
