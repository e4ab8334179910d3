// widget_api: every method answers at once (pages use the results inline,
// `if (jivo_api.chatMode() === 'online')`), with the spec's values, and what
// the method does shows in the widget or reaches the hub.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  TEST_TIMEOUT, api, hubAnswer, messages, openPage, startBrowser, startHub, startSite, visitor, w, waitSession,
} from './harness.mjs';

let hub;
let site;
let browser;
let ann;
let bob;
let online; // widget id of a channel whose agent (Ann) is online
let quiet; // widget id of a channel whose only agent (Bob) is offline

before(async () => {
  hub = await startHub();
  ann = await hub.agent('Ann', 'ann@example.com');
  bob = await hub.agent('Bob', 'bob@example.com');
  await ann.online(true);
  online = (await hub.widget({ name: 'shop', color: '#6d4c41', agents: ['ann@example.com'] })).widget.widget_id;
  quiet = (await hub.widget({ name: 'quiet shop', agents: ['bob@example.com'] })).widget.widget_id;
  site = await startSite(hub);
  browser = await startBrowser();
});

after(async () => {
  await browser?.close();
  await site?.stop();
  await hub?.stop();
});

/** A new visitor on a page of `widget`, loaded. */
async function arrive(t, widget = online, path = '') {
  const v = await visitor(browser);
  t.after(() => v.context.close());
  await openPage(v.page, site.url(widget, path));
  await waitSession(v.page);
  return v.page;
}

/** Calls a method whose answer comes through its callback; answers {returned, args}. */
function withCallback(page, method) {
  return page.evaluate((m) => new Promise((resolve) => {
    let returned;
    returned = window.widget_api[m](function () {
      const args = Array.prototype.map.call(arguments, (a) => (a instanceof Error ? { error: a.message } : a));
      // The callback may run before the method returned; wait for both.
      setTimeout(() => resolve({ returned, args }), 0);
    });
  }), method);
}

test('chatMode() is "online" while an agent of the widget is online, "offline" otherwise, and follows the agent live', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.equal(await api(page, 'chatMode'), 'online');
  const other = await arrive(t, quiet);
  assert.equal(await api(other, 'chatMode'), 'offline');

  // No reload: the page learns that Ann went away, and that she is back.
  await ann.online(false);
  try {
    await page.waitForFunction(() => window.widget_api.chatMode() === 'offline', null, { timeout: 30_000 });
    await w(page, 'hub-widget-status').filter({ hasText: 'We are offline' }).waitFor({ state: 'attached' });
  } finally {
    await ann.online(true);
  }
  await page.waitForFunction(() => window.widget_api.chatMode() === 'online', null, { timeout: 30_000 });
});

test('getContactInfo() has the four fields, null while unknown, and what setContactInfo() set, also after a reload', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.deepEqual(await api(page, 'getContactInfo'), { client_name: null, email: null, phone: null, description: null });

  let saved = hubAnswer(page, 'contacts');
  assert.deepEqual(await api(page, 'setContactInfo', { name: 'Eve Visitor', email: 'eve@example.com' }), { result: 'ok' });
  assert.deepEqual(await api(page, 'getContactInfo'), { client_name: 'Eve Visitor', email: 'eve@example.com', phone: null, description: null });
  assert.equal((await saved).status(), 200);
  saved = hubAnswer(page, 'contacts');
  assert.deepEqual(await api(page, 'setContactInfo', { phone: '+49 30 1234567', description: 'Regular' }), { result: 'ok' });
  assert.equal((await saved).status(), 200);

  const bad = await api(page, 'setContactInfo', { email: 'not an address' });
  assert.equal(bad.result, 'fail');
  assert.match(bad.reason, /email/);
  assert.equal((await api(page, 'setContactInfo', 'Eve')).result, 'fail');

  // The hub kept the card: the next page load starts from it.
  await openPage(page, site.url(online, 'shop/beans'));
  assert.deepEqual(await api(page, 'getContactInfo'), { client_name: 'Eve Visitor', email: 'eve@example.com', phone: '+49 30 1234567', description: 'Regular' });
});

test('setCustomData() takes an array of at most 10 fields', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.deepEqual(await api(page, 'setCustomData', [{ title: 'Order', content: '#1234' }, { content: 'Profile', link: 'https://shop.example.com/u/1' }]), { result: 'ok' });
  const ten = Array.from({ length: 10 }, (_, i) => ({ title: `f${i}`, content: String(i) }));
  assert.deepEqual(await api(page, 'setCustomData', ten), { result: 'ok' });

  const notArray = await api(page, 'setCustomData', { title: 'Order', content: '#1234' });
  assert.equal(notArray.result, 'fail');
  assert.equal(typeof notArray.reason, 'string');
  const eleven = await api(page, 'setCustomData', [...ten, { content: 'one too many' }]);
  assert.equal(eleven.result, 'fail');
  assert.match(eleven.reason, /10/);
});

