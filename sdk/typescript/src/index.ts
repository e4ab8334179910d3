/**
 * Hub plugins in TypeScript: the SDK over the hub's WIT world `hub:plugin`,
 * the same shape as the Rust SDK (`plugin_api::sdk`) in TypeScript's names.
 *
 * ```ts
 * import { Outcome, type Event, type Host, type Plugin } from "@hub/plugin";
 * export default {
 *   handle(event: Event, host: Host): Outcome { return Outcome.pass(); },
 * } satisfies Plugin;
 * ```
 *
 * Unit tests use `FakeHost` from `@hub/plugin/testing`; payload types for
 * every event kind are in `./payloads`.
 */

export type * from "./payloads.js";

/** A value as `JSON.parse` returns it. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A bot's `BUTTONS` message carries at most this many buttons. */
export const MAX_BUTTONS = 3;

/**
 * Throw it to fail the call with exactly this message; the route's
 * `on_error` decides what happens to the event. Anything else thrown fails
 * the call too, with its message and where it was thrown.
 */
export class PluginError extends Error {
  override name = "PluginError";
}

/** A config table the plugin cannot work with; the message names the key. */
export class ConfigError extends PluginError {
  override name = "ConfigError";
}

/** A host call the hub refused (KV not granted, a quota, a destination not granted or unreachable). */
export class HostError extends Error {
  override name = "HostError";
}

/** Which way an event crosses the hub's boundary. */
export type Direction = "inbound" | "outbound";

/** Severity of a log line. */
export type Level = "trace" | "debug" | "info" | "warn" | "error";

/** The fields of an event, as the hub hands them over. */
export interface EventInit {
  id: string;
  kind: string;
  direction: Direction;
  channelId?: number;
  channel?: string;
  chatId?: number;
  at: number;
  payload?: Json;
  context?: { [key: string]: Json };
  payloadText?: string;
  contextText?: string;
}

function parse(text: string, empty: Json): Json {
  // The hub writes this text with a JSON serializer; text that is not JSON
  // would be a hub bug, and reads as the empty value.
  if (text.trim() === "") return empty;
  try {
    return JSON.parse(text) as Json;
  } catch {
    return empty;
  }
}

function field(value: Json | undefined, key: string): Json | undefined {
  return value !== null && typeof value === "object" && !Array.isArray(value) ? value[key] : undefined;
}

/**
 * One event on its way through a route's plugin chain. The payload and the
 * context arrive as JSON text and are parsed the first time they are read.
 */
export class Event {
  /** UUID, stable for the event's whole life. */
  readonly id: string;
  /** Dotted kind, for example `channel.customer_message`. */
  readonly kind: string;
  readonly direction: Direction;
  readonly channelId: number | undefined;
  readonly channel: string | undefined;
  readonly chatId: number | undefined;
  /** When the event was made, Unix milliseconds. */
  at: number;
  #payloadText: string | undefined;
  #payload: Json | undefined;
  #contextText: string | undefined;
  #context: { [key: string]: Json } | undefined;

  constructor(init: EventInit) {
    this.id = init.id;
    this.kind = init.kind;
    this.direction = init.direction;
    this.channelId = init.channelId;
    this.channel = init.channel;
    this.chatId = init.chatId;
    this.at = init.at;
    this.#payloadText = init.payloadText;
    this.#payload = init.payload ?? null;
    this.#contextText = init.contextText;
    this.#context = init.context;
  }

  /** The payload, as the event kind's wire format has it (see the payload types). */
  get payload(): Json {
    if (this.#payloadText !== undefined) {
      this.#payload = parse(this.#payloadText, null);
      this.#payloadText = undefined;
    }
    return this.#payload ?? null;
  }

  set payload(value: Json) {
    this.#payloadText = undefined;
    this.#payload = value;
  }

