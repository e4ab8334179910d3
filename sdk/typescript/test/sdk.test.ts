// The TypeScript SDK's own rules, as the Rust SDK's tests state them.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Config, ConfigError, Event, HostError, Outcome, botButtons, botInviteAgent, botMarkdown, botText,
  channelReplyText, globMatches, needs, type CustomerMessage, type Json, type PayloadOf,
} from "../src/index.js";
import { FakeHost, customerText, event } from "../src/testing.js";

test("payload and context given as text read like values", () => {
  const e = new Event({
    id: "e1", kind: "channel.customer_message", direction: "inbound", at: 0,
    payloadText: '{"sender":{"id":7},"message":{"type":"text","text":"hi"}}', contextText: "",
  });
  assert.equal(e.messageText, "hi");
  assert.equal(e.senderKey, "7");
  assert.deepEqual(e.context, {});
  assert.equal(e.agentsOnline, undefined);
  const garbled = new Event({ id: "e", kind: "k", direction: "inbound", at: 0, payloadText: "{not json", contextText: "[1]" });
  assert.equal(garbled.payload, null);
  assert.deepEqual(garbled.context, {});
});

test("globs", () => {
  for (const [p, t] of [["channel.*", "channel.customer_message"], ["*", ""], ["*", "anything"],
    ["channel.*_typing", "channel.agent_typing"], ["*.*", "a.b"], ["a*b*c", "aXbYbZc"], ["exact", "exact"], ["**", "x"]] as const) {
    assert.ok(globMatches(p, t), `${p} ${t}`);
  }
  for (const [p, t] of [["channel.*", "crm.contact"], ["channel.*", "channel"], ["exact", "exactly"],
    ["*_typing", "channel.customer_message"], ["a*b*c", "aXbYbZ"], ["", "x"]] as const) {
    assert.ok(!globMatches(p, t), `${p} ${t}`);
  }
});

test("event helpers and typed payloads", () => {
  const e = customerText(7, "hi");
  assert.ok(e.kindMatches("channel.*"));
  assert.equal(e.agentsOnline, 1);
  assert.equal(e.senderKey, "7");
  assert.equal(event("channel.agent_message", {}).direction, "outbound");
  const typed = e.payloadAs<PayloadOf<"channel.customer_message">>();
  const same: CustomerMessage = typed;
  assert.equal(same.sender.id, 7);
  assert.equal(same.message.type, "text");
});

test("outcomes", () => {
  assert.ok(Outcome.pass().isPass);
  assert.ok(!Outcome.replace({ a: 1 }).isPass);
  assert.deepEqual(Outcome.drop("spam").action, { type: "drop", reason: "spam" });
  const both = Outcome.drop("x").forward("crm", { a: 1 }).forward("audit", {});
  assert.deepEqual(both.forwards.map((f) => f.destination), ["crm", "audit"]);
  assert.ok(Outcome.botAnswers([]).isPass);
  assert.deepEqual(Outcome.botAnswers([botInviteAgent()]), Outcome.reply({ event: "INVITE_AGENT" }));
  assert.deepEqual(Outcome.botAnswers([1, 2]).action, { type: "reply", payload: [1, 2] });
});

test("replies and bot answers have the wire shape", () => {
  assert.deepEqual(channelReplyText("hi"), { message: { type: "text", text: "hi" } });
  assert.deepEqual(channelReplyText("hi", "Bot")["sender"], { name: "Bot" });
  assert.deepEqual(botText("a", 1_700_000_000_999), {
    event: "BOT_MESSAGE", message: { type: "TEXT", text: "a", timestamp: 1_700_000_000 } });
  assert.deepEqual(botMarkdown("**a**", "a", 5000)["message"], { type: "MARKDOWN", content: "**a**", text: "a", timestamp: 5 });
  const message = botButtons("T", "t", ["1", "2", "3", "4"], 0)["message"] as { [key: string]: Json };
  assert.deepEqual(message["buttons"], [{ text: "1", id: "1" }, { text: "2", id: "2" }, { text: "3", id: "3" }]);
});

test("config reads with defaults and errors", () => {
  const c = new Config({ on: false, n: 5, name: "crm", list: ["a", "b"], one: "x", blank: " ", gone: null, neg: -1, mixed: ["a", 1] });
  assert.equal(c.boolOr("on", true), false);
  assert.ok(c.boolOr("missing", true) && c.boolOr("gone", true));
  assert.throws(() => c.boolOr("n", true), (e: unknown) => e instanceof ConfigError && e.message === "config: n must be a boolean");
  assert.equal(c.uintOr("n", 1), 5);
  assert.throws(() => c.uintOr("neg", 1), ConfigError);
  assert.equal(c.stringOr("name", "x"), "crm");
  assert.throws(() => c.requiredString("blank"), /config: blank is required/);
  assert.deepEqual(c.strings("list"), ["a", "b"]);
  assert.deepEqual(c.strings("one"), ["x"]);
  assert.equal(c.strings("missing"), undefined);
  assert.throws(() => c.strings("mixed"), ConfigError);
  assert.throws(() => new Config([1]), ConfigError);
});

test("needs", () => {
  assert.deepEqual(needs({ kv: true, destinations: ["crm", "crm", undefined] }), { kv: true, destinations: ["crm"] });
  assert.deepEqual(needs(), { kv: false, destinations: [] });
});

test("the fake host keeps kv, scripts sends, records logs and config", () => {
  const host = new FakeHost({ k: "v" }).withKv("a", "1");
  assert.equal(host.kvGet("a"), "1");
  host.kvSet("b", "2");
  host.kvDelete("a");
  assert.deepEqual([...host.kv], [["b", "2"]]);
  assert.throws(() => new FakeHost().withoutKv().kvGet("a"), HostError);
  host.respond("crm", 500, "oops").respond("crm", 200, "ok").failSend("down", "connection refused");
  assert.equal(host.send("crm", { x: 1 }).status, 500);
  assert.deepEqual(host.send("crm", {}), { status: 200, body: "ok" });
  assert.equal(host.send("crm", {}).body, "ok");
  assert.throws(() => host.send("down", {}), /connection refused/);
  assert.throws(() => host.send("elsewhere", {}), /not granted/);
  assert.deepEqual(host.sent[0], ["crm", { x: 1 }]);
  host.log("warn", "careful");
  assert.deepEqual(host.logs, [["warn", "careful"]]);
  host.config()["k"] = "changed";
  assert.deepEqual(host.config(), { k: "v" });
});
