// The agent console (GET /console) driven in chromium as an agent uses it:
// sign in, chats arriving live, accept and reply, delivery states, what a
// chat_accepted webhook reply sends to the side panel, customer HTML shown as
// text, the page title's unread count, sign-in failures and their rate limit,
// CSRF, and signing out. Elements are found by role and name.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { TEST_TIMEOUT, screenshot, startBrowser, waitFor } from './harness.mjs';
import {
  chatButton, group, messageItems, openConsole, signIn, signedIn, startConsoleHub, until,
} from './console-harness.mjs';

let env;
let browser;
let n = 0;

before(async () => {
  env = await startConsoleHub();
  browser = await startBrowser();
});

after(async () => {
  await browser?.close();
  await env?.close();
});

/** A fresh agent on a fresh channel, so every test sees only its own chats. */
async function setUp(t, name = 'Ann Agent') {
  n += 1;
  const agent = await env.agent(name, `agent${n}@example.com`);
  const channel = await env.channel([agent.email]);
  const v = await openConsole(browser, env.hub);
  t.after(() => v.context.close());
  return { agent, channel, ...v };
}

const composer = (page) => page.getByLabel('Message', { exact: true });
const send = (page) => page.getByRole('button', { name: 'Send', exact: true });
const panel = (page) => page.getByRole('region', { name: 'Client' });

test('an agent signs in, a customer message arrives live, the agent accepts and replies, and sees it delivered', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, channel, page, errors } = await setUp(t);
  await signedIn(page, agent);
  assert.equal(await page.title(), 'Hub console');

  // Presence: Go online drives the channel status endpoint.
  await page.getByRole('button', { name: 'Go online' }).click();
  await page.getByRole('button', { name: 'Go offline' }).waitFor();
  assert.equal(await (await fetch(channel.status_url)).text(), '1');

  // A customer writes: the chat shows up in Waiting without a reload.
  await env.say(channel, { id: 'c-1', name: 'Bob Stone', email: 'bob@example.com', phone: '+15550100' }, 'Hello, my order #1234 has not arrived.');
  const item = chatButton(page, 'Bob Stone');
  await group(page, 'Waiting').getByRole('button', { name: /^Bob Stone/ }).waitFor();
  await item.click();
  await messageItems(page, 'Hello, my order #1234 has not arrived.').waitFor();
  await panel(page).getByText('bob@example.com').waitFor();

  // The customer types and writes again: both live.
  await env.post(channel, { id: 'c-1' }, { type: 'typein' });
  await page.getByText('typing…').waitFor();
  await env.say(channel, { id: 'c-1' }, 'Are you there?');
  await messageItems(page, 'Are you there?').waitFor();
  await page.getByText('typing…').waitFor({ state: 'hidden' });

  await page.getByRole('button', { name: 'Accept' }).click();
  await group(page, 'Mine').getByRole('button', { name: /^Bob Stone/ }).waitFor();
  await page.getByRole('button', { name: 'Accept' }).waitFor({ state: 'hidden' });

  // Reply with Enter; Shift+Enter makes a second line.
  await composer(page).click();
  await composer(page).pressSequentially('Sorry to hear that!');
  await composer(page).press('Shift+Enter');
  await composer(page).pressSequentially('Let me check the tracking.');
  await composer(page).press('Enter');
  const text = 'Sorry to hear that!\nLet me check the tracking.';
  await until(env.integrator.replies, (r) => r.body?.message?.text === text, 'the integrator to receive the reply');
  const reply = env.integrator.replies.find((r) => r.body?.message?.text === text);
  assert.equal(reply.path, `/out/${channel.public_id}`);
  assert.equal(String(reply.body.recipient.id), 'c-1');
  assert.equal(reply.body.sender.name, agent.name);
  // While typing, the customer was told (typein), throttled to very few.
  const typeins = env.integrator.replies.filter((r) => r.body?.message?.type === 'typein');
  assert.ok(typeins.length >= 1 && typeins.length <= 3, `typein sent ${typeins.length} times`);
  assert.equal(await composer(page).inputValue(), '');

  const mine = messageItems(page, 'Let me check the tracking.');
  await mine.getByText('delivered', { exact: true }).waitFor();

  // A reload resumes the session and the open chat.
  await page.reload();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
  await messageItems(page, 'Let me check the tracking.').getByText('delivered', { exact: true }).waitFor();
  await page.getByRole('button', { name: 'Go offline' }).click();
  await page.getByRole('button', { name: 'Go online' }).waitFor();
  assert.equal(await (await fetch(channel.status_url)).text(), '0');

  // Closing moves the chat to Closed.
  await page.getByRole('button', { name: 'Close chat' }).click();
  await group(page, 'Closed').getByRole('button', { name: /^Bob Stone/ }).waitFor();
  assert.deepEqual(errors.filter((e) => !/status of 401/.test(e)), [], 'only the first session check (401) fails');
});

