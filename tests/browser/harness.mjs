// The browser tests' harness: a real hub (target/debug/hub) with its own
// SQLite file, a tiny website on another port that embeds the widget exactly
// as a customer's site does, the agent API, and Debian's chromium driven by
// playwright-core. Each test file starts its own set and stops it in `after`,
// so files are independent and can run in any order.
//
// Timeouts are generous on purpose: CI machines have two cores and run a
// debug build of the hub next to a browser.

import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const ARTIFACTS = join(ROOT, 'target', 'browser-artifacts');
export const TIMEOUT = 30_000;
/// A whole test (several round trips through the hub and the browser).
export const TEST_TIMEOUT = 180_000;

const HUB_BIN = process.env.HUB_BIN || join(ROOT, 'target', 'debug', 'hub');
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const ADMIN_TOKEN = 'browser-tests-admin-token-0123456789';

/** A port nothing listens on right now. */
export async function freePort() {
  const srv = net.createServer();
  await new Promise((ok, ko) => srv.once('error', ko).listen(0, '127.0.0.1', ok));
  const { port } = srv.address();
  await new Promise((ok) => srv.close(ok));
  return port;
}

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

/** Polls `fn` until it returns something truthy; its last error explains a timeout. */
export async function waitFor(fn, { timeout = TIMEOUT, interval = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}${last ? `: ${last.message}` : ''}`);
    }
    await sleep(interval);
  }
}

// ------------------------------------------------------------------- hub

/**
 * Runs `hub serve --config <config>` and waits until `/healthz` answers at
 * `base`. Answers the process; throws with the hub's log if it does not come up.
 */
async function launch(dir, config, base) {
  const env = { ...process.env, RUST_LOG: process.env.RUST_LOG || 'warn' };
  // The file alone configures the hub: a developer's own HUB_* settings stay out.
  for (const k of ['HUB_LISTEN', 'HUB_PUBLIC_URL', 'HUB_DATABASE_URL', 'HUB_ADMIN_TOKEN']) delete env[k];
  const child = spawn(HUB_BIN, ['--config', config, 'serve'], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
  const log = [];
  const keep = (chunk) => {
    log.push(chunk.toString());
    if (log.length > 2000) log.splice(0, 1000);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const proc = { child, log, exited: null };
  proc.gone = new Promise((ok) => child.once('exit', (code, signal) => { proc.exited = { code, signal }; ok(); }));
  try {
    await waitFor(async () => {
      if (proc.exited) throw new Error(`the hub exited (${JSON.stringify(proc.exited)})`);
      const r = await fetch(`${base}/healthz`);
      return r.ok;
    }, { timeout: 60_000, interval: 100, what: 'the hub to answer /healthz' });
  } catch (e) {
    if (!proc.exited) child.kill('SIGKILL');
    await proc.gone;
    e.hubLog = log.join('');
    throw e;
  }
  return proc;
}

/** Stops a hub process: SIGTERM, then SIGKILL if it takes longer than 10 s. */
async function terminate(proc) {
  if (proc.exited) return;
  proc.child.kill('SIGTERM');
  const t = setTimeout(() => proc.child.kill('SIGKILL'), 10_000);
  await proc.gone;
  clearTimeout(t);
}

/**
 * Starts `hub serve` on a free port with a fresh database and no plugins,
 * and waits until `/healthz` answers.
 */
/** A hub; `extraToml` is appended to its hub.toml (plugins, routes). */
export async function startHub(extraToml = '') {
  if (!existsSync(HUB_BIN)) {
    throw new Error(`${HUB_BIN} is missing: build it first (cargo build -p hub --locked)`);
  }
  const dir = mkdtempSync(join(tmpdir(), 'hub-browser-'));
  // Another process may take the port between freePort() and the hub's bind.
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const config = join(dir, 'hub.toml');
    writeFileSync(
      config,
      [
        '[server]',
        `listen = "127.0.0.1:${port}"`,
        '',
        '[storage]',
        `url = "sqlite://${join(dir, 'hub.db')}"`,
        // The tests do not pull the power plug; skipping fsync keeps them fast.
        'durability = "normal"',
        '',
        '[admin]',
        `token = "${ADMIN_TOKEN}"`,
        '',
        extraToml,
      ].join('\n'),
    );
    const base = `http://127.0.0.1:${port}`;
    let proc;
    try {
      proc = await launch(dir, config, base);
    } catch (e) {
      if (attempt < 3 && /address|in use/i.test(e.hubLog || '')) continue;
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`${e.message}\n--- hub log ---\n${(e.hubLog || '').slice(-4000)}`);
    }
    const hub = {
      base,
      port,
      dir,
      log: () => proc.log.join(''),
      async admin(method, path, body) {
        const r = await fetch(`${base}/admin/v1${path}`, {
          method,
          headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        const data = await r.json().catch(() => null);
        if (!r.ok) throw new Error(`admin ${method} ${path}: ${r.status} ${JSON.stringify(data)}`);
        return data;
      },
      /** An agent; answers the agent API client with the agent's token. */
      async agent(name, email) {
        const { token } = await hub.admin('POST', '/agents', { name, email });
        return agentClient(base, token);
      },
      /** A widget channel; answers the admin API's view (`widget.widget_id`, `widget.embed`, …). */
      async widget(fields) {
        return hub.admin('POST', '/channels', { type: 'widget', ...fields });
      },
      /** How many visitors' event streams the hub has open (`/metrics`). */
      async widgetStreams() {
        const r = await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
        const m = /^hub_live_streams\{kind="widget"\} (\d+)$/m.exec(await r.text());
        if (!m) throw new Error('no hub_live_streams{kind="widget"} in /metrics');
        return Number(m[1]);
      },
      /**
       * Stops the hub (SIGTERM) and starts it again at the same address on
       * the same database; `meanwhile` runs while it is down.
       */
      async restart(meanwhile) {
        await terminate(proc);
        if (meanwhile) await meanwhile();
        for (let attempt = 1; ; attempt++) {
          try {
            proc = await launch(dir, config, base);
            return;
          } catch (e) {
            // The old socket may linger a moment.
            if (attempt < 20 && /address|in use/i.test(e.hubLog || '')) {
              await sleep(250);
              continue;
            }
            throw new Error(`${e.message}\n--- hub log ---\n${(e.hubLog || '').slice(-4000)}`);
          }
        }
      },
      async stop() {
        await terminate(proc);
        if (!process.env.KEEP_HUB_DIR) rmSync(dir, { recursive: true, force: true });
      },
    };
    return hub;
  }
}

