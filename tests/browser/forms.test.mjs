// The widget's forms as a visitor fills them in: the offline form when no
// agent is online, and the callback form (on a widget without calls it says
// why it cannot call; with calls, the request reaches the agent, who calls
// back); and what the page sets reaching the site's webhooks.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  TEST_TIMEOUT, api, events, hubAnswer, messageText, messages, openPage, screenshot, startBrowser, startHub, startSite, visitor,
  w, waitFor, waitLoaded,
} from './harness.mjs';

let hub;
let site;
let browser;
let ann;
let bob;
let online;
let quiet;
let calling;

before(async () => {
  hub = await startHub();
  site = await startSite(hub);
  ann = await hub.agent('Ann', 'ann@example.com');
  await ann.online(true);
  bob = await hub.agent('Bob', 'bob@example.com');
  online = (await hub.widget({ name: 'shop', agents: ['ann@example.com'], webhook_url: `${site.base}/hook` })).widget.widget_id;
  // Bob never comes online; the shop's webhooks go to its own site.
  quiet = (await hub.widget({ name: 'night shop', agents: ['bob@example.com'], webhook_url: `${site.base}/hook` })).widget.widget_id;
  calling = (await hub.widget({ name: 'call shop', agents: ['ann@example.com'], calls: { enabled: true } })).widget.widget_id;
  browser = await startBrowser();
});

after(async () => {
  await browser?.close();
  await site?.stop();
  await hub?.stop();
});

async function arrive(t, widget, path = '') {
  const v = await visitor(browser);
  t.after(() => v.context.close());
  await openPage(v.page, site.url(widget, path));
  return v.page;
}

test('with no agent online the widget offers the offline form, and the message left there reaches the hub', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, quiet);
  await w(page, 'hub-widget-button').click();
  await w(page, 'hub-offline-form').waitFor();
  await w(page, 'hub-widget-input').waitFor({ state: 'hidden' });
  await w(page, 'hub-widget-status').filter({ hasText: 'We are offline' }).waitFor();

  // Incomplete forms are refused with the reason, and nothing is sent.
  await w(page, 'hub-offline-submit').click();
  await w(page, 'hub-offline-error').filter({ hasText: 'message is required' }).waitFor();
  await w(page, 'hub-offline-message').fill('Do you roast decaf beans? Please write back.');
  await w(page, 'hub-offline-submit').click();
  await w(page, 'hub-offline-error').filter({ hasText: 'email or phone is required' }).waitFor();

  await w(page, 'hub-offline-name').fill('Eve Visitor');
  await w(page, 'hub-offline-email').fill('eve@example.com');
  await w(page, 'hub-offline-submit').click();
  await w(page, 'hub-offline-done').filter({ hasText: 'Thank you' }).waitFor();
  await w(page, 'hub-offline-error').waitFor({ state: 'hidden' });
  assert.equal(await w(page, 'hub-offline-message').inputValue(), '', 'the form is ready for another message');
  // The window keeps the visitor's message, once, also after a reload.
  const left = messages(page, 'Do you roast decaf beans? Please write back.').and(page.locator('[data-author="client"]'));
  await left.waitFor();
  assert.equal(await left.count(), 1);
  await screenshot(page, 'widget-offline-sent');
  await page.reload();
  await waitLoaded(page);
  await left.waitFor({ state: 'attached' });
  assert.equal(await left.count(), 1);

  // The site's webhook receiver gets offline_message ...
  const hook = await waitFor(
    () => site.hooks.find((h) => h.event_name === 'offline_message'),
    { what: 'the offline_message webhook' },
  );
  assert.equal(hook.message, 'Do you roast decaf beans? Please write back.');
  assert.equal(hook.widget_id, quiet);
  assert.equal(hook.visitor.email, 'eve@example.com');
  assert.equal(hook.visitor.name, 'Eve Visitor');
  // ... and Bob finds it among his chats when he comes back.
  const view = await bob.chatWith('Do you roast decaf beans? Please write back.', { all: true });
  assert.equal(view.chat.state, 'closed');
  assert.equal(view.client.email, 'eve@example.com');
  assert.ok(view.messages.some((m) => messageText(m) === 'Do you roast decaf beans? Please write back.'));
});

test('the callback form asks for a phone number and says that calls are disabled', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, online);
  assert.deepEqual(await api(page, 'open', { start: 'call' }), { result: 'ok' });
  await w(page, 'hub-callback-form').waitFor();
  await w(page, 'hub-callback-phone').waitFor();
  await w(page, 'hub-callback-status').filter({ hasText: 'Callback disabled' }).waitFor();

  await w(page, 'hub-callback-phone').fill('call me maybe');
  await w(page, 'hub-callback-submit').click();
  await w(page, 'hub-callback-error').filter({ hasText: 'invalid phone number' }).waitFor();

  await w(page, 'hub-callback-phone').fill('+49 30 1234567');
  await w(page, 'hub-callback-submit').click();
  await w(page, 'hub-callback-error').filter({ hasText: 'Callback disabled' }).waitFor();
  assert.equal((await events(page, 'widget_onCallStart')).length, 0, 'no call started');

  // Back to the chat, which still works.
  await w(page, 'hub-callback-cancel').click();
  await w(page, 'hub-widget-input').waitFor();
  assert.deepEqual((await events(page, 'widget_onChangeState')).map((e) => e.args[0]), ['chat/call', 'chat']);
});

