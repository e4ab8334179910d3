// The widget in Firefox: Debian's firefox-esr, headless, renders a page that
// embeds the widget, calls `widget_api` from its load callback and posts
// what the methods returned back to the site; the hub must have the
// visitor's message and custom data. playwright-core drives only its own
// patched Firefox builds, so Firefox's own `--screenshot` mode loads the page
// (its load event waits for a slow image, long enough for the widget's
// session and first message), and the screenshot is kept as an artifact.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { ARTIFACTS, TEST_TIMEOUT, startHub, waitFor } from './harness.mjs';

const FIREFOX = process.env.FIREFOX_PATH || '/usr/bin/firefox-esr';

let hub;
let ann;
let widgetId;
let site;
const results = [];

before(async () => {
  hub = await startHub();
  ann = await hub.agent('Ann', 'ann@example.com');
  widgetId = (await hub.widget({ name: 'firefox shop', agents: ['ann@example.com'] })).widget.widget_id;
  site = createServer((req, res) => {
    if (req.method === 'POST' && req.url === '/results') {
      let body = '';
      req.on('data', (c) => { body += c; });
      req.on('end', () => {
        results.push(JSON.parse(body));
        res.writeHead(204).end();
      });
      return;
    }
    if (req.url === '/slow.gif') {
      // Holds the page's load event (and so the screenshot) until the widget
      // has had time to talk to the hub.
      setTimeout(() => res.writeHead(200, { 'Content-Type': 'image/gif' }).end(), 5000);
      return;
    }
    res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
    res.end(`<!doctype html><html><head><meta charset="utf-8"><title>Firefox shop</title></head>
<body style="font-family:serif"><h1>Firefox shop</h1><p id="out">waiting</p>
<script>
  function widget_onLoad() {
    widget_api.open();
    var r = {
      chatMode: widget_api.chatMode(),
      contact: widget_api.getContactInfo(),
      customData: widget_api.setCustomData([{ title: 'Cart', content: '<b>2 items</b>' }]),
      unknown: widget_api.nope(),
      jivo: window.jivo_api === window.widget_api,
      sent: widget_api.sendMessage('Hello from Firefox'),
      agent: navigator.userAgent,
    };
    document.getElementById('out').textContent = JSON.stringify(r);
    fetch('/results', { method: 'POST', body: JSON.stringify(r) });
  }
</script>
<script src="//127.0.0.1:${hub.port}/widget/${widgetId}" async></script>
<img src="/slow.gif" width="1" height="1" alt="">
</body></html>`);
  });
  await new Promise((ok) => site.listen(0, '127.0.0.1', ok));
});

after(async () => {
  await new Promise((ok) => site?.close(ok));
  await hub?.stop();
});

test('in Firefox the widget loads, its methods answer at once, and the visitor\'s message reaches the agent', { timeout: TEST_TIMEOUT }, async () => {
  assert.ok(existsSync(FIREFOX), `${FIREFOX} is missing: scripts/test-browser.sh installs firefox-esr`);
  mkdirSync(ARTIFACTS, { recursive: true });
  const profile = mkdtempSync(join(tmpdir(), 'hub-firefox-'));
  const shot = join(ARTIFACTS, 'widget-firefox.png');
  const url = `http://127.0.0.1:${site.address().port}/`;
  const code = await new Promise((ok, ko) => {
    const ff = spawn(FIREFOX, ['--headless', '--no-remote', '--profile', profile,
      '--window-size=900,700', '--screenshot', shot, url], { stdio: 'ignore' });
    const timer = setTimeout(() => { ff.kill('SIGKILL'); ko(new Error('firefox did not finish')); }, 90_000);
    ff.on('exit', (c) => { clearTimeout(timer); ok(c); });
    ff.on('error', ko);
  });
  rmSync(profile, { recursive: true, force: true });
  assert.equal(code, 0, 'firefox --screenshot succeeded');
  assert.ok(existsSync(shot), 'a screenshot of the page with the widget');

  const [r] = await waitFor(async () => (results.length ? results : null), { what: 'the page to post its results' });
  assert.match(r.agent, /Firefox\//, 'it really was Firefox');
  assert.equal(r.chatMode, 'offline', 'no agent is online');
  assert.deepEqual(r.contact, { client_name: null, email: null, phone: null, description: null });
  assert.deepEqual(r.customData, { result: 'ok' });
  assert.equal(r.unknown.result, 'fail', 'an unknown method is a fail result, not an exception');
  assert.equal(r.jivo, true);
  assert.deepEqual(r.sent, { result: 'ok' });

  const view = await waitFor(async () => {
    for (const c of await ann.chats()) {
      const v = await ann.chat(c.id);
      if (v.messages.some((m) => m.body?.text === 'Hello from Firefox')) return v;
    }
    return null;
  }, { what: 'the Firefox visitor\'s message at the agent' });
  assert.deepEqual(view.visitor.custom_data, [{ title: 'Cart', content: '<b>2 items</b>' }]);
  assert.match(view.visitor.user_agent, /Firefox\//);
});
