// Helpers of the agent console's browser tests: a hub with an integrator (a
// loopback server that receives agent replies and event webhooks), custom
// channels pointing at it, agents with console passwords, customers posting
// to the channel endpoint, and the console's sign-in driven as a person does.

import { createServer } from 'node:http';
import { crc32, deflateSync } from 'node:zlib';
import { TIMEOUT, agentClient, startHub, waitFor } from './harness.mjs';

/**
 * The integrator's server. `POST /out/<public_id>` receives agent replies
 * (recorded in `replies`; while `fail` is set it answers with it, e.g.
 * `{status: 400, body: {error: {code: 12, message: 'user blocked'}}}`).
 * `POST /hook` receives event webhooks (recorded in `events`); a
 * `chat_accepted` is answered with `acceptReply(event)` when it is set.
 */
export async function startIntegrator() {
  const it = {
    replies: [],
    events: [],
    fail: null,
    acceptReply: null,
  };
  const srv = createServer((req, res) => {
    if (req.method === 'GET' && req.url.startsWith('/files/')) {
      res.writeHead(200, { 'Content-Type': 'image/png', 'Cache-Control': 'no-store' });
      res.end(picture(240, 160));
      return;
    }
    let raw = '';
    req.on('data', (c) => { raw += c; });
    req.on('end', () => {
      let body = null;
      try {
        body = JSON.parse(raw);
      } catch {
        body = { unparsed: raw };
      }
      const answer = (status, data) => {
        res.writeHead(status, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify(data));
      };
      if (req.url.startsWith('/out/')) {
        it.replies.push({ path: req.url, body, failed: !!it.fail });
        if (it.fail) return answer(it.fail.status, it.fail.body);
        return answer(200, { result: 'ok' });
      }
      if (req.url === '/hook') {
        it.events.push(body);
        if (body && body.event_name === 'chat_accepted' && it.acceptReply) return answer(200, it.acceptReply(body));
        return answer(200, { result: 'ok' });
      }
      answer(404, { error: { message: 'no such path' } });
    });
  });
  await new Promise((ok) => srv.listen(0, '127.0.0.1', ok));
  it.base = `http://127.0.0.1:${srv.address().port}`;
  /** The text replies that reached the integrator (typing notifications left out). */
  it.texts = () => it.replies.filter((r) => r.body?.message?.type === 'text').map((r) => r.body.message.text);
  it.stop = () => new Promise((ok) => {
    srv.closeAllConnections?.();
    srv.close(() => ok());
  });
  return it;
}

/** A PNG picture (a parcel on a shelf, roughly) for media messages. */
export function picture(w, h) {
  const rows = [];
  for (let y = 0; y < h; y++) {
    const row = Buffer.alloc(1 + w * 3);
    for (let x = 0; x < w; x++) {
      const box = x > w * 0.3 && x < w * 0.7 && y > h * 0.25 && y < h * 0.8;
      const tape = box && Math.abs(x - w / 2) < 6;
      const c = tape ? [196, 160, 110] : box ? [176, 122, 72] : y > h * 0.8 ? [120, 120, 130] : [214, 226, 240];
      c.forEach((v, i) => { row[1 + x * 3 + i] = v; });
    }
    rows.push(row);
  }
  const chunk = (type, data) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type), data]);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(crc32(td));
    return Buffer.concat([len, td, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr.set([8, 2, 0, 0, 0], 8);
  return Buffer.concat([
    Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]),
    chunk('IHDR', ihdr),
    chunk('IDAT', deflateSync(Buffer.concat(rows))),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}

/** A hub with an integrator; `close()` stops both. */
export async function startConsoleHub() {
  const hub = await startHub();
  const integrator = await startIntegrator();
  let n = 0;
  const env = {
    hub,
    integrator,
    /**
     * An agent with a console password; answers `{id, email, password, api}`
     * (`api`: the agent API with the agent's bearer token).
     */
    async agent(name, email, password = `pw-${email}-correct`) {
      const a = await hub.admin('POST', '/agents', { name, email });
      await hub.admin('PUT', `/agents/${a.id}/password`, { password });
      return { id: a.id, name, email, password, api: agentClient(hub.base, a.token) };
    },
    /** A custom channel whose replies and webhooks go to the integrator. */
    async channel(agents, name = `shop-${++n}`) {
      const ch = await hub.admin('POST', '/channels', {
        name,
        customer_endpoint: `${integrator.base}/out`,
        agents,
      });
      await hub.admin('PUT', `/channels/${ch.id}/webhook`, { url: `${integrator.base}/hook` });
      return ch;
    },
    /** A customer message to the channel endpoint, as docs/channel.md says. */
    async say(channel, sender, text) {
      return env.post(channel, sender, { type: 'text', id: `m-${Date.now()}`, text });
    },
    async post(channel, sender, message) {
      const r = await fetch(channel.endpoint_url, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json; charset=utf-8' },
        body: JSON.stringify({ sender, message }),
      });
      const body = await r.text();
      if (r.status !== 200) throw new Error(`channel POST: ${r.status} ${body}`);
      return body;
    },
    async close() {
      await integrator.stop();
      await hub.stop();
    },
  };
  return env;
}

/** A new browser context on the console's page (not signed in yet). */
export async function openConsole(browser, hub) {
  const context = await browser.newContext({ viewport: { width: 1360, height: 820 }, locale: 'en-GB' });
  context.setDefaultTimeout(TIMEOUT);
  const v = { context, page: await context.newPage(), errors: [] };
  v.page.on('pageerror', (e) => v.errors.push(e.message));
  v.page.on('console', (m) => {
    // DEBUG_CONSOLE=1 prints the page's console to the test output.
    if (process.env.DEBUG_CONSOLE) console.log('PAGE', m.text());
    if (m.type() === 'error') v.errors.push(m.text());
  });
  await v.page.goto(`${hub.base}/console`);
  await v.page.getByRole('button', { name: 'Sign in' }).waitFor({ timeout: TIMEOUT });
  return v;
}

/** Fills the sign-in form and presses "Sign in". */
export async function signIn(page, email, password) {
  await page.getByLabel('E-mail').fill(email);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
}

/** Signs in and waits for the signed-in page ("Sign out" is there). */
export async function signedIn(page, agent) {
  await signIn(page, agent.email, agent.password);
  await page.getByRole('button', { name: 'Sign out' }).waitFor({ timeout: TIMEOUT });
}

/** The chat list's button for a client (its name, maybe with an unread count). */
export function chatButton(page, name) {
  return page.getByRole('navigation', { name: 'Chats' }).getByRole('button', { name: new RegExp(`^${escapeRe(name)}(,|$)`) });
}

/** A chat list group (`Waiting`, `Mine`, `Closed`) as a locator of its section. */
export function group(page, name) {
  return page.getByRole('navigation', { name: 'Chats' }).getByRole('region', { name: new RegExp(`^${escapeRe(name)}\\b`) });
}

/** The message list items of the open chat, optionally those containing `text`. */
export function messageItems(page, text) {
  const all = page.getByRole('list', { name: 'Messages' }).getByRole('listitem');
  return text === undefined ? all : all.filter({ hasText: text });
}

export function escapeRe(s) {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Polls until the integrator's recorded array holds an entry `pred` accepts. */
export function until(list, pred, what) {
  return waitFor(() => list.find(pred), { what });
}
