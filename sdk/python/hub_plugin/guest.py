"""The wasm side of the SDK: a `Host` over the hub's imports and `export`,
which turns a `Plugin` into the component's `handle`, `validate-config` and
`needs-for`.

`wit_world` exists only while componentize-py builds the component; under
pytest `export` returns the plugin class unchanged.
"""

from __future__ import annotations

import json
import traceback
from typing import Any, Optional

from .sdk import Config, Event, HostError, JSON, Level, Needs, Outcome, Plugin, PluginError, Response, Direction

try:
    import wit_world
    from componentize_py_types import Err
    from wit_world.imports import host as _host
    from wit_world.imports import types as _wit
except ImportError:  # not a component build: unit tests, type checks
    wit_world = None

__all__ = ["export"]


def export(plugin: type[Plugin]) -> Any:
    """What the hub calls: `WitWorld = export(MyPlugin)` at the end of the
    plugin's module, the name componentize-py looks for."""
    if wit_world is None:
        return plugin
    instance = plugin()

    class WitWorld(wit_world.WitWorld):  # type: ignore[misc, name-defined]
        def handle(self, event: Any) -> Any:
            outcome = _guarded(lambda: instance.handle(_event(event), _WitHost()))
            if not isinstance(outcome, Outcome):
                raise Err(f"{type(instance).__name__}.handle returned {outcome!r}, not an Outcome")
            return _outcome(outcome)

        def validate_config(self, config: str) -> None:
            _guarded(lambda: instance.validate_config(_config(config)))

        def needs_for(self, config: str) -> Any:
            needs = _guarded(lambda: instance.needs(_config(config)))
            if not isinstance(needs, Needs):
                raise Err(f"{type(instance).__name__}.needs returned {needs!r}, not Needs")
            return _wit.Needs(needs.kv, list(needs.destinations))

    return WitWorld


def _guarded(call: Any) -> Any:
    """Runs plugin code; what it raises becomes the call's error, pointing at
    the plugin's own line."""
    try:
        return call()
    except PluginError as e:
        raise Err(str(e)) from None
    except Err:
        raise
    except Exception as e:
        raise Err(_describe(e)) from None


def _describe(e: Exception) -> str:
    """`ValueError: bad (at greet.py:12 in handle)`: the innermost frame outside the SDK."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "hub_plugin" not in f.filename]
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name})"
    return f"{type(e).__name__}: {e}{where}"


def _config(text: str) -> Config:
    try:
        value = json.loads(text) if text.strip() else None
    except ValueError as e:
        raise PluginError(f"config is not JSON: {e}") from None
    return Config(value)


def _event(e: Any) -> Event:
    return Event(
        id=e.id,
        kind=e.kind,
        direction=Direction.INBOUND if e.direction == _wit.Direction.INBOUND else Direction.OUTBOUND,
        channel_id=e.channel_id,
        channel=e.channel,
        chat_id=e.chat_id,
        at=e.at,
        payload_text=e.payload,
        context_text=e.context,
    )


def _json(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _outcome(o: Outcome) -> Any:
    if o.action == "continue":
        action = _wit.Action_Continue(None if o.value is None else _json(o.value))
    elif o.action == "drop":
        action = _wit.Action_Drop(str(o.value))
    else:
        action = _wit.Action_Reply(_json(o.value))
    forwards = [_wit.Forward(f.destination, _json(f.payload)) for f in o.forwards]
    return _wit.Outcome(action, forwards)


_LEVELS = {
    Level.TRACE: "TRACE",
    Level.DEBUG: "DEBUG",
    Level.INFO: "INFO",
    Level.WARN: "WARN",
    Level.ERROR: "ERROR",
}


class _WitHost:
    """The `Host` of a running component: each call goes to the hub."""

    def log(self, level: Level, message: str) -> None:
        _host.log(getattr(_wit.Level, _LEVELS[Level(level)]), str(message))

    def config(self) -> dict[str, JSON]:
        raw = _host.config()
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            # The hub writes this JSON itself; a plugin still works with its defaults.
            _host.log(_wit.Level.WARN, "config is not JSON")
            value = {}
        return value if isinstance(value, dict) else {}

    def kv_get(self, key: str) -> Optional[str]:
        try:
            return _host.kv_get(key)
        except Err as e:
            raise HostError(e.value) from None

    def kv_set(self, key: str, value: str) -> None:
        try:
            _host.kv_set(key, value)
        except Err as e:
            raise HostError(e.value) from None

    def kv_delete(self, key: str) -> None:
        try:
            _host.kv_delete(key)
        except Err as e:
            raise HostError(e.value) from None

    def send(self, destination: str, payload: JSON) -> Response:
        try:
            r = _host.send(destination, _json(payload))
        except Err as e:
            raise HostError(e.value) from None
        return Response(r.status, r.body)