test('a failed delivery shows "failed" and the integrator\'s error text, live', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, channel, page } = await setUp(t);
  await signedIn(page, agent);
  await env.say(channel, { id: 'c-fail', name: 'Carol Fail' }, 'Please answer me.');
  await chatButton(page, 'Carol Fail').click();
  await page.getByRole('button', { name: 'Accept' }).click();
  await page.getByRole('button', { name: 'Accept' }).waitFor({ state: 'hidden' });

  env.integrator.fail = { status: 400, body: { error: { code: 12, message: 'user blocked' } } };
  t.after(() => { env.integrator.fail = null; });
  await composer(page).fill('This one will not arrive.');
  await send(page).click();
  const msg = messageItems(page, 'This one will not arrive.');
  await msg.getByText('failed', { exact: true }).waitFor();
  await msg.getByText('user blocked').waitFor();

  env.integrator.fail = null;
  await composer(page).fill('This one will.');
  await composer(page).press('Enter');
  await messageItems(page, 'This one will.').getByText('delivered', { exact: true }).waitFor();
  // The failed one stays failed.
  await msg.getByText('failed', { exact: true }).waitFor();
});

test('custom data from a chat_accepted reply shows in the side panel with its link; CRM link, deals and tasks', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, channel, page, errors } = await setUp(t, 'Ann Smith');
  const pipeline = await agent.api.call('POST', '/crm/pipelines', {
    title: 'Sales', currency: 'EUR', stages: [{ title: 'New lead', color: '#3366FF' }, { title: 'Won', color: '#22AA55', final_status: 'successful' }],
  });
  assert.equal(pipeline.status, 201, JSON.stringify(pipeline.body));
  env.integrator.acceptReply = (ev) => ({
    result: 'ok',
    custom_data: [
      { title: 'Orders', content: '3 open, the last on 12 Nov', link: 'https://crm.example.com/orders?client=42' },
      { key: 'Plan', content: 'Gold <annual> & "VIP"' },
      { title: 'Support ticket', content: '#4821 (waiting for us)', link: 'javascript:alert(1)' },
    ],
    contact_info: { phone: '+15550199' },
    enable_assign: true,
    crm_link: `https://crm.example.com/c/${ev.chat_id}`,
  });
  t.after(() => { env.integrator.acceptReply = null; });

  await signedIn(page, agent);
  await page.getByRole('button', { name: 'Go online' }).click();
  await page.getByRole('button', { name: 'Go offline' }).waitFor();
  await env.post(channel, { id: 'c-data', name: 'Dana Whitfield', email: 'dana@example.com', invite: 'Asked about the Pro plan', url: 'https://shop.example.com/pricing' }, { type: 'text', text: 'Hi! Can I upgrade my plan?' });
  await chatButton(page, 'Dana Whitfield').click();
  await page.getByRole('button', { name: 'Accept' }).click();

  // The webhook reply reaches the panel live.
  const client = panel(page);
  const orders = client.getByRole('link', { name: '3 open, the last on 12 Nov' });
  await orders.waitFor();
  assert.equal(await orders.getAttribute('href'), 'https://crm.example.com/orders?client=42');
  await client.getByText('Orders', { exact: true }).waitFor();
  // Text exactly as the integrator sent it (the hub HTML-escapes it for
  // apps that render HTML; the console shows it as text).
  await client.getByText('Gold <annual> & "VIP"', { exact: true }).waitFor();
  await client.getByText('+15550199').first().waitFor();
  // The javascript: link is no link (the hub drops it; the console would too).
  await client.getByText('#4821 (waiting for us)').waitFor();
  assert.equal(await client.getByRole('link', { name: '#4821' }).count(), 0);
  assert.equal(await client.locator('annual').count(), 0);
  await client.getByText('Asked about the Pro plan').waitFor();

  // The CRM link button fires chat_assigned.
  const popup = page.context().waitForEvent('page');
  await client.getByRole('button', { name: 'Open in CRM' }).click();
  const card = await popup;
  await client.getByText('Linked to the CRM').waitFor();
  await until(env.integrator.events, (e) => e.event_name === 'chat_assigned', 'chat_assigned');
  await card.close().catch(() => {});

  // Quick create: a deal and a task for this client.
  await client.getByText('New deal', { exact: true }).click();
  await client.getByLabel('Deal title', { exact: true }).fill('Pro plan upgrade');
  await client.getByLabel('Amount', { exact: true }).fill('1500');
  await client.getByRole('button', { name: 'Add deal' }).click();
  await client.getByText('Pro plan upgrade').waitFor();
  await client.getByText(/1500 EUR · New lead/).waitFor();
  await client.getByText('New task', { exact: true }).click();
  await client.getByLabel('Task', { exact: true }).fill('Call Dana about the invoice');
  await client.getByRole('button', { name: 'Add task' }).click();
  await client.getByText('Call Dana about the invoice').waitFor();
  const deals = await agent.api.call('GET', `/crm/deals?client_id=${(await agent.api.chats())[0].client_id}`);
  assert.equal(deals.body.deals.length, 1);

  // An attribute, saved through PUT /agent/v1/chats/{id}/attributes.
  await client.getByText('Set an attribute', { exact: true }).click();
  await client.getByLabel('Attribute', { exact: true }).fill('tier');
  await client.getByLabel('Value', { exact: true }).fill('gold');
  await client.getByRole('button', { name: 'Save attribute' }).click();
  await client.getByRole('button', { name: 'Remove attribute tier' }).waitFor();

  // A conversation for the picture.
  await composer(page).fill('Of course! I have prepared the Pro plan for you.');
  await composer(page).press('Enter');
  await messageItems(page, 'I have prepared the Pro plan').getByText('delivered', { exact: true }).waitFor();
  await env.say(channel, { id: 'c-data' }, 'Great, thank you! What does it cost per year?');
  await messageItems(page, 'What does it cost per year?').waitFor();
  await page.mouse.move(0, 0);
  await client.evaluate((el) => el.scrollTo(0, 0));
  await shot(page, 'console-chat');
  assert.deepEqual(errors.filter((e) => !/status of 401/.test(e)), []);
});