  /** What the hub knows around the event, e.g. `{"agents_online": 2}`; `{}` when nothing. */
  get context(): { [key: string]: Json } {
    if (this.#contextText !== undefined) {
      const parsed = parse(this.#contextText, {});
      this.#context = parsed !== null && typeof parsed === "object" && !Array.isArray(parsed) ? parsed : {};
      this.#contextText = undefined;
    }
    this.#context ??= {};
    return this.#context;
  }

  /** The payload typed for the compiler (`event.payloadAs<CustomerMessage>()`); the hub has checked it against the kind's wire rules. */
  payloadAs<T>(): T {
    return this.payload as T;
  }

  /** Whether the kind matches a glob such as `channel.*`. */
  kindMatches(pattern: string): boolean {
    return globMatches(pattern, this.kind);
  }

  /** The number of the channel's agents online, when the hub said so. */
  get agentsOnline(): number | undefined {
    const n = this.context["agents_online"];
    return typeof n === "number" && Number.isInteger(n) && n >= 0 ? n : undefined;
  }

  /** `message.text` of the payload, the field most filters look at. */
  get messageText(): string | undefined {
    const text = field(field(this.payload, "message"), "text");
    return typeof text === "string" ? text : undefined;
  }

  /** `sender.id` of the payload as text: `7` and `"7"` name the same client. */
  get senderKey(): string | undefined {
    const id = field(field(this.payload, "sender"), "id");
    if (typeof id === "string" && id.trim() !== "") return id;
    if (typeof id === "number") return String(id);
    return undefined;
  }
}

/** Glob match where `*` stands for any run of characters (also none) and every other character for itself. */
export function globMatches(pattern: string, text: string): boolean {
  const p = [...pattern];
  const t = [...text];
  let pi = 0;
  let ti = 0;
  let star: [number, number] | undefined;
  while (ti < t.length) {
    if (pi < p.length && p[pi] === "*") {
      star = [pi, ti];
      pi += 1;
    } else if (pi < p.length && p[pi] === t[ti]) {
      pi += 1;
      ti += 1;
    } else if (star !== undefined) {
      pi = star[0] + 1;
      ti = star[1] + 1;
      star = [star[0], star[1] + 1];
    } else {
      return false;
    }
  }
  return p.slice(pi).every((c) => c === "*");
}

/** A payload for a destination named in `hub.toml`, delivered durably. */
export interface Forward {
  readonly destination: string;
  readonly payload: Json;
}

/** What becomes of the event. */
export type Action =
  | { readonly type: "continue"; readonly payload?: Json }
  | { readonly type: "drop"; readonly reason: string }
  | { readonly type: "reply"; readonly payload: Json };

/**
 * The result of handling one event: an action plus any forwards. Build one
 * with `Outcome.pass()`, `replace`, `drop`, `reply` or `botAnswers`, then
 * chain `.forward(...)`.
 */
export class Outcome {
  private constructor(
    readonly action: Action,
    readonly forwards: readonly Forward[] = [],
  ) {}

  /** Continue with the event unchanged. */
  static pass(): Outcome {
    return new Outcome({ type: "continue" });
  }

  /** Continue with a changed payload (checked by the hub against the kind's type). */
  static replace(payload: Json): Outcome {
    return new Outcome({ type: "continue", payload });
  }

  /** Stop the event; the reason is logged and counted by the hub. */
  static drop(reason: string): Outcome {
    return new Outcome({ type: "drop", reason: String(reason) });
  }

  /** Answer on the hub's behalf, e.g. `channelReplyText(...)` for a customer message. */
  static reply(payload: Json): Outcome {
    return new Outcome({ type: "reply", payload });
  }

  /**
   * A bot's answer to `bot.client_message`: `botText`, `botMarkdown`,
   * `botButtons` and `botInviteAgent` values, applied in order. One is
   * replied as itself, several as an array (the hub takes at most 5), none
   * means the bot stays silent.
   */
  static botAnswers(answers: Json[]): Outcome {
    if (answers.length === 0) return Outcome.pass();
    if (answers.length === 1) return Outcome.reply(answers[0] ?? null);
    return Outcome.reply([...answers]);
  }

  /** Also sends `payload` to `destination` through the hub's outbox. */
  forward(destination: string, payload: Json): Outcome {
    return new Outcome(this.action, [...this.forwards, { destination, payload }]);
  }

  /** Whether the event goes on unchanged. */
  get isPass(): boolean {
    return this.action.type === "continue" && this.action.payload === undefined;
  }
}

/** A destination's answer to `Host.send`. */
export interface Response {
  readonly status: number;
  readonly body: string;
}

/** What a plugin needs granted in its `[[plugins]]` entry of `hub.toml`. */
export interface Needs {
  /** A key-value namespace of its own (`kv = true`). */
  readonly kv: boolean;
  /** Destinations it sends or forwards to (`destinations = [...]`). */
  readonly destinations: readonly string[];
}

/** `needs({ kv: true, destinations: [config.forwardTo] })`: undefined destinations and repeats are left out. */
export function needs(init: { kv?: boolean; destinations?: readonly (string | undefined)[] } = {}): Needs {
  const destinations: string[] = [];
  for (const d of init.destinations ?? []) {
    if (d !== undefined && !destinations.includes(d)) destinations.push(d);
  }
  return { kv: init.kv ?? false, destinations };
}

/** The capabilities the hub grants a plugin; failed calls throw `HostError`. */
export interface Host {
  /** Writes a line to the hub's log, tagged with the plugin and the event. */
  log(level: Level, message: string): void;
  /** The plugin's `config` table from `hub.toml` (`{}` when absent). */
  config(): { [key: string]: Json };
  /** Reads from the plugin's own key-value namespace. */
  kvGet(key: string): string | undefined;
  kvSet(key: string, value: string): void;
  kvDelete(key: string): void;
  /** POSTs JSON to a granted destination and waits for the answer. */
  send(destination: string, payload: Json): Response;
}

/**
 * A plugin: one call per event, each in a fresh instance, so nothing is
 * kept between calls except through the KV store.
 */
export interface Plugin {
  /** Handles one event; throwing fails this call only, and the route's `on_error` decides. */
  handle(event: Event, host: Host): Outcome;
  /** Checks the config table when the hub loads the plugin: throw `ConfigError` naming the key. */
  validateConfig?(config: Config): void;
  /** What the plugin needs granted to work with this config; the default needs nothing. */
  needs?(config: Config): Needs;
}

function must(key: string, what: string): ConfigError {
  return new ConfigError(`config: ${key} must ${what}`);
}

/**
 * Typed reads of a plugin's config table, so every plugin reports a wrong
 * setting the same way: `config: <key> must be …` (thrown as `ConfigError`).
 * `null` values count as absent.
 */
export class Config {
  readonly #map: { [key: string]: Json };

