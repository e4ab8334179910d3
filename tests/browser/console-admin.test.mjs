// The agent console's administration view, driven as an admin would: sign in,
// open "Administration", create a channel and an agent, assign agents, set a
// password, create and delete a bot, and replay a dead letter. A second
// agent who is no admin sees no administration and gets 403 from the admin
// API with its session cookie. Elements are found by role and name.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { ARTIFACTS, TEST_TIMEOUT, agentClient, startBrowser, startHub, visitor, waitFor } from './harness.mjs';

const ADMIN = { name: 'Ada Admin', email: 'ada@example.com', password: 'ada-correct-horse-1' };

let hub;
let browser;
let integrator;
let ada; // Ada's agent API client (bearer token), to reply in chats

/**
 * The integrator's server: receives agent replies at `POST /<public_id>`.
 * While `failing`, it answers 500 with an `error` object: the hub tries
 * three times, 3 s apart, then the reply is a dead letter with that message.
 */
async function startIntegrator() {
  const got = [];
  const state = { failing: true };
  const srv = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      got.push({ path: req.url, body, failing: state.failing });
      res.writeHead(state.failing ? 500 : 200, { 'Content-Type': 'application/json' });
      res.end(state.failing ? '{"error":{"code":7,"message":"mailbox full"}}' : '{"result":"ok"}');
    });
  });
  await new Promise((ok) => srv.listen(0, '127.0.0.1', ok));
  return {
    base: `http://127.0.0.1:${srv.address().port}`,
    got,
    state,
    stop: () => new Promise((ok) => { srv.closeAllConnections?.(); srv.close(() => ok()); }),
  };
}

before(async () => {
  hub = await startHub();
  integrator = await startIntegrator();
  const a = await hub.admin('POST', '/agents', { name: ADMIN.name, email: ADMIN.email, admin: true });
  await hub.admin('PUT', `/agents/${a.id}/password`, { password: ADMIN.password });
  ada = agentClient(hub.base, a.token);
  browser = await startBrowser();
});

after(async () => {
  await browser?.close();
  await integrator?.stop();
  await hub?.stop();
});

/** A fresh browser context signed in to the console as `email`. */
async function signIn(t, email, password) {
  const v = await visitor(browser);
  t.after(() => v.context.close());
  const { page } = v;
  await page.goto(`${hub.base}/console`);
  await page.getByRole('textbox', { name: 'E-mail', exact: true }).fill(email);
  await page.getByLabel('Password', { exact: true }).fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
  return v;
}

async function openAdmin(page) {
  await page.getByRole('button', { name: 'Administration' }).click();
  await page.getByRole('heading', { name: 'Dead letters' }).waitFor();
  return {
    channels: page.getByRole('region', { name: 'Channels', exact: true }),
    agents: page.getByRole('region', { name: 'Agents', exact: true }),
    bots: page.getByRole('region', { name: 'Bots', exact: true }),
    plugins: page.getByRole('region', { name: 'Plugins', exact: true }),
    dead: page.getByRole('region', { name: 'Dead letters', exact: true }),
  };
}

const status = (region) => region.getByRole('status');