test('setUserToken() echoes the token, or fails with token: false', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.deepEqual(await api(page, 'setUserToken', 'user-42-hard-to-guess'), { result: 'ok', token: 'user-42-hard-to-guess' });
  assert.deepEqual(await api(page, 'setUserToken', ''), { result: 'fail', token: false });
  assert.deepEqual(await api(page, 'setUserToken', 42), { result: 'fail', token: false });
});

test('isCallbackEnabled() and startCall() say "Callback disabled"', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  const check = await withCallback(page, 'isCallbackEnabled');
  assert.deepEqual(check.returned, { result: 'ok' });
  assert.deepEqual(check.args, [{ result: 'fail', reason: 'Callback disabled' }]);
  assert.equal((await api(page, 'isCallbackEnabled')).result, 'fail', 'no callback given');

  assert.deepEqual(await api(page, 'startCall', '+49 30 1234567'), { result: 'fail', reason: 'Callback disabled' });
  const badPhone = await api(page, 'startCall', 'call me');
  assert.equal(badPhone.result, 'fail');
  assert.match(badPhone.reason, /phone/);
});

test('sendOfflineMessage() answers ok, or fail with `error`', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, quiet);
  assert.deepEqual(
    await api(page, 'sendOfflineMessage', { name: 'Eve', email: 'eve@example.com', message: 'Do you ship to Norway?' }),
    { result: 'ok' },
  );
  for (const [form, error] of [
    [{ name: 'Eve', email: 'eve@example.com' }, /message/],
    [{ name: 'Eve', message: 'Hello?' }, /email or phone/],
    [{ email: 'nope', message: 'Hello?' }, /email/],
    ['just text', /object/],
  ]) {
    const r = await api(page, 'sendOfflineMessage', form);
    assert.equal(r.result, 'fail', JSON.stringify(form));
    assert.match(r.error, error);
    assert.equal(r.reason, undefined, 'the offline form fails with `error`, not `reason`');
  }
});

test('getUtm() gives the utm_* parameters of the page URL, null for the missing ones', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, online, 'shop/beans?utm_source=newsletter&utm_medium=email&utm_campaign=spring%20sale');
  assert.deepEqual(await api(page, 'getUtm'), { source: 'newsletter', medium: 'email', campaign: 'spring sale', content: null, term: null });
  const plain = await arrive(t);
  assert.deepEqual(await api(plain, 'getUtm'), { source: null, medium: null, campaign: null, content: null, term: null });
});

test('getUnreadMessagesCount() counts agent messages while the window is closed, like the badge', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.equal(await api(page, 'getUnreadMessagesCount'), 0);
  assert.deepEqual(await api(page, 'sendMessage', 'Is the Ethiopian roast in stock?'), { result: 'ok' });
  const chat = await ann.chatWith('Is the Ethiopian roast in stock?');
  await ann.say(chat.chat.id, 'Yes, 12 bags left.');
  await ann.say(chat.chat.id, 'Shall I reserve one?');

  await w(page, 'hub-widget-unread').filter({ hasText: '2' }).waitFor();
  assert.equal(await api(page, 'getUnreadMessagesCount'), 2);
  assert.deepEqual(await api(page, 'open'), { result: 'ok' });
  assert.equal(await api(page, 'getUnreadMessagesCount'), 0);
  await messages(page, 'Shall I reserve one?').waitFor();
  assert.deepEqual(await api(page, 'close'), { result: 'ok' });
  await w(page, 'hub-widget-unread').waitFor({ state: 'hidden' });
});

test('an unknown method answers a fail result instead of throwing', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  const r = await page.evaluate(() => {
    try {
      return { a: window.widget_api.noSuchMethod(1, 2), b: window.jivo_api.setSomethingNew(), then: typeof window.widget_api.then };
    } catch (e) {
      return { threw: String(e) };
    }
  });
  assert.equal(r.threw, undefined);
  assert.equal(r.a.result, 'fail');
  assert.match(r.a.reason, /noSuchMethod/);
  assert.equal(r.b.result, 'fail');
  assert.equal(r.then, 'undefined', '`await widget_api` must not hang');
});

