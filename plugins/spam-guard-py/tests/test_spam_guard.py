"""Unit tests of the spam guard's rules against the SDK's fake host."""

import pytest

from hub_plugin import Config, Level, Needs, Outcome
from hub_plugin.testing import FakeHost, customer_text, event
from spam_guard import SpamGuard

guard = SpamGuard()


def test_other_kinds_pass():
    host = FakeHost({"patterns": ["buy"], "max_messages": 1})
    e = event("channel.agent_message", {"sender": {"name": "A"}, "recipient": {"id": 1},
                                        "message": {"type": "text", "text": "buy"}})
    assert guard.handle(e, host).is_pass
    assert host.kv == {}


def test_patterns_match_case_insensitively():
    host = FakeHost({"patterns": ["Cheap PILLS", "casino"]})
    assert guard.handle(customer_text("1", "get cheap pills now"), host) == Outcome.drop('spam pattern "Cheap PILLS"')
    assert guard.handle(customer_text("1", "hello there"), host).is_pass


def test_rate_limit_uses_a_fixed_window_per_client():
    host = FakeHost({"max_messages": 2, "window_secs": 10})

    def run(sender, at):
        return guard.handle(customer_text(sender, "hi", at=at), host)

    assert run("7", 0).is_pass
    assert run("7", 5_000).is_pass
    assert run("7", 9_999) == Outcome.drop("rate limit: more than 2 messages in 10 s")
    assert run("8", 9_999).is_pass
    assert run("7", 10_000).is_pass
    assert host.kv["rate:1:7"] == '{"start":10000,"count":1}'


def test_numeric_and_text_ids_share_a_window():
    host = FakeHost({"max_messages": 1})
    assert guard.handle(customer_text(42, "hi"), host).is_pass
    assert guard.handle(customer_text("42", "hi"), host).action == "drop"


def test_needs():
    def needs(config):
        return guard.needs(Config(config))

    assert needs({}) == Needs(kv=True)
    assert needs({"patterns": ["spam"], "max_messages": 0}) == Needs()
    assert needs({"max_messages": 0, "forward_to": "audit"}) == Needs(destinations=("audit",))


def test_a_failing_kv_means_no_rate_limit():
    host = FakeHost({"max_messages": 1}).without_kv()
    for _ in range(3):
        assert guard.handle(customer_text("7", "hi"), host).is_pass
    assert len(host.logs) == 3 and host.logs[0][0] == Level.WARN


def test_drops_are_forwarded_when_asked():
    host = FakeHost({"patterns": ["spam"], "forward_to": "audit"})
    out = guard.handle(customer_text("7", "SPAM!"), host)
    assert [f.destination for f in out.forwards] == ["audit"]
    assert out.forwards[0].payload == {"event_id": "test-event", "kind": "channel.customer_message",
                                       "channel": "test", "chat_id": 1,
                                       "reason": 'spam pattern "spam"', "sender_id": "7"}
    assert guard.handle(customer_text("7", "fine"), host).forwards == ()


@pytest.mark.parametrize("config", [{"patterns": 5}, {"max_messages": -1}, {"window_secs": 0}, {"forward_to": 1}])
def test_bad_config_is_an_error(config):
    with pytest.raises(ValueError, match="^config: "):
        guard.handle(customer_text("7", "hi"), FakeHost(config))