test('customer HTML is shown as text: no element is made and no script runs', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, channel, page } = await setUp(t);
  await signedIn(page, agent);
  const name = '<img src=x onerror="window.__pwned=1">Eve';
  await env.say(channel, { id: 'c-html', name }, '<b>x</b>');
  await env.say(channel, { id: 'c-html' }, '<img src=x onerror="window.__pwned=2"><script>window.__pwned=3</script>');
  await chatButton(page, name).click();
  await messageItems(page, '<b>x</b>').waitFor();
  await messageItems(page, '<script>window.__pwned=3</script>').waitFor();
  assert.equal(await page.locator('#messages b, #messages img, #messages script').count(), 0);
  assert.equal(await page.locator('nav img, #chat-title img, #panel img[src="x"]').count(), 0);
  await page.getByRole('heading', { name }).first().waitFor();
  await page.waitForTimeout(300);
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
});

test('media: a customer photo is previewed, a file is a link, and the agent sends media by URL', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, channel, page } = await setUp(t);
  await signedIn(page, agent);
  const photo = `${env.integrator.base}/files/parcel.png`;
  await env.post(channel, { id: 'c-media', name: 'Mia Media' }, { type: 'photo', file: photo, file_name: 'parcel.png', file_size: 2048, text: 'The box arrived like this' });
  await env.post(channel, { id: 'c-media' }, { type: 'document', file: 'https://files.example.com/invoice.pdf', file_name: 'invoice.pdf', file_size: 4096 });
  await env.post(channel, { id: 'c-media' }, { type: 'location', latitude: 52.52, longitude: 13.405, title: 'Home' });
  await chatButton(page, 'Mia Media').click();
  const img = messageItems(page, 'The box arrived like this').getByRole('img', { name: 'parcel.png' });
  await img.waitFor();
  assert.equal(await img.getAttribute('src'), photo);
  assert.equal(await messageItems(page).getByRole('link', { name: 'File: invoice.pdf' }).getAttribute('href'), 'https://files.example.com/invoice.pdf');
  await messageItems(page).getByRole('link', { name: 'Location: Home' }).waitFor();

  await page.getByRole('button', { name: 'Accept' }).click();
  await page.getByRole('button', { name: 'Accept' }).waitFor({ state: 'hidden' });
  await page.getByLabel('Media URL').fill('https://files.example.com/label.jpg');
  await page.getByRole('button', { name: 'Send media' }).click();
  const sent = await until(env.integrator.replies, (r) => r.body?.message?.file === 'https://files.example.com/label.jpg', 'the media reply');
  assert.equal(sent.body.message.type, 'photo');
  assert.equal(sent.body.message.file_name, 'label.jpg');
  await messageItems(page, 'label.jpg').getByText('delivered', { exact: true }).waitFor();
});

