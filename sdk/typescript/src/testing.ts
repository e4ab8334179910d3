/**
 * A stand-in for the hub, so a plugin's rules are unit-tested with node's
 * test runner and no wasm runtime: in-memory KV, scripted sends, captured logs.
 */

import { Event, HostError, type Host, type Json, type Level, type Response } from "./index.js";

/**
 * A `Host` that records what a plugin does. Sends to a destination without a
 * script fail like a not-granted destination on the hub. Scripts for a
 * destination are used in order; the last one repeats.
 */
export class FakeHost implements Host {
  /** The KV store as it is now. */
  readonly kv = new Map<string, string>();
  /** Every line logged so far. */
  readonly logs: [Level, string][] = [];
  /** Every `send` so far (answered or not), as [destination, payload]. */
  readonly sent: [string, Json][] = [];
  #config: { [key: string]: Json };
  #kvError: string | undefined;
  readonly #scripts = new Map<string, (Response | string)[]>();

  constructor(config: { [key: string]: Json } = {}) {
    this.#config = config;
  }

  /** Scripts an answer of `destination` (which also grants it). */
  respond(destination: string, status: number, body = "{}"): this {
    this.#script(destination, { status, body });
    return this;
  }

  /** Scripts a failed call to `destination`, e.g. a connection error. */
  failSend(destination: string, error: string): this {
    this.#script(destination, error);
    return this;
  }

  /** Makes every KV call fail, as when the plugin is not granted `kv`. */
  withoutKv(): this {
    this.#kvError = "kv is not granted to this plugin";
    return this;
  }

  /** Pre-fills one KV entry. */
  withKv(key: string, value: string): this {
    this.kv.set(key, value);
    return this;
  }

  /** Replaces the plugin config between calls. */
  setConfig(config: { [key: string]: Json }): void {
    this.#config = config;
  }

  log(level: Level, message: string): void {
    this.logs.push([level, message]);
  }

  config(): { [key: string]: Json } {
    return structuredClone(this.#config);
  }

  kvGet(key: string): string | undefined {
    this.#kvCheck();
    return this.kv.get(key);
  }

  kvSet(key: string, value: string): void {
    this.#kvCheck();
    if (typeof value !== "string") throw new TypeError(`kv values are strings, not ${typeof value}`);
    this.kv.set(key, value);
  }

  kvDelete(key: string): void {
    this.#kvCheck();
    this.kv.delete(key);
  }

  send(destination: string, payload: Json): Response {
    this.sent.push([destination, structuredClone(payload)]);
    const queue = this.#scripts.get(destination);
    if (queue === undefined) throw new HostError(`destination \`${destination}\` is not granted to this plugin`);
    const answer = queue.length > 1 ? queue.shift() : queue[0];
    if (typeof answer === "string" || answer === undefined) throw new HostError(answer ?? "no answer");
    return answer;
  }

  #script(destination: string, answer: Response | string): void {
    const queue = this.#scripts.get(destination) ?? [];
    queue.push(answer);
    this.#scripts.set(destination, queue);
  }

  #kvCheck(): void {
    if (this.#kvError !== undefined) throw new HostError(this.#kvError);
  }
}

/**
 * An event as the hub would hand it over: id `test-event`, channel 1 `test`,
 * chat 1, context `{"agents_online": 1}`, and outbound for `channel.agent_*`
 * kinds, inbound otherwise.
 */
export function event(kind: string, payload: Json, at = 1_700_000_000_000): Event {
  return new Event({
    id: "test-event",
    kind,
    direction: kind.startsWith("channel.agent_") ? "outbound" : "inbound",
    channelId: 1,
    channel: "test",
    chatId: 1,
    at,
    payload,
    context: { agents_online: 1 },
  });
}

/** A `channel.customer_message` with a text from customer `senderId`. */
export function customerText(senderId: string | number, text: string, at = 1_700_000_000_000): Event {
  return event(
    "channel.customer_message",
    { sender: { id: senderId, name: "Customer" }, message: { type: "text", text } },
    at,
  );
}