test('an admin manages channels, agents and bots from the console; a non-admin cannot', { timeout: TEST_TIMEOUT }, async (t) => {
  const errors = [];
  const { page } = await signIn(t, ADMIN.email, ADMIN.password);
  page.on('pageerror', (e) => errors.push(e.message));
  const admin = await openAdmin(page);

  // A channel through the form; its endpoint URL is listed.
  const create = admin.channels.getByRole('form', { name: 'New channel' });
  await create.getByLabel('Name', { exact: true }).fill('support');
  await create.getByLabel('Type').selectOption('custom');
  await create.getByLabel('Customer endpoint URL').fill(integrator.base);
  await create.getByLabel('Agents', { exact: true }).fill(ADMIN.email);
  await create.getByRole('button', { name: 'Create channel' }).click();
  await status(admin.channels).filter({ hasText: 'Channel support created.' }).waitFor();
  const { channels } = await hub.admin('GET', '/channels');
  const support = channels.find((c) => c.name === 'support');
  assert.ok(support, 'the channel exists');
  assert.equal(support.customer_endpoint, integrator.base);
  assert.deepEqual(support.agents, [ADMIN.email]);
  await admin.channels.getByText(support.endpoint_url, { exact: true }).waitFor();
  await admin.channels.getByText(support.status_url, { exact: true }).waitFor();

  // An error from the API is shown as its message: the name is taken.
  await create.getByLabel('Name', { exact: true }).fill('support');
  await create.getByLabel('Customer endpoint URL').fill(integrator.base);
  await create.getByRole('button', { name: 'Create channel' }).click();
  await status(admin.channels).filter({ hasText: /support/ }).and(page.locator('.admin-error')).waitFor();

  // An agent with a password (the name is shown as text, not as HTML).
  const newAgent = admin.agents.getByRole('form', { name: 'New agent' });
  await newAgent.getByLabel('Name', { exact: true }).fill('Bea <b>B</b>');
  await newAgent.getByLabel('E-mail', { exact: true }).fill('bea@example.com');
  await newAgent.getByLabel('Password', { exact: true }).fill('bea-first-password');
  await newAgent.getByRole('button', { name: 'Create agent' }).click();
  await admin.agents.getByText('API token of bea@example.com (shown only now):').waitFor();
  await admin.agents.getByRole('cell', { name: 'Bea <b>B</b>', exact: true }).waitFor();
  const bea = (await hub.admin('GET', '/agents')).agents.find((a) => a.email === 'bea@example.com');
  assert.equal(bea.admin, false);

  // Assign Bea to the channel, then change her password.
  const change = admin.channels.getByRole('group', { name: 'Change a channel' });
  await change.getByLabel('Channel', { exact: true }).selectOption({ label: 'support' });
  await change.getByLabel('Agents of the channel').fill(`${ADMIN.email}, bea@example.com`);
  await change.getByRole('button', { name: 'Save agents' }).click();
  await status(admin.channels).filter({ hasText: 'Agents of support saved.' }).waitFor();
  assert.deepEqual(
    (await hub.admin('GET', '/channels')).channels.find((c) => c.name === 'support').agents.sort(),
    [ADMIN.email, 'bea@example.com'],
  );
  const pw = admin.agents.getByRole('form', { name: 'Agent password' });
  await pw.getByLabel('Agent', { exact: true }).selectOption({ label: 'Bea <b>B</b> <bea@example.com>' });
  await pw.getByLabel('New password').fill('bea-second-password');
  await pw.getByRole('button', { name: 'Set password' }).click();
  await status(admin.agents).filter({ hasText: 'Password of bea@example.com set.' }).waitFor();

  // The channel's webhook.
  await change.getByLabel('Webhook URL').fill(`${integrator.base}/hooks`);
  await change.getByLabel('Generate a new secret').check();
  await change.getByRole('button', { name: 'Save webhook' }).click();
  await status(admin.channels).filter({ hasText: 'Webhook of support saved, signed.' }).waitFor();
  await change.getByText('New signing secret (shown once):').waitFor();
  assert.equal((await hub.admin('GET', '/channels')).channels.find((c) => c.name === 'support').webhook_url, `${integrator.base}/hooks`);
  await change.getByLabel('Webhook URL').fill('');
  await change.getByRole('button', { name: 'Save webhook' }).click();
  await status(admin.channels).filter({ hasText: 'Webhook of support saved.' }).waitFor();
  assert.equal((await hub.admin('GET', '/channels')).channels.find((c) => c.name === 'support').webhook_url, null);

  // A provider bot (on a channel that does not exist yet), then deleted after a confirmation.
  const newBot = admin.bots.getByRole('form', { name: 'New provider bot' });
  await newBot.getByLabel('Bot name').fill('Assistant');
  await newBot.getByLabel('Provider endpoint').fill('https://bots.example.com/hub');
  await newBot.getByLabel('Provider token').fill('t0k3n');
  await newBot.getByLabel('Bot channels').fill('website');
  await newBot.getByRole('button', { name: 'Create bot' }).click();
  await status(admin.bots).filter({ hasText: 'Bot Assistant created.' }).waitFor();
  const [bot] = (await hub.admin('GET', '/bots')).bots;
  assert.match(bot.webhooks_url, /\/webhooks\/.+\/t0k3n$/);
  await admin.bots.getByRole('cell', { name: bot.webhooks_url, exact: true }).waitFor();
  await admin.bots.getByRole('button', { name: 'Delete bot Assistant' }).click();
  await admin.bots.getByRole('button', { name: 'Cancel' }).click();
  assert.equal((await hub.admin('GET', '/bots')).bots.length, 1, 'Cancel keeps the bot');
  await admin.bots.getByRole('button', { name: 'Delete bot Assistant' }).click();
  await admin.bots.getByRole('button', { name: /Confirm delete/ }).click();
  await status(admin.bots).filter({ hasText: 'Bot Assistant deleted.' }).waitFor();
  await admin.bots.getByText('No bots.').waitFor();
  assert.equal((await hub.admin('GET', '/bots')).bots.length, 0);

  await admin.plugins.getByText('No plugins loaded.').waitFor();

  // Bea signs in with her new password, in a browser of her own: no administration.
  const beaView = await signIn(t, 'bea@example.com', 'bea-second-password');
  assert.equal(await beaView.page.getByRole('button', { name: 'Administration' }).count(), 0);
  const refused = await beaView.context.request.get(`${hub.base}/admin/v1/channels`);
  assert.equal(refused.status(), 403);
  assert.deepEqual(errors, []);
});