test('the page title counts unread client messages; the chat list groups chats', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, channel, page } = await setUp(t, 'Ann Lee');
  await signedIn(page, agent);
  assert.equal(await page.title(), 'Hub console');
  await env.say(channel, { id: 'c-unread', name: 'Uma Unread' }, 'Anyone there?');
  await waitFor(async () => (await page.title()) === '(1) Hub console', { what: 'the title "(1) Hub console"' });
  await chatButton(page, 'Uma Unread').and(page.getByRole('button', { name: 'Uma Unread, 1 unread' })).waitFor();
  await env.say(channel, { id: 'c-unread' }, 'Hello?');
  await waitFor(async () => (await page.title()) === '(2) Hub console', { what: 'the title "(2) Hub console"' });

  // Unread counts survive a reload (they are counted from the history).
  await page.reload();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
  await waitFor(async () => (await page.title()) === '(2) Hub console', { what: 'the title after a reload' });

  // Opening the chat reads it.
  await chatButton(page, 'Uma Unread').click();
  await messageItems(page, 'Hello?').waitFor();
  await waitFor(async () => (await page.title()) === 'Hub console', { what: 'the title without a count' });

  // A fuller list for the picture: waiting, mine, closed.
  const api = agent.api;
  await env.say(channel, { id: 'c-l1', name: 'Maria Garcia' }, 'Is the blue kettle back in stock?');
  await env.say(channel, { id: 'c-l2', name: 'Tom Becker' }, 'I want to change my delivery address.');
  await env.say(channel, { id: 'c-l3', name: 'Olivia Chen' }, 'Thanks, all sorted!');
  await env.say(channel, { id: 'c-l4', name: 'Noah Williams' }, 'Where is my refund?');
  const chats = await waitFor(async () => {
    const all = await api.chats(true);
    return all.length >= 5 ? all : null;
  }, { what: 'five chats' });
  const byName = (nm) => chats.find((c) => c.client_name === nm).id;
  await api.accept(byName('Tom Becker'));
  await api.say(byName('Tom Becker'), 'Sure, what is the new address?');
  await api.accept(byName('Olivia Chen'));
  await api.close(byName('Olivia Chen'));
  await group(page, 'Closed').getByRole('button', { name: /^Olivia Chen/ }).waitFor();
  await group(page, 'Mine').getByRole('button', { name: /^Tom Becker/ }).waitFor();
  await group(page, 'Mine').getByRole('button', { name: /^Uma Unread/ }).waitFor({ state: 'detached' });
  await group(page, 'Waiting').getByRole('button', { name: /^Maria Garcia, 1 unread/ }).waitFor();
  await group(page, 'Waiting').getByRole('button', { name: /^Noah Williams, 1 unread/ }).waitFor();
  await waitFor(async () => (await page.title()) === '(2) Hub console', { what: 'two unread waiting chats' });
  await page.mouse.move(0, 0);
  await shot(page, 'console-chat-list');
});