test('getVisitorNumber() calls back with the visitor number, 1 or more, a new one for a new visitor', { timeout: TEST_TIMEOUT }, async (t) => {
  const first = await withCallback(await arrive(t), 'getVisitorNumber');
  assert.deepEqual(first.returned, { result: 'ok' });
  const [err, n] = first.args;
  assert.equal(err, null);
  assert.ok(Number.isInteger(n) && n >= 1, `visitor number ${n}`);
  const second = await withCallback(await arrive(t), 'getVisitorNumber');
  assert.ok(second.args[1] > n, `the next visitor's number ${second.args[1]} follows ${n}`);
  assert.equal((await api(await arrive(t), 'getVisitorNumber', 'not a function')).result, 'fail');
});

test('setClientAttributes() takes an object, at most 10 times an hour', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.deepEqual(await api(page, 'setClientAttributes', { plan: 'pro', cart_total: 42 }), { result: 'ok' });
  assert.equal((await api(page, 'setClientAttributes', ['pro'])).result, 'fail');
  for (let i = 2; i <= 10; i++) {
    assert.deepEqual(await api(page, 'setClientAttributes', { visit: i }), { result: 'ok' }, `call ${i}`);
  }
  const eleventh = await api(page, 'setClientAttributes', { visit: 11 });
  assert.equal(eleventh.result, 'fail');
  assert.match(eleventh.reason, /10 calls per hour/);
});

test('setWidgetColor() recolours the chat button; the channel colour is the default', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  const button = w(page, 'hub-widget-button');
  const colour = () => button.evaluate((el) => getComputedStyle(el).backgroundColor);
  assert.equal(await colour(), 'rgb(109, 76, 65)', 'the channel colour #6d4c41');
  assert.equal(await page.evaluate(() => window.jivo_config.widget_color), '#6d4c41');

  assert.deepEqual(await api(page, 'setWidgetColor', '#8e24aa'), { result: 'ok' });
  assert.equal(await colour(), 'rgb(142, 36, 170)');
  assert.equal(await page.evaluate(() => window.jivo_config.widget_color), '#8e24aa');
  assert.equal((await api(page, 'setWidgetColor', 'not a colour')).result, 'fail');
  assert.equal(await colour(), 'rgb(142, 36, 170)', 'a refused colour changes nothing');
});

test('sendPageTitle() answers ok for a title, fail for anything else', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.deepEqual(await api(page, 'sendPageTitle', 'Checkout: step 2'), { result: 'ok' });
  assert.deepEqual(await api(page, 'sendPageTitle'), { result: 'ok' }, 'no argument: the document title');
  assert.equal((await api(page, 'sendPageTitle', { title: 'x' })).result, 'fail');
});

test('sendMessage() sends the text as the visitor, or fails on empty text', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.deepEqual(await api(page, 'sendMessage', 'Do you sell decaf?'), { result: 'ok' });
  await api(page, 'open');
  await messages(page, 'Do you sell decaf?').and(page.locator('[data-id]')).waitFor();
  await ann.chatWith('Do you sell decaf?');
  const empty = await api(page, 'sendMessage', '   ');
  assert.equal(empty.result, 'fail');
  assert.equal(typeof empty.reason, 'string');
});

test('clearHistory() empties the visitor\'s chat, also after a reload', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  await api(page, 'sendMessage', 'Please forget this question.');
  await api(page, 'open');
  await messages(page, 'Please forget this question.').and(page.locator('[data-id]')).waitFor();
  const cleared = hubAnswer(page, 'clear');
  assert.deepEqual(await api(page, 'clearHistory'), { result: 'ok' });
  assert.equal(await messages(page).count(), 0);
  assert.equal((await cleared).status(), 200);

  await openPage(page, site.url(online, 'shop/grinders'));
  await api(page, 'open');
  assert.equal(await messages(page).count(), 0, 'still empty after a reload');
});

test('showProactiveInvitation() and setRules() open the window with the invitation', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  assert.deepEqual(await api(page, 'showProactiveInvitation', 'Need help choosing beans?'), { result: 'ok' });
  await w(page, 'hub-widget-window').waitFor();
  await messages(page, 'Need help choosing beans?').waitFor();
  assert.equal((await api(page, 'showProactiveInvitation', '')).result, 'fail');

  const other = await arrive(t, online, 'shop/grinders');
  assert.equal((await api(other, 'setRules', '{not json')).result, 'fail');
  assert.equal((await api(other, 'setRules', 42)).result, 'fail');
  assert.deepEqual(await api(other, 'setRules', [{ type: 'url', pattern: '/shop/grinders', text: 'Burr or blade? We can help.' }]), { result: 'ok' });
  await messages(other, 'Burr or blade? We can help.').waitFor();
});