test('the page\'s user token and contact details reach the site\'s webhooks', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, online);
  const stored = hubAnswer(page, 'user-token');
  assert.deepEqual(await api(page, 'setUserToken', 'user-42-hard-to-guess'), { result: 'ok', token: 'user-42-hard-to-guess' });
  assert.equal((await stored).status(), 200);
  await api(page, 'open');
  await w(page, 'hub-widget-input').fill('Hello, I am logged in.');
  await w(page, 'hub-widget-input').press('Enter');
  const chat = await ann.chatWith('Hello, I am logged in.');
  await ann.accept(chat.chat.id);
  const accepted = await waitFor(
    () => site.hooks.find((h) => h.event_name === 'chat_accepted' && h.chat_id === chat.chat.id),
    { what: 'the chat_accepted webhook' },
  );
  assert.equal(accepted.user_token, 'user-42-hard-to-guess');

  assert.deepEqual(await api(page, 'setContactInfo', { name: 'Eve Visitor', email: 'eve@example.com' }), { result: 'ok' });
  const updated = await waitFor(
    () => site.hooks.find((h) => h.event_name === 'chat_updated' && h.chat_id === chat.chat.id && h.visitor?.email === 'eve@example.com'),
    { what: 'chat_updated with the contact details' },
  );
  assert.equal(updated.visitor.name, 'Eve Visitor');
  assert.equal(updated.user_token, 'user-42-hard-to-guess');
});

test('the user token the page sets reaches the webhooks of the calls right after it: offline message, contact details', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, quiet);
  // All in one go, as a page does on load: nothing waits for the hub.
  const answers = await page.evaluate(() => [
    window.widget_api.setUserToken('user-7-hard-to-guess'),
    window.widget_api.sendOfflineMessage({ name: 'Uma', email: 'uma@example.com', message: 'Do you ship beans abroad?' }),
    window.widget_api.setContactInfo({ phone: '+49 30 7654321' }),
  ]);
  assert.deepEqual(answers, [{ result: 'ok', token: 'user-7-hard-to-guess' }, { result: 'ok' }, { result: 'ok' }]);
  const offline = await waitFor(
    () => site.hooks.find((h) => h.event_name === 'offline_message' && h.message === 'Do you ship beans abroad?'),
    { what: 'the offline_message webhook' },
  );
  assert.equal(offline.user_token, 'user-7-hard-to-guess');
  assert.equal(offline.visitor.email, 'uma@example.com');
  assert.equal(offline.page.url, site.url(quiet), 'the page the visitor is on');
  const number = await page.evaluate(() => new Promise((ok) => window.widget_api.getVisitorNumber((e, n) => ok(n))));
  assert.equal(offline.visitor.number, String(number), 'the visitor of this page');
  const updated = await waitFor(
    () => site.hooks.find((h) => h.event_name === 'client_updated' && h.visitor?.phone === '+49 30 7654321'),
    { what: 'client_updated with the phone number' },
  );
  assert.equal(updated.user_token, 'user-7-hard-to-guess');
});

test('with calls on, the visitor asks for a callback, the agent calls back, and the page follows the call', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, calling);
  const enabled = await page.evaluate(() => new Promise((resolve) => window.widget_api.isCallbackEnabled(resolve)));
  assert.deepEqual(enabled, { result: 'ok' });
  await api(page, 'open', { start: 'call' });
  await w(page, 'hub-callback-phone').fill('+49 30 1234567');
  await w(page, 'hub-callback-submit').click();
  await waitFor(async () => (await events(page, 'widget_onCallStart')).length === 1, { what: 'widget_onCallStart' });

  // The request waits in a chat of its own, with the number to call.
  const view = await waitFor(async () => {
    for (const c of await ann.chats()) {
      const v = await ann.chat(c.id);
      if (v.calls?.some((call) => call.phone === '+49 30 1234567')) return v;
    }
    return null;
  }, { what: 'the callback request in the agent\'s chats' });
  const call = view.calls.find((c) => c.phone === '+49 30 1234567');
  assert.equal(call.type, 'callback');
  assert.equal(call.agent_id, null, 'nobody has taken it yet');

  const ended = await ann.call('PUT', `/calls/${call.id}`, { status: 'end' });
  assert.equal(ended.status, 200, JSON.stringify(ended.body));
  await waitFor(async () => (await events(page, 'widget_onCallEnd')).length === 1, { what: 'widget_onCallEnd' });
  const [end] = await events(page, 'widget_onCallEnd');
  assert.equal(end.args[0].result, 'ok');
});