  constructor(value: Json | undefined) {
    if (value === null || value === undefined) value = {};
    if (typeof value !== "object" || Array.isArray(value)) {
      throw new ConfigError(`config must be an object, not ${JSON.stringify(value)}`);
    }
    this.#map = value;
  }

  get(key: string): Json | undefined {
    const v = this.#map[key];
    return v === null ? undefined : v;
  }

  boolOr(key: string, fallback: boolean): boolean {
    const v = this.get(key);
    if (v === undefined) return fallback;
    if (typeof v !== "boolean") throw must(key, "be a boolean");
    return v;
  }

  /** A non-negative integer (`u64` in the Rust SDK). */
  uintOr(key: string, fallback: number): number {
    const v = this.get(key);
    if (v === undefined) return fallback;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0) throw must(key, "be a non-negative integer");
    return v;
  }

  string(key: string): string | undefined {
    const v = this.get(key);
    if (v !== undefined && typeof v !== "string") throw must(key, "be a string");
    return v;
  }

  stringOr(key: string, fallback: string): string {
    return this.string(key) ?? fallback;
  }

  /** A string that must be present and not blank. */
  requiredString(key: string): string {
    const v = this.string(key);
    if (v === undefined || v.trim() === "") throw new ConfigError(`config: ${key} is required`);
    return v;
  }

  /** An array of strings; a single string counts as an array of one. */
  strings(key: string): string[] | undefined {
    const v = this.get(key);
    if (v === undefined) return undefined;
    if (typeof v === "string") return [v];
    if (Array.isArray(v) && v.every((i) => typeof i === "string")) return [...(v as string[])];
    throw must(key, "be a string or an array of strings");
  }
}

/** A text reply to `channel.customer_message`, sent to the customer as an automatic message. */
export function channelReplyText(text: string, senderName?: string): { [key: string]: Json } {
  const reply: { [key: string]: Json } = {};
  if (senderName !== undefined) reply["sender"] = { name: senderName };
  reply["message"] = { type: "text", text };
  return reply;
}

// Bot answers. The guest has no clock worth trusting, so the timestamps come
// from the event: pass `event.at` as `atMs`.

function botMessage(message: { [key: string]: Json }): { [key: string]: Json } {
  return { event: "BOT_MESSAGE", message };
}

const seconds = (atMs: number): number => Math.floor(atMs / 1000);

/** A plain text answer: `{"event":"BOT_MESSAGE","message":{"type":"TEXT",…}}`. */
export function botText(text: string, atMs: number): { [key: string]: Json } {
  return botMessage({ type: "TEXT", text, timestamp: seconds(atMs) });
}

/** A Markdown answer; `text` is what channels without Markdown show instead. */
export function botMarkdown(content: string, text: string, atMs: number): { [key: string]: Json } {
  return botMessage({ type: "MARKDOWN", content, text, timestamp: seconds(atMs) });
}

/** An answer offering prepared replies as buttons with ids "1", "2", "3"; buttons past the third are left out. */
export function botButtons(title: string, text: string, buttons: string[], atMs: number): { [key: string]: Json } {
  return botMessage({
    type: "BUTTONS",
    title,
    text,
    buttons: buttons.slice(0, MAX_BUTTONS).map((b, i) => ({ text: b, id: String(i + 1) })),
    timestamp: seconds(atMs),
  });
}

/** Hands the chat to a human agent: `{"event":"INVITE_AGENT"}`. */
export function botInviteAgent(): { [key: string]: Json } {
  return { event: "INVITE_AGENT" };
}