test('a request with the session cookie but without the CSRF token is refused 403; with it, it works', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, channel, page } = await setUp(t);
  await signedIn(page, agent);
  await env.say(channel, { id: 'c-csrf', name: 'Cy Csrf' }, 'Hi');
  await chatButton(page, 'Cy Csrf').waitFor();
  const chatId = (await agent.api.chats())[0].id;
  const answers = await page.evaluate(async (id) => {
    const without = await fetch(`/agent/v1/chats/${id}/accept`, { method: 'POST', credentials: 'same-origin' });
    const withoutBody = await without.json();
    const read = await fetch('/agent/v1/me', { credentials: 'same-origin' });
    const { csrf_token: token } = await (await fetch('/console/v1/session', { credentials: 'same-origin' })).json();
    const wrong = await fetch(`/agent/v1/chats/${id}/accept`, { method: 'POST', credentials: 'same-origin', headers: { 'X-CSRF-Token': 'not-the-token' } });
    const withToken = await fetch(`/agent/v1/chats/${id}/accept`, { method: 'POST', credentials: 'same-origin', headers: { 'X-CSRF-Token': token } });
    return { without: without.status, withoutBody, read: read.status, wrong: wrong.status, with: withToken.status, state: (await withToken.json()).state };
  }, chatId);
  assert.equal(answers.without, 403);
  assert.equal(answers.withoutBody.error.code, 'forbidden');
  assert.equal(answers.read, 200, 'a GET needs no token');
  assert.equal(answers.wrong, 403);
  assert.equal(answers.with, 200);
  assert.equal(answers.state, 'accepted');
  // The console saw it happen, live.
  await group(page, 'Mine').getByRole('button', { name: /^Cy Csrf/ }).waitFor();
});

test('Sign out returns to the form and the old cookie no longer works', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, page, context } = await setUp(t);
  await signedIn(page, agent);
  const cookie = (await context.cookies()).find((c) => c.name === 'hub_session');
  assert.ok(cookie, 'the session cookie');
  assert.equal(cookie.httpOnly, true);
  assert.equal(cookie.sameSite, 'Strict');
  const headers = { Cookie: `hub_session=${cookie.value}` };
  assert.equal((await fetch(`${env.hub.base}/agent/v1/me`, { headers })).status, 200);

  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByRole('button', { name: 'Sign in' }).waitFor();
  await page.getByLabel('E-mail').waitFor();
  assert.equal(await page.getByRole('button', { name: 'Sign out' }).isVisible(), false);
  assert.equal((await fetch(`${env.hub.base}/agent/v1/me`, { headers })).status, 401);
  assert.equal((await fetch(`${env.hub.base}/console/v1/session`, { headers })).status, 401);
  await page.reload();
  await page.getByRole('button', { name: 'Sign in' }).waitFor();
});

test('a wrong password is refused: the page says "Wrong e-mail or password"', { timeout: TEST_TIMEOUT }, async (t) => {
  const { agent, page } = await setUp(t);
  await signIn(page, agent.email, 'not-the-password');
  await page.getByRole('alert').filter({ hasText: 'Wrong e-mail or password' }).waitFor();
  assert.equal(await page.getByRole('button', { name: 'Sign out' }).isVisible(), false);
  // The right one then works.
  await signedIn(page, agent);
});

test('after 30 failed sign-ins even the right password is refused: "Too many attempts, try again later"', { timeout: TEST_TIMEOUT }, async (t) => {
  // Its own hub: the lock holds for the loopback address, which the other tests use too.
  const own = await startConsoleHub();
  t.after(() => own.close());
  const agent = await own.agent('Rita Locked', 'rita@example.com');
  const v = await openConsole(browser, own.hub);
  t.after(() => v.context.close());
  const statuses = [];
  for (let i = 0; i < 30; i++) {
    const r = await fetch(`${own.hub.base}/console/v1/session`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ email: agent.email, password: `wrong-${i}-password` }),
    });
    statuses.push(r.status);
  }
  assert.equal(statuses[0], 401);
  assert.ok(statuses.every((s) => s === 401 || s === 429), statuses.join(','));
  assert.equal(statuses.at(-1), 429, 'locked after 30 failures');

  // The 31st, through the page.
  await signIn(v.page, agent.email, 'wrong-31-password');
  await v.page.getByRole('alert').filter({ hasText: 'Too many attempts, try again later' }).waitFor();
  // The right password is refused too while the lock lasts.
  await v.page.getByRole('alert').evaluate((el) => { el.textContent = ''; });
  await signIn(v.page, agent.email, agent.password);
  await v.page.getByRole('alert').filter({ hasText: 'Too many attempts, try again later' }).waitFor();
  assert.equal(await v.page.getByRole('button', { name: 'Sign out' }).isVisible(), false);
  const r = await fetch(`${own.hub.base}/console/v1/session`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ email: agent.email, password: agent.password }),
  });
  assert.equal(r.status, 429);
  assert.ok(Number(r.headers.get('retry-after')) > 0, 'Retry-After');
  assert.equal((await r.json()).error.code, 'rate_limited');
});

/** A screenshot under target/browser-artifacts/ (docs/console/ holds copies for the docs). */
function shot(page, name) {
  return screenshot(page, name);
}