test('a dead letter is listed with its error and replayed from the console', { timeout: TEST_TIMEOUT }, async (t) => {
  // A channel whose integrator refuses replies, a customer message, and Ada's reply.
  let support = (await hub.admin('GET', '/channels')).channels.find((c) => c.name === 'support');
  if (!support) {
    support = await hub.admin('POST', '/channels', { name: 'support', customer_endpoint: integrator.base, agents: [ADMIN.email] });
  }
  integrator.state.failing = true;
  const posted = await fetch(support.endpoint_url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json; charset=utf-8' },
    body: JSON.stringify({ sender: { id: 42, name: 'Bob' }, message: { type: 'text', text: 'Where is my parcel?' } }),
  });
  assert.equal(posted.status, 200);
  const view = await ada.chatWith('Where is my parcel?');
  const { message } = await ada.say(view.chat.id, 'It ships today.');
  const dead = await waitFor(async () => {
    const { deliveries } = await hub.admin('GET', '/deliveries?state=dead');
    return deliveries.find((d) => d.last_error && d.last_error.includes('mailbox full'));
  }, { timeout: 60_000, interval: 250, what: 'the reply to become a dead letter' });

  const { page } = await signIn(t, ADMIN.email, ADMIN.password);
  const admin = await openAdmin(page);
  const row = admin.dead.getByRole('row').filter({ hasText: dead.id });
  await row.waitFor();
  await row.getByText('mailbox full').waitFor();
  await row.getByRole('cell', { name: String(dead.attempts), exact: true }).first().waitFor();

  // The whole administration view in one picture: the view scrolls inside
  // the page, so the window is made as tall as the view.
  const tall = await page.locator('#admin-view').evaluate((el) => el.scrollHeight);
  await page.setViewportSize({ width: 1280, height: Math.min(tall + 60, 4000) });
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, 'console-admin.png') });

  // The integrator is back: replay the one row.
  integrator.state.failing = false;
  await row.getByRole('button', { name: 'Replay', exact: true }).click();
  await status(admin.dead).filter({ hasText: `Replay ${dead.id}: 1 delivery queued again.` }).waitFor();
  await waitFor(async () => (await hub.admin('GET', `/deliveries/${dead.id}`)).state === 'delivered',
    { timeout: 60_000, interval: 250, what: 'the replayed delivery to be delivered' });
  assert.ok(integrator.got.some((g) => !g.failing && g.body.includes('It ships today.')));
  const after = await ada.chat(view.chat.id);
  assert.equal(after.messages.find((m) => m.id === message.id).delivery, 'delivered');

  await page.getByRole('button', { name: 'Refresh' }).click();
  await admin.dead.getByText('No dead letters.').waitFor();

  // "Replay all" with nothing left to replay.
  await admin.dead.getByRole('button', { name: 'Replay all' }).click();
  await status(admin.dead).filter({ hasText: 'Replay all: 0 deliveries queued again.' }).waitFor();
});