/**
 * A TCP relay to `port` on loopback, standing for the visitor's network:
 * `cut()` drops every connection through it and refuses new ones until
 * `restore()`.
 */
export async function startRelay(port) {
  const sockets = new Set();
  let cut = false;
  const srv = net.createServer((client) => {
    if (cut) {
      client.destroy();
      return;
    }
    const upstream = net.connect(port, '127.0.0.1');
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => {});
    }
    client.pipe(upstream);
    upstream.pipe(client);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise((ok) => srv.listen(0, '127.0.0.1', ok));
  return {
    port: srv.address().port,
    /** How many connections are open through the relay. */
    open: () => sockets.size,
    cut() {
      cut = true;
      for (const s of sockets) s.destroy();
    },
    restore() {
      cut = false;
    },
    stop: () => new Promise((ok) => {
      cut = true;
      for (const s of sockets) s.destroy();
      srv.close(() => ok());
    }),
  };
}

/** The agent API as one agent. Every call answers `{status, body}`. */
export function agentClient(base, token) {
  async function call(method, path, body) {
    const r = await fetch(`${base}/agent/v1${path}`, {
      method,
      headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = text;
    }
    return { status: r.status, body: data };
  }
  async function ok(method, path, body) {
    const r = await call(method, path, body);
    if (r.status < 200 || r.status > 299) {
      throw new Error(`agent ${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
    }
    return r.body;
  }
  const agent = {
    token,
    call,
    online: (on = true) => ok('PUT', '/status', { online: on }),
    chats: async (all = false) => (await ok('GET', `/chats${all ? '?state=all' : ''}`)).chats,
    chat: (id) => ok('GET', `/chats/${id}`),
    say: (id, text) => ok('POST', `/chats/${id}/messages`, { type: 'text', text }),
    typing: (id) => ok('POST', `/chats/${id}/messages`, { type: 'typein' }),
    accept: (id) => ok('POST', `/chats/${id}/accept`),
    close: (id) => ok('POST', `/chats/${id}/close`),
    /** The chat view of the agent's chat holding a client message with `text`. */
    async chatWith(text, { all = false, timeout = TIMEOUT } = {}) {
      return waitFor(async () => {
        for (const c of await agent.chats(all)) {
          const view = await agent.chat(c.id);
          if (view.messages.some((m) => m.author === 'client' && messageText(m) === text)) return view;
        }
        return null;
      }, { timeout, interval: 250, what: `the agent to see "${text}"` });
    },
    /** Polls the chat view until `pred(view)` holds. */
    async chatUntil(id, pred, what) {
      return waitFor(async () => {
        const view = await agent.chat(id);
        return pred(view) ? view : null;
      }, { interval: 250, what });
    },
  };
  return agent;
}

/** A stored message's text as the agent API shows it. */
export function messageText(m) {
  const b = m.body || {};
  return b.text ?? b.message?.text ?? null;
}

// ------------------------------------------------------------------ site

/** Every callback a page may declare: the `widget_on*` names and their `jivo_*` twins. */
export const CALLBACKS = {
  widget_onLoad: 'jivo_onLoadCallback',
  widget_onOpen: 'jivo_onOpen',
  widget_onClose: 'jivo_onClose',
  widget_onMessageSent: 'jivo_onMessageSent',
  widget_onClientStartChat: 'jivo_onClientStartChat',
  widget_onAccept: 'jivo_onAccept',
  widget_onIntroduction: 'jivo_onIntroduction',
  widget_onResize: 'jivo_onResizeCallback',
  widget_onCallStart: 'jivo_onCallStart',
  widget_onCallEnd: 'jivo_onCallEnd',
  widget_onChangeState: 'jivo_onChangeState',
  widget_onMessageReceived: 'jivo_onMessageReceived',
  widget_onWidgetDestroy: 'jivo_onWidgetDestroy',
};

const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

/**
 * A page of the website: the page declares callbacks that push
 * `{name, args, api}` into `window.__events` (`api`: whether widget_api
 * existed when it was called), then embeds the widget with the one tag
 * the admin API gives. `legacy` pages are written for the public service:
 * `jivo_*` callbacks only.
 */
function sitePage({ title, heading, embed, legacy, home }) {
  const names = legacy ? Object.values(CALLBACKS) : [...Object.keys(CALLBACKS), ...Object.values(CALLBACKS)];
  const recorder = `
window.__events = [];
(function () {
  function plain(a) {
    if (a instanceof Error) return { error: a.message };
    if (a === undefined) return null;
    try { return JSON.parse(JSON.stringify(a)); } catch (e) { return String(a); }
  }
  ${JSON.stringify(names)}.forEach(function (name) {
    window[name] = function () {
      window.__events.push({ name: name, args: Array.prototype.map.call(arguments, plain), api: typeof window.widget_api === 'object' });
    };
  });
})();
${legacy ? `window.jivo_onLoadCallback = function () {
  window.__events.push({ name: 'jivo_onLoadCallback', args: [], api: typeof window.jivo_api === 'object' });
  // What such pages typically do: decide on the chat mode right away.
  window.__mode = jivo_api.chatMode();
  if (window.__mode === 'online') jivo_api.open();
};` : ''}`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<style>
  body { margin: 0; font: 16px/1.5 Georgia, serif; color: #333; background: #fbf8f3; }
  header { background: #3d2b1f; color: #f5e6d3; padding: 14px 28px; font: bold 20px/1.2 Georgia, serif; }
  header nav { float: right; font: 15px/1.5 Georgia, serif; }
  header a { color: #f5e6d3; margin-left: 18px; }
  main { padding: 20px 28px; max-width: 560px; }
  /* Rules a real site might have; the widget must not be affected by them. */
  div { font-family: "Comic Sans MS", cursive; }
  button { background: hotpink !important; }
  .card { background: #fff; border: 1px solid #e5dccf; border-radius: 6px; padding: 12px 16px; margin: 12px 0; }
</style>
<script>${recorder}</script>
</head>
<body>
<header>Coffee Corner <nav><a href="${home}shop/beans">Beans</a><a href="${home}shop/grinders">Grinders</a></nav></header>
<main>
  <h1>${escapeHtml(heading)}</h1>
  <p class="card">Single-origin beans roasted every Monday. Free delivery from 30 EUR.</p>
  <p class="card">Questions about grind size or brewing? Ask us in the chat at the bottom right.</p>
</main>
${embed}
</body>
</html>`;
}

/**
 * The customer's website, on its own port (so the widget's calls to the hub
 * are cross-origin, as on a real site). `GET /<widget_id>/<any path>` is a
 * page embedding that widget (`?legacy=1`: a page written for the public
 * service); `POST /hook` receives the hub's event webhooks.
 */
export async function startSite(hub) {
  const hooks = [];
  const srv = createServer((req, res) => {
    const url = new URL(req.url, 'http://site');
    if (req.method === 'POST' && url.pathname === '/hook') {
      let body = '';
      req.on('data', (c) => { body += c; });
      req.on('end', () => {
        try {
          hooks.push(JSON.parse(body));
        } catch {
          hooks.push({ unparsed: body });
        }
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end('{"result":"ok"}');
      });
      return;
    }
    const [, widgetId, ...rest] = url.pathname.split('/');
    if (req.method !== 'GET' || !widgetId || widgetId === 'favicon.ico') {
      res.writeHead(404).end();
      return;
    }
    const page = rest.join('/') || 'home';
    // The tag as the admin API's `widget.embed` has it: protocol-relative.
    const embed = `<script src="//127.0.0.1:${hub.port}/widget/${encodeURIComponent(widgetId)}" async></script>`;
    res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8', 'Cache-Control': 'no-store' });
    res.end(sitePage({
      title: `Coffee Corner: ${page}`,
      heading: page === 'home' ? 'Welcome to Coffee Corner' : `Coffee Corner: ${page}`,
      embed,
      legacy: url.searchParams.has('legacy'),
      home: `/${widgetId}/`,
    }));
  });
  await new Promise((ok) => srv.listen(0, '127.0.0.1', ok));
  const { port } = srv.address();
  return {
    base: `http://127.0.0.1:${port}`,
    origin: `http://127.0.0.1:${port}`,
    hooks,
    url: (widgetId, path = '') => `http://127.0.0.1:${port}/${widgetId}/${path}`,
    stop: () => new Promise((ok) => {
      srv.closeAllConnections?.();
      srv.close(() => ok());
    }),
  };
}

// --------------------------------------------------------------- browser

/**
 * Debian's chromium, headless. `launch` gives every run a fresh, temporary
 * profile (user-data dir) and every context its own storage, so two
 * contexts are two visitors who never met.
 */
export async function startBrowser() {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    timeout: 60_000,
  });
}

/** A new visitor: their own browser context (storage) and one page. */
export async function visitor(browser) {
  const context = await browser.newContext({ viewport: { width: 900, height: 700 }, locale: 'en-GB' });
  context.setDefaultTimeout(TIMEOUT);
  const page = await context.newPage();
  page.on('pageerror', (e) => console.error(`[page error] ${e.message}`));
  // A widget session the hub could not give (refused for load, failed, or
  // never answered) is retried by the widget, and a test may still pass:
  // the line is what is left to explain a flake. 401 and 403 are answers.
  const widgetSession = (url) => url.includes('/widget/v1/') && url.endsWith('/session');
  page.on('response', (r) => {
    if (widgetSession(r.url()) && (r.status() >= 500 || r.status() === 429)) {
      console.error(`[hub] ${r.request().method()} ${r.url()}: ${r.status()}`);
    }
  });
  page.on('requestfailed', (r) => {
    if (widgetSession(r.url())) console.error(`[hub] ${r.method()} ${r.url()}: ${r.failure()?.errorText}`);
  });
  return { context, page };
}

/** An element of the widget by `data-testid`; CSS locators pierce the open shadow root of `#hub-widget`. */
export function w(page, testid) {
  return page.locator('#hub-widget').locator(`[data-testid="${testid}"]`);
}

/** The widget's message bubbles (optionally only those containing `text`). */
export function messages(page, text) {
  const all = w(page, 'hub-widget-message');
  return text === undefined ? all : all.filter({ hasText: text });
}

/** Opens `url` and waits for `widget_onLoad`. */
export async function openPage(page, url, options) {
  await page.goto(url, options);
  await waitLoaded(page);
}

/**
 * Waits until the widget has its session (or was told it may not have one):
 * `widget_onLoad` fires after the first `POST /session` answered, even when
 * that answer failed and the widget retries later, and the methods that ask
 * the hub answer "the hub cannot be reached" until a retry succeeds.
 */
export async function waitSession(page) {
  await w(page, 'hub-widget-status')
    .filter({ hasNotText: 'Connecting' })
    .waitFor({ state: 'attached', timeout: TIMEOUT });
}

export async function waitLoaded(page) {
  await page.waitForFunction(
    () => (window.__events || []).some((e) => e.name === 'widget_onLoad' || e.name === 'jivo_onLoadCallback'),
    null,
    { timeout: TIMEOUT },
  );
}

/** Calls `widget_api[method](...args)` in the page and answers what it returned. */
export function api(page, method, ...args) {
  return page.evaluate(([m, a]) => window.widget_api[m](...a), [method, args]);
}

export function events(page, name) {
  return page.evaluate((n) => (n ? window.__events.filter((e) => e.name === n) : window.__events), name);
}

/** How many events the page has recorded; pass it to `eventsSince`. */
export function mark(page) {
  return page.evaluate(() => window.__events.length);
}

export function eventsSince(page, n) {
  return page.evaluate((i) => window.__events.slice(i), n);
}

/** Waits until the page has recorded `count` calls of callback `name`; answers them. */
export async function waitEvent(page, name, count = 1) {
  await page.waitForFunction(
    ([n, c]) => window.__events.filter((e) => e.name === n).length >= c,
    [name, count],
    { timeout: TIMEOUT },
  );
  return events(page, name);
}

/**
 * Resolves with the hub's answer to the widget's next `POST …/<endpoint>`.
 * widget_api setters return at once and call the hub in the background; a
 * test that reloads the page must wait for that call, or the navigation
 * cancels it.
 */
export function hubAnswer(page, endpoint) {
  return page.waitForResponse(
    (r) => r.request().method() === 'POST' && new URL(r.url()).pathname.endsWith(`/${endpoint}`),
    { timeout: TIMEOUT },
  );
}

/** Types `text` into the widget's composer and sends it with Enter, as a visitor does. */
export async function typeAndSend(page, text) {
  const input = w(page, 'hub-widget-input');
  await input.click();
  await input.fill(text);
  await input.press('Enter');
  // Sent: the bubble carries the id the hub gave the message.
  await messages(page, text).and(page.locator('[data-author="client"][data-id]')).first().waitFor();
}

/** Saves a screenshot of the page under target/browser-artifacts/. */
export async function screenshot(page, name) {
  mkdirSync(ARTIFACTS, { recursive: true });
  const path = join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path });
  return path;
}
