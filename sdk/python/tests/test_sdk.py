"""The Python SDK's own rules, as the Rust SDK's tests state them."""

import pytest

from hub_plugin import (
    Config,
    ConfigError,
    Direction,
    Event,
    HostError,
    Level,
    Needs,
    Outcome,
    Response,
    bot_buttons,
    bot_invite_agent,
    bot_markdown,
    bot_text,
    channel_reply_text,
    export,
    glob_matches,
)
from hub_plugin.payloads import KIND_TYPES, CustomerMessage
from hub_plugin.testing import FakeHost, customer_text, event


def test_payload_and_context_given_as_text_read_like_values():
    e = Event(id="e1", kind="channel.customer_message", direction=Direction.INBOUND, channel_id=None,
              channel=None, chat_id=None, at=0,
              payload_text='{"sender":{"id":7},"message":{"type":"text","text":"hi"}}', context_text="")
    assert e.message_text == "hi"
    assert e.sender_key == "7"
    assert e.context == {}
    assert e.agents_online is None
    e.payload["message"]["text"] = "changed"
    assert e.message_text == "changed"
    garbled = Event(id="e", kind="k", direction=Direction.INBOUND, channel_id=None, channel=None,
                    chat_id=None, at=0, payload_text="{not json", context_text="[1]")
    assert garbled.payload is None and garbled.message_text is None


def test_globs():
    for p, t in [("channel.*", "channel.customer_message"), ("*", ""), ("*", "anything"),
                 ("channel.*_typing", "channel.agent_typing"), ("*.*", "a.b"), ("a*b*c", "aXbYbZc"),
                 ("exact", "exact"), ("**", "x")]:
        assert glob_matches(p, t), (p, t)
    for p, t in [("channel.*", "crm.contact"), ("channel.*", "channel"), ("exact", "exactly"),
                 ("*_typing", "channel.customer_message"), ("a*b*c", "aXbYbZ"), ("", "x")]:
        assert not glob_matches(p, t), (p, t)


def test_event_helpers():
    e = customer_text(7, "hi")
    assert e.kind_matches("channel.*")
    assert e.agents_online == 1
    assert e.sender_key == "7"
    assert event("channel.agent_message", {}).direction == Direction.OUTBOUND
    typed: CustomerMessage = e.payload_as(CustomerMessage)
    assert typed["sender"]["id"] == 7


def test_outcomes():
    assert Outcome.pass_().is_pass
    assert not Outcome.replace({"a": 1}).is_pass
    assert Outcome.drop("spam") == Outcome("drop", "spam")
    both = Outcome.drop("x").forward("crm", {"a": 1}).forward("audit", {})
    assert [f.destination for f in both.forwards] == ["crm", "audit"]
    assert Outcome.bot_answers([]).is_pass
    assert Outcome.bot_answers([bot_invite_agent()]) == Outcome.reply({"event": "INVITE_AGENT"})
    assert Outcome.bot_answers([1, 2]).value == [1, 2]


def test_replies_and_bot_answers_have_the_wire_shape():
    assert channel_reply_text("hi") == {"message": {"type": "text", "text": "hi"}}
    assert channel_reply_text("hi", "Bot")["sender"] == {"name": "Bot"}
    assert bot_text("a", 1_700_000_000_999) == {
        "event": "BOT_MESSAGE", "message": {"type": "TEXT", "text": "a", "timestamp": 1_700_000_000}}
    assert bot_markdown("**a**", "a", 5000)["message"] == {
        "type": "MARKDOWN", "content": "**a**", "text": "a", "timestamp": 5}
    buttons = bot_buttons("T", "t", ["1", "2", "3", "4"], 0)["message"]["buttons"]
    assert buttons == [{"text": "1", "id": "1"}, {"text": "2", "id": "2"}, {"text": "3", "id": "3"}]


def test_config_reads_with_defaults_and_errors():
    c = Config({"on": False, "n": 5, "name": "crm", "list": ["a", "b"], "one": "x", "blank": " ",
                "gone": None, "neg": -1, "mixed": ["a", 1]})
    assert c.bool_or("on", True) is False
    assert c.bool_or("missing", True) and c.bool_or("gone", True)
    with pytest.raises(ConfigError, match="^config: n must be a boolean$"):
        c.bool_or("n", True)
    assert c.uint_or("n", 1) == 5
    with pytest.raises(ConfigError):
        c.uint_or("neg", 1)
    assert c.string_or("name", "x") == "crm" and c.string_or("missing", "x") == "x"
    with pytest.raises(ConfigError, match="^config: blank is required$"):
        c.required_string("blank")
    assert c.strings("list") == ["a", "b"] and c.strings("one") == ["x"] and c.strings("missing") is None
    with pytest.raises(ConfigError):
        c.strings("mixed")
    with pytest.raises(ConfigError):
        Config([1])
    assert Config(None).get("x") is None


def test_needs():
    assert Needs().with_kv().with_destination("crm").with_destination("crm").with_destination(None) == Needs(
        kv=True, destinations=("crm",))
    assert Needs().with_kv(False) == Needs()


def test_fake_host_kv_sends_logs_and_config():
    host = FakeHost({"k": "v"}).with_kv("a", "1")
    assert host.kv_get("a") == "1"
    host.kv_set("b", "2")
    host.kv_delete("a")
    assert host.kv == {"b": "2"}
    with pytest.raises(HostError):
        FakeHost().without_kv().kv_get("a")
    host.respond("crm", 500, "oops").respond("crm", 200, "ok").fail_send("down", "connection refused")
    assert host.send("crm", {"x": 1}).status == 500
    assert host.send("crm", {}) == Response(200, "ok")
    assert host.send("crm", {}).ok
    with pytest.raises(HostError, match="connection refused"):
        host.send("down", {})
    with pytest.raises(HostError, match="not granted"):
        host.send("elsewhere", {})
    assert len(host.sent) == 5 and host.sent[0] == ("crm", {"x": 1})
    host.log(Level.WARN, "careful")
    assert host.logs == [(Level.WARN, "careful")]
    host.config()["k"] = "changed"
    assert host.config() == {"k": "v"}


def test_export_outside_a_component_build_is_the_class():
    class P:
        pass

    assert export(P) is P


def test_kind_types_cover_the_kinds_with_a_type():
    assert set(KIND_TYPES) == {"channel.customer_message", "channel.customer_typing", "channel.agent_message",
                               "channel.agent_typing", "widget.offline_message", "webhook.*", "crm.*", "bot.*"}
