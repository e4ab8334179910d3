"""A stand-in for the hub, so a plugin's rules are unit-tested with pytest
and no wasm runtime: in-memory KV, scripted sends, captured logs."""

from __future__ import annotations

import copy
from typing import Optional, Union

from .sdk import JSON, Direction, Event, HostError, Level, Response

__all__ = ["FakeHost", "customer_text", "event"]


class FakeHost:
    """A `Host` that records what a plugin does.

    Sends to a destination without a script fail like a not-granted
    destination on the hub. Scripts for a destination are used in order; the
    last one repeats.
    """

    def __init__(self, config: Optional[dict[str, JSON]] = None) -> None:
        self._config: dict[str, JSON] = config if config is not None else {}
        self.kv: dict[str, str] = {}
        """The KV store as it is now."""
        self.logs: list[tuple[Level, str]] = []
        """Every line logged so far."""
        self.sent: list[tuple[str, JSON]] = []
        """Every `send` so far (answered or not), as (destination, payload)."""
        self._kv_error: Optional[str] = None
        self._scripts: dict[str, list[Union[Response, str]]] = {}

    def respond(self, destination: str, status: int, body: str = "{}") -> FakeHost:
        """Scripts an answer of `destination` (which also grants it)."""
        self._scripts.setdefault(destination, []).append(Response(status, body))
        return self

    def fail_send(self, destination: str, error: str) -> FakeHost:
        """Scripts a failed call to `destination`, e.g. a connection error."""
        self._scripts.setdefault(destination, []).append(error)
        return self

    def without_kv(self) -> FakeHost:
        """Makes every KV call fail, as when the plugin is not granted `kv`."""
        self._kv_error = "kv is not granted to this plugin"
        return self

    def with_kv(self, key: str, value: str) -> FakeHost:
        """Pre-fills one KV entry."""
        self.kv[key] = value
        return self

    def set_config(self, config: dict[str, JSON]) -> None:
        """Replaces the plugin config between calls."""
        self._config = config

    # The Host protocol.

    def log(self, level: Level, message: str) -> None:
        self.logs.append((Level(level), message))

    def config(self) -> dict[str, JSON]:
        return copy.deepcopy(self._config)

    def kv_get(self, key: str) -> Optional[str]:
        self._kv_check()
        return self.kv.get(key)

    def kv_set(self, key: str, value: str) -> None:
        self._kv_check()
        if not isinstance(value, str):
            raise TypeError(f"kv values are strings, not {type(value).__name__}")
        self.kv[key] = value

    def kv_delete(self, key: str) -> None:
        self._kv_check()
        self.kv.pop(key, None)

    def send(self, destination: str, payload: JSON) -> Response:
        self.sent.append((destination, copy.deepcopy(payload)))
        queue = self._scripts.get(destination)
        if queue is None:
            raise HostError(f"destination `{destination}` is not granted to this plugin")
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, str):
            raise HostError(answer)
        return answer

    def _kv_check(self) -> None:
        if self._kv_error is not None:
            raise HostError(self._kv_error)


def event(kind: str, payload: JSON, *, at: int = 1_700_000_000_000) -> Event:
    """An event as the hub would hand it over: id `test-event`, channel 1
    `test`, chat 1, context `{"agents_online": 1}`, and outbound for
    `channel.agent_*` kinds, inbound otherwise."""
    return Event(
        id="test-event",
        kind=kind,
        direction=Direction.OUTBOUND if kind.startswith("channel.agent_") else Direction.INBOUND,
        channel_id=1,
        channel="test",
        chat_id=1,
        at=at,
        payload=payload,
        context={"agents_online": 1},
    )


def customer_text(sender_id: Union[str, int], text: str, *, at: int = 1_700_000_000_000) -> Event:
    """A `channel.customer_message` with a text from customer `sender_id`."""
    return event(
        "channel.customer_message",
        {"sender": {"id": sender_id, "name": "Customer"}, "message": {"type": "text", "text": text}},
        at=at,
    )
