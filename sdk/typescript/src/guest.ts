/**
 * The wasm side of the SDK: a `Host` over the hub's imports, and
 * `exportPlugin`, which turns a `Plugin` into the component's `handle`,
 * `validateConfig` and `needsFor`. `build.sh` bundles it with the plugin's
 * default export; unit tests never import it.
 */

import * as wit from "hub:plugin/host@0.1.0";

import { Config, Event, HostError, PluginError, type Host, type Json, type Level, type Outcome, type Plugin, type Response } from "./index.js";

/** The event record as componentize-js hands it over (s64 as bigint). */
interface WitEvent {
  id: string;
  kind: string;
  direction: "inbound" | "outbound";
  channelId?: bigint;
  channel?: string;
  chatId?: bigint;
  payload: string;
  at: bigint;
  context: string;
}

type WitAction = { tag: "continue"; val: string | undefined } | { tag: "drop"; val: string } | { tag: "reply"; val: string };

interface WitOutcome {
  action: WitAction;
  forwards: { destination: string; payload: string }[];
}

function hostCall<T>(call: () => T): T {
  try {
    return call();
  } catch (e) {
    // componentize-js throws a `result`'s error as an Error whose `payload` is the value.
    const payload = (e as { payload?: unknown }).payload;
    throw new HostError(typeof payload === "string" ? payload : String(e));
  }
}

/** The `Host` of a running component: each call goes to the hub. */
class WitHost implements Host {
  log(level: Level, message: string): void {
    wit.log(level, String(message));
  }

  config(): { [key: string]: Json } {
    const raw = wit.config();
    try {
      const value = raw.trim() === "" ? {} : (JSON.parse(raw) as Json);
      return value !== null && typeof value === "object" && !Array.isArray(value) ? value : {};
    } catch {
      // The hub writes this JSON itself; a plugin still works with its defaults.
      wit.log("warn", "config is not JSON");
      return {};
    }
  }

  kvGet(key: string): string | undefined {
    return hostCall(() => wit.kvGet(key));
  }

  kvSet(key: string, value: string): void {
    hostCall(() => wit.kvSet(key, value));
  }

  kvDelete(key: string): void {
    hostCall(() => wit.kvDelete(key));
  }

  send(destination: string, payload: Json): Response {
    const r = hostCall(() => wit.send(destination, JSON.stringify(payload)));
    return { status: r.status, body: r.body };
  }
}

/** `ConfigError: config: x must … (at plugin.ts:12)`: plugin errors keep their message, others say what and where. */
function describe(e: unknown): string {
  if (e instanceof PluginError) return e.message;
  if (e instanceof Error) {
    const frame = e.stack?.split("\n").find((l) => l.includes("@") || l.includes(" at "));
    const where = frame ? ` (${frame.trim()})` : "";
    return `${e.name}: ${e.message}${where}`;
  }
  return String(e);
}

function guarded<T>(call: () => T): T {
  try {
    return call();
  } catch (e) {
    // A thrown string is the `err` of the export's `result`.
    throw describe(e);
  }
}

function configOf(text: string): Config {
  let value: Json;
  try {
    value = text.trim() === "" ? null : (JSON.parse(text) as Json);
  } catch (e) {
    throw new PluginError(`config is not JSON: ${String(e)}`);
  }
  return new Config(value);
}

function eventOf(e: WitEvent): Event {
  return new Event({
    id: e.id,
    kind: e.kind,
    direction: e.direction,
    channelId: e.channelId === undefined ? undefined : Number(e.channelId),
    channel: e.channel,
    chatId: e.chatId === undefined ? undefined : Number(e.chatId),
    at: Number(e.at),
    payloadText: e.payload,
    contextText: e.context,
  });
}

function outcomeOf(o: Outcome): WitOutcome {
  const a = o.action;
  let action: WitAction;
  if (a.type === "continue") {
    action = { tag: "continue", val: a.payload === undefined ? undefined : JSON.stringify(a.payload) };
  } else if (a.type === "drop") {
    action = { tag: "drop", val: a.reason };
  } else {
    action = { tag: "reply", val: JSON.stringify(a.payload) };
  }
  return {
    action,
    forwards: o.forwards.map((f) => ({ destination: f.destination, payload: JSON.stringify(f.payload) })),
  };
}

/** The component's exports for `plugin`. */
export function exportPlugin(plugin: Plugin) {
  const host = new WitHost();
  return {
    handle(event: WitEvent): WitOutcome {
      return guarded(() => {
        const outcome = plugin.handle(eventOf(event), host);
        if (outcome === undefined || outcome === null || !("action" in outcome)) {
          throw new PluginError(`handle returned ${String(outcome)}, not an Outcome`);
        }
        return outcomeOf(outcome);
      });
    },
    validateConfig(config: string): void {
      guarded(() => plugin.validateConfig?.(configOf(config)));
    },
    needsFor(config: string): { kv: boolean; destinations: string[] } {
      return guarded(() => {
        const n = plugin.needs?.(configOf(config)) ?? { kv: false, destinations: [] };
        return { kv: n.kv, destinations: [...n.destinations] };
      });
    },
  };
}
