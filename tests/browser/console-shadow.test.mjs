// A shadow plugin in the console's administration view: the hub runs
// `redact` live (e-mail masking off) and `redact-v2` (masking on) as its
// shadow; customer messages pass, and the admin sees the one that differs,
// live and shadow side by side, while the stored message stays as live left it.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { ARTIFACTS, ROOT, TEST_TIMEOUT, startBrowser, startHub, visitor, waitFor } from './harness.mjs';

const ADMIN = { name: 'Ada Admin', email: 'ada@example.com', password: 'ada-correct-horse-1' };
const REDACT = join(ROOT, 'target', 'plugins', 'wasm32-wasip2', 'release', 'redact.wasm');

let hub;
let browser;
let integrator;

before(async () => {
  hub = await startHub([
    '[[plugins]]', 'name = "redact"', `path = "${REDACT}"`, 'timeout_ms = 5000', 'config = { emails = false }', '',
    '[[plugins]]', 'name = "redact-v2"', `path = "${REDACT}"`, 'timeout_ms = 5000', 'shadows = "redact"',
    'config = { emails = true }', '',
    '[[routes]]', 'events = ["channel.customer_message"]', 'plugins = ["redact"]', 'shadow = ["redact-v2"]', '',
  ].join('\n'));
  integrator = createServer((req, res) => { req.resume(); req.on('end', () => res.end('{"result":"ok"}')); });
  await new Promise((ok) => integrator.listen(0, '127.0.0.1', ok));
  const a = await hub.admin('POST', '/agents', { name: ADMIN.name, email: ADMIN.email, admin: true });
  await hub.admin('PUT', `/agents/${a.id}/password`, { password: ADMIN.password });
  browser = await startBrowser();
});

after(async () => {
  await browser?.close();
  await new Promise((ok) => (integrator ? integrator.close(() => ok()) : ok()));
  await hub?.stop();
});

test('the differences of a shadow plugin are shown in the administration view', { timeout: TEST_TIMEOUT }, async () => {
  const channel = await hub.admin('POST', '/channels', {
    name: 'shop', customer_endpoint: `http://127.0.0.1:${integrator.address().port}`,
  });
  const say = async (text) => {
    const r = await fetch(channel.endpoint_url, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ sender: { id: 'c1' }, message: { type: 'text', text } }),
    });
    assert.equal(r.status, 200, await r.text());
  };
  await say('hello, my order is late');
  await say('<b>write</b> to bob@example.org please');
  await waitFor(async () => {
    const s = await hub.admin('GET', '/plugins/redact-v2/shadow');
    return s.counts.changed === 1 && s.counts.same === 1;
  }, { what: 'the shadow compared both messages' });

  const v = await visitor(browser);
  const { page } = v;
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${hub.base}/console`);
  await page.getByRole('textbox', { name: 'E-mail', exact: true }).fill(ADMIN.email);
  await page.getByLabel('Password', { exact: true }).fill(ADMIN.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('button', { name: 'Administration' }).click();
  await page.getByRole('heading', { name: 'Shadow redact-v2' }).waitFor();
  const plugins = page.getByRole('region', { name: 'Plugins', exact: true });
  await plugins.getByRole('table', { name: 'Routes' }).getByRole('cell', { name: 'redact-v2', exact: true }).waitFor();
  const diffs = page.getByRole('table', { name: 'Recent differences of shadow redact-v2' });
  await diffs.waitFor();
  const rows = diffs.locator('tbody tr');
  assert.equal(await rows.count(), 1, 'only the message that differs');
  const cells = rows.first().locator('td');
  assert.equal(await cells.nth(2).textContent(), 'changed');
  // Side by side: live kept the address, the shadow masked it; the markup
  // in the message is shown as text.
  assert.match(await cells.nth(3).textContent(), /<b>write<\/b> to bob@example\.org please/);
  assert.match(await cells.nth(4).textContent(), /<b>write<\/b> to \[email\] please/);
  assert.equal(await diffs.locator('b').count(), 0, 'no markup from a message is rendered');
  await page.getByText(/Compared with live: same 1, changed 1/).waitFor();
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.getByRole('heading', { name: 'Shadow redact-v2' }).scrollIntoViewIfNeeded();
  await page.screenshot({ path: join(ARTIFACTS, 'console-shadow.png'), fullPage: true });
  assert.deepEqual(errors, []);
  await v.context.close();
});
