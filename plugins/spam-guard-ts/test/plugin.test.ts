// Unit tests of the spam guard's rules against the SDK's fake host.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Config, Outcome, needs, type Json } from "@hub/plugin";
import { FakeHost, customerText, event } from "@hub/plugin/testing";

import guard from "../src/plugin.js";

test("other kinds pass", () => {
  const host = new FakeHost({ patterns: ["buy"], max_messages: 1 });
  const e = event("channel.agent_message", {
    sender: { name: "A" }, recipient: { id: 1 }, message: { type: "text", text: "buy" },
  });
  assert.ok(guard.handle(e, host).isPass);
  assert.equal(host.kv.size, 0);
});

test("patterns match case-insensitively", () => {
  const host = new FakeHost({ patterns: ["Cheap PILLS", "casino"] });
  assert.deepEqual(guard.handle(customerText("1", "get cheap pills now"), host), Outcome.drop('spam pattern "Cheap PILLS"'));
  assert.ok(guard.handle(customerText("1", "hello there"), host).isPass);
});

test("the rate limit uses a fixed window per client", () => {
  const host = new FakeHost({ max_messages: 2, window_secs: 10 });
  const run = (sender: string, at: number) => guard.handle(customerText(sender, "hi", at), host);
  assert.ok(run("7", 0).isPass);
  assert.ok(run("7", 5_000).isPass);
  assert.deepEqual(run("7", 9_999), Outcome.drop("rate limit: more than 2 messages in 10 s"));
  assert.ok(run("8", 9_999).isPass);
  assert.ok(run("7", 10_000).isPass);
  assert.equal(host.kv.get("rate:1:7"), '{"start":10000,"count":1}');
});

test("numeric and text ids share a window", () => {
  const host = new FakeHost({ max_messages: 1 });
  assert.ok(guard.handle(customerText(42, "hi"), host).isPass);
  assert.equal(guard.handle(customerText("42", "hi"), host).action.type, "drop");
});

test("needs follow the config", () => {
  const of = (c: { [key: string]: Json }) => guard.needs?.(new Config(c));
  assert.deepEqual(of({}), needs({ kv: true }));
  assert.deepEqual(of({ patterns: ["spam"], max_messages: 0 }), needs());
  assert.deepEqual(of({ max_messages: 0, forward_to: "audit" }), needs({ destinations: ["audit"] }));
});

test("a failing kv means no rate limit", () => {
  const host = new FakeHost({ max_messages: 1 }).withoutKv();
  for (let i = 0; i < 3; i++) assert.ok(guard.handle(customerText("7", "hi"), host).isPass);
  assert.equal(host.logs.length, 3);
  assert.equal(host.logs[0]?.[0], "warn");
});

test("drops are forwarded when asked", () => {
  const host = new FakeHost({ patterns: ["spam"], forward_to: "audit" });
  const out = guard.handle(customerText("7", "SPAM!"), host);
  assert.deepEqual(out.forwards, [{
    destination: "audit",
    payload: { event_id: "test-event", kind: "channel.customer_message", channel: "test", chat_id: 1,
      reason: 'spam pattern "spam"', sender_id: "7" },
  }]);
  assert.deepEqual(guard.handle(customerText("7", "fine"), host).forwards, []);
});

test("a bad config is an error", () => {
  const configs: { [key: string]: Json }[] = [{ patterns: 5 }, { max_messages: -1 }, { window_secs: 0 }, { forward_to: 1 }];
  for (const config of configs) {
    assert.throws(() => guard.handle(customerText("7", "hi"), new FakeHost(config)), /^ConfigError: config: /);
  }
});
