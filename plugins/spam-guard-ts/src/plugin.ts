/**
 * Spam guard in TypeScript: the same rules as the Rust `spam-guard`, event
 * for event (the suite runs one table of events against all builds).
 *
 * Drops `channel.customer_message` events whose text contains a configured
 * pattern, or whose client sends too many messages too fast. Config (all
 * optional): `patterns`, `max_messages` (default 20) per `window_secs`
 * (default 60) and client, kept in KV under `rate:<channel_id or 0>:<sender.id>`
 * (so the limit needs `kv = true`; 0 turns it off), `forward_to`: a
 * destination told about every dropped message.
 */

import { Config, ConfigError, HostError, Outcome, needs, type Event, type Host, type Needs, type Plugin } from "@hub/plugin";

interface Settings {
  patterns: string[];
  limit: number;
  windowSecs: number;
  forwardTo: string | undefined;
}

function settings(config: Config): Settings {
  const windowSecs = config.uintOr("window_secs", 60);
  if (windowSecs === 0) throw new ConfigError("config: window_secs must be at least 1");
  return {
    patterns: config.strings("patterns") ?? [],
    limit: config.uintOr("max_messages", 20),
    windowSecs,
    forwardTo: config.string("forward_to"),
  };
}

/** The first pattern found in the text, compared in lowercase. */
export function spamPattern(text: string | undefined, patterns: string[]): string | undefined {
  if (text === undefined) return undefined;
  const lower = text.toLowerCase();
  return patterns.find((p) => p !== "" && lower.includes(p.toLowerCase()));
}

interface Window {
  start: number;
  count: number;
}

/** The stored `{"start": ms, "count": n}`; a missing or unreadable one starts afresh. */
export function parseWindow(stored: string | undefined): Window | undefined {
  if (stored === undefined) return undefined;
  try {
    const v = JSON.parse(stored) as { start?: unknown; count?: unknown };
    if (Number.isInteger(v?.start) && Number.isInteger(v?.count) && (v.count as number) >= 0) {
      return { start: v.start as number, count: v.count as number };
    }
  } catch {
    // Garbage starts afresh, like a missing window.
  }
  return undefined;
}

/** Adds one message at `at`; a run-out window (or one in the future) is replaced by one starting now. */
export function count(stored: Window | undefined, at: number, windowMs: number): Window {
  if (stored !== undefined && stored.start <= at && at - stored.start < windowMs) {
    return { start: stored.start, count: stored.count + 1 };
  }
  return { start: at, count: 1 };
}

/** Counts the message in its client's window; true when that exceeds the limit. A KV the plugin cannot use turns the limit off. */
function overLimit(event: Event, host: Host, limit: number, windowSecs: number): boolean {
  const sender = event.senderKey;
  if (sender === undefined) return false;
  const key = `rate:${event.channelId ?? 0}:${sender}`;
  try {
    const window = count(parseWindow(host.kvGet(key)), event.at, windowSecs * 1000);
    host.kvSet(key, JSON.stringify({ start: window.start, count: window.count }));
    return window.count > limit;
  } catch (e) {
    if (!(e instanceof HostError)) throw e;
    host.log("warn", `rate limit skipped: kv: ${e.message}`);
    return false;
  }
}

const spamGuard: Plugin = {
  validateConfig(config: Config): void {
    settings(config);
  },

  needs(config: Config): Needs {
    const s = settings(config);
    return needs({ kv: s.limit > 0, destinations: [s.forwardTo] });
  },

  handle(event: Event, host: Host): Outcome {
    if (event.kind !== "channel.customer_message") return Outcome.pass();
    const s = settings(new Config(host.config()));
    const pattern = spamPattern(event.messageText, s.patterns);
    let reason: string;
    if (pattern !== undefined) {
      reason = `spam pattern "${pattern}"`;
    } else if (s.limit > 0 && overLimit(event, host, s.limit, s.windowSecs)) {
      reason = `rate limit: more than ${s.limit} messages in ${s.windowSecs} s`;
    } else {
      return Outcome.pass();
    }
    const outcome = Outcome.drop(reason);
    if (s.forwardTo === undefined) return outcome;
    const payload = event.payloadAs<{ sender?: { id?: string | number } }>();
    return outcome.forward(s.forwardTo, {
      event_id: event.id,
      kind: event.kind,
      channel: event.channel ?? null,
      chat_id: event.chatId ?? null,
      reason,
      sender_id: payload.sender?.id ?? null,
    });
  },
};

export default spamGuard;
