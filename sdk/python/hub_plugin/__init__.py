"""Hub plugins in Python: the SDK over the hub's WIT world `hub:plugin`.

    from hub_plugin import Event, Host, Outcome, Plugin, export

    class Greet(Plugin):
        def handle(self, event: Event, host: Host) -> Outcome:
            return Outcome.pass_()

    WitWorld = export(Greet)

Unit tests use `hub_plugin.testing.FakeHost`; payload types for every event
kind are in `hub_plugin.payloads`.
"""

from .guest import export
from .sdk import (
    Config,
    ConfigError,
    Direction,
    Event,
    Forward,
    Host,
    HostError,
    Level,
    Needs,
    Outcome,
    Plugin,
    PluginError,
    Response,
    bot_buttons,
    bot_invite_agent,
    bot_markdown,
    bot_text,
    channel_reply_text,
    glob_matches,
)

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
    "export",
    "glob_matches",
]
