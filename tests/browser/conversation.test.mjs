// A visitor and an agent talking: live in both directions, typing, history
// across reloads and pages of the site, two visitors who never see each
// other's chat, and what the page tells the hub reaching the agent's view.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  TEST_TIMEOUT, api, messages, messageText, openPage, startBrowser, startHub, startSite, typeAndSend,
  visitor, w, waitFor,
} from './harness.mjs';

let hub;
let site;
let browser;
let ann;
let widgetId;

before(async () => {
  hub = await startHub();
  ann = await hub.agent('Ann', 'ann@example.com');
  await ann.online(true);
  site = await startSite(hub);
  widgetId = (await hub.widget({ name: 'shop', agents: ['ann@example.com'] })).widget.widget_id;
  browser = await startBrowser();
});

after(async () => {
  await browser?.close();
  await site?.stop();
  await hub?.stop();
});

async function arrive(t, path = '') {
  const v = await visitor(browser);
  t.after(() => v.context.close());
  await openPage(v.page, site.url(widgetId, path));
  return v;
}

/** The texts of the widget's bubbles, in order, as [author, text]. */
function shown(page) {
  return page.locator('#hub-widget').evaluate((host) => Array.from(
    host.shadowRoot.querySelectorAll('[data-testid="hub-widget-message"]'),
    (el) => [el.getAttribute('data-author'), el.querySelector('.bubble').textContent],
  ));
}

test('a visitor and an agent talk live in both directions, with the agent\'s typing shown', { timeout: TEST_TIMEOUT }, async (t) => {
  const { page } = await arrive(t);
  await w(page, 'hub-widget-button').click();
  await w(page, 'hub-widget-status').filter({ hasText: 'We are online' }).waitFor();
  await typeAndSend(page, 'Hello, my order #1234 has not arrived.');

  // The agent sees the visitor's message through the agent API.
  const view = await ann.chatWith('Hello, my order #1234 has not arrived.');
  const chatId = view.chat.id;
  assert.equal(view.chat.state, 'open');

  // The agent types: the visitor sees it, without reloading.
  await ann.typing(chatId);
  await w(page, 'hub-widget-typing').filter({ hasText: /typing/ }).waitFor();

  await ann.say(chatId, 'Sorry to hear that! Let me check the tracking.');
  await messages(page, 'Sorry to hear that! Let me check the tracking.').and(page.locator('[data-author="agent"]')).waitFor();
  await w(page, 'hub-widget-typing').waitFor({ state: 'hidden' });
  await w(page, 'hub-widget-status').filter({ hasText: 'Ann' }).waitFor();

  await typeAndSend(page, 'Thanks, I will wait.');
  await ann.chatUntil(chatId, (v) => v.messages.some((m) => messageText(m) === 'Thanks, I will wait.'), 'the second visitor message');
  await ann.say(chatId, 'It arrives tomorrow.');
  await messages(page, 'It arrives tomorrow.').waitFor();

  assert.deepEqual(await shown(page), [
    ['client', 'Hello, my order #1234 has not arrived.'],
    ['agent', 'Sorry to hear that! Let me check the tracking.'],
    ['client', 'Thanks, I will wait.'],
    ['agent', 'It arrives tomorrow.'],
  ]);
});

test('the conversation is still there after a reload and on another page of the site, and stays live there', { timeout: TEST_TIMEOUT }, async (t) => {
  const { page } = await arrive(t);
  await api(page, 'open');
  await typeAndSend(page, 'Do you have paper filters?');
  const chatId = (await ann.chatWith('Do you have paper filters?')).chat.id;
  await ann.say(chatId, 'Yes, size 2 and 4.');
  await messages(page, 'Yes, size 2 and 4.').waitFor();
  const before = await shown(page);

  await page.reload();
  await api(page, 'open');
  await messages(page, 'Yes, size 2 and 4.').waitFor();
  assert.deepEqual(await shown(page), before);

  // The visitor follows a link to another page of the shop.
  await page.locator('header a', { hasText: 'Grinders' }).click();
  await page.waitForURL(/shop\/grinders/);
  await page.waitForFunction(() => window.__events.some((e) => e.name === 'widget_onLoad'));
  await api(page, 'open');
  await messages(page, 'Yes, size 2 and 4.').waitFor();
  assert.deepEqual(await shown(page), before);

  await ann.say(chatId, 'We also have the grinder you are looking at.');
  await messages(page, 'We also have the grinder you are looking at.').waitFor();
});

test('two visitors are isolated: neither sees the other\'s chat, and a forged token is refused', { timeout: TEST_TIMEOUT }, async (t) => {
  const a = (await arrive(t)).page;
  const b = (await arrive(t)).page;
  await api(a, 'open');
  await api(b, 'open');
  await typeAndSend(a, 'I am visitor A, my address is Elm Street 1.');
  await typeAndSend(b, 'I am visitor B.');
  const chatA = await ann.chatWith('I am visitor A, my address is Elm Street 1.');
  const chatB = await ann.chatWith('I am visitor B.');
  assert.notEqual(chatA.chat.id, chatB.chat.id, 'two visitors, two chats');
  assert.notEqual(chatA.client.id, chatB.client.id, 'two visitors, two clients');

  await ann.say(chatA.chat.id, 'Hello A, your parcel is on its way.');
  await ann.say(chatB.chat.id, 'Hello B.');
  await messages(a, 'Hello A, your parcel is on its way.').waitFor();
  // B's stream is in order: had A's reply leaked, it would be there before B's own.
  await messages(b, 'Hello B.').waitFor();
  assert.deepEqual(await shown(b), [['client', 'I am visitor B.'], ['agent', 'Hello B.']]);
  assert.deepEqual(await shown(a), [['client', 'I am visitor A, my address is Elm Street 1.'], ['agent', 'Hello A, your parcel is on its way.']]);

  // B holds A's visitor key but not the hub's signature: the hub says no.
  const tokenA = await a.evaluate((id) => localStorage.getItem(`hub_widget_token:${id}`), widgetId);
  const tokenB = await b.evaluate((id) => localStorage.getItem(`hub_widget_token:${id}`), widgetId);
  assert.match(tokenA, /^v1\./);
  assert.notEqual(tokenA, tokenB);
  const keyA = tokenA.split('.')[1];
  const macB = tokenB.split('.').pop();
  const answers = await b.evaluate(async ([base, id, forged, own]) => {
    const get = async (token) => {
      const r = await fetch(`${base}/widget/v1/${id}/messages`, { headers: { Authorization: `Bearer ${token}` } });
      return { status: r.status, body: await r.json() };
    };
    return { forged: await get(forged), own: await get(own) };
  }, [hub.base, widgetId, `v1.${keyA}.${macB}`, tokenB]);
  assert.equal(answers.forged.status, 401);
  assert.equal(answers.forged.body.result, 'fail');
  assert.equal(answers.own.status, 200);
  assert.deepEqual(answers.own.body.messages.map((m) => m.text), ['I am visitor B.', 'Hello B.']);
});

test('the contacts form puts the visitor\'s name, e-mail and phone in front of the agent', { timeout: TEST_TIMEOUT }, async (t) => {
  const { page } = await arrive(t);
  await api(page, 'open');
  await typeAndSend(page, 'Can you call me about a bulk order?');
  const chatId = (await ann.chatWith('Can you call me about a bulk order?')).chat.id;

  await w(page, 'hub-contacts-open').click();
  await w(page, 'hub-contacts-form').waitFor();
  // A typo first: the form says what is wrong and stays open.
  await w(page, 'hub-contacts-name').fill('Eve Visitor');
  await w(page, 'hub-contacts-email').fill('eve.example.com');
  await w(page, 'hub-contacts-submit').click();
  await w(page, 'hub-contacts-error').filter({ hasText: /email/ }).waitFor();
  await w(page, 'hub-contacts-email').fill('eve@example.com');
  await w(page, 'hub-contacts-phone').fill('+49 30 1234567');
  await w(page, 'hub-contacts-submit').click();
  await w(page, 'hub-contacts-form').waitFor({ state: 'hidden' });

  const view = await ann.chatUntil(chatId, (v) => v.client.email === 'eve@example.com', 'the contact details in the agent\'s view');
  assert.equal(view.client.name, 'Eve Visitor');
  assert.equal(view.client.phone, '+49 30 1234567');
});

test('custom data from the page reaches the agent\'s view as plain text', { timeout: TEST_TIMEOUT }, async (t) => {
  const { page } = await arrive(t);
  await api(page, 'sendMessage', 'Where is my order?');
  const chatId = (await ann.chatWith('Where is my order?')).chat.id;
  const fields = [
    { title: 'Order', content: '<b>#1234</b>' },
    { title: 'Profile', content: 'Eve', link: 'https://shop.example.com/users/7' },
    { key: 'Plan', content: '<script>alert(1)</script>' },
  ];
  assert.deepEqual(await api(page, 'setCustomData', fields), { result: 'ok' });
  const view = await ann.chatUntil(chatId, (v) => Array.isArray(v.visitor?.custom_data), 'custom data in the agent\'s view');
  assert.deepEqual(view.visitor.custom_data.map((f) => f.content), ['<b>#1234</b>', 'Eve', '<script>alert(1)</script>']);
  assert.equal(view.visitor.custom_data[0].title, 'Order');
  assert.equal(view.visitor.custom_data[1].link, 'https://shop.example.com/users/7');
});

test('the agent sees the visitor\'s page, title, referrer, utm, user agent and visits', { timeout: TEST_TIMEOUT }, async (t) => {
  const { page } = await arrive(t, '?utm_source=newsletter&utm_medium=email&utm_campaign=spring');
  const landing = page.url();
  // The visitor follows a link, then writes from the second page.
  await page.locator('header a', { hasText: 'Beans' }).click();
  await page.waitForURL(/shop\/beans/);
  await page.waitForFunction(() => window.__events.some((e) => e.name === 'widget_onLoad'));
  await api(page, 'sendMessage', 'Are the beans fresh?');
  const view = await ann.chatWith('Are the beans fresh?');
  const v = view.visitor;
  assert.equal(v.page.url, site.url(widgetId, 'shop/beans'));
  assert.equal(v.page.title, 'Coffee Corner: shop/beans');
  assert.equal(v.referrer, landing);
  assert.match(v.user_agent, /Chrome/);
  assert.equal(v.ip, '127.0.0.1');
  assert.equal(v.visits_count, 1, 'two pages, one visit');
  assert.equal(view.client.visitor_number > 0, true);
  assert.equal(v.utm_json?.source, 'newsletter', `utm_json of the visit: ${JSON.stringify(v.utm_json)}`);
  assert.equal(v.utm_json?.campaign, 'spring');

  assert.deepEqual(await api(page, 'sendPageTitle', 'Checkout: step 2'), { result: 'ok' });
  await ann.chatUntil(view.chat.id, (c) => c.visitor.page.title === 'Checkout: step 2', 'the title sent by sendPageTitle');
});

// A visit is a run of page loads less than 30 minutes apart, as the widget's
// `visits` rule counts them.
test('pages viewed one after the other count as one visit', { timeout: TEST_TIMEOUT }, async (t) => {
  const { page } = await arrive(t);
  await openPage(page, site.url(widgetId, 'shop/beans'));
  await openPage(page, site.url(widgetId, 'shop/grinders'));
  await api(page, 'sendMessage', 'Three pages, one visit.');
  const view = await ann.chatWith('Three pages, one visit.');
  assert.equal(view.visitor.visits_count, 1);
});

test('untrusted text is shown as text: an agent\'s HTML creates no element and runs nothing', { timeout: TEST_TIMEOUT }, async (t) => {
  const { page } = await arrive(t);
  await api(page, 'open');
  await typeAndSend(page, '<b>not bold</b>');
  const chatId = (await ann.chatWith('<b>not bold</b>')).chat.id;
  const evil = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>';
  await ann.say(chatId, evil);
  await ann.say(chatId, 'Details: https://shop.example.com/help and javascript:alert(1)');
  await messages(page, 'Details:').waitFor();

  assert.deepEqual(await shown(page), [
    ['client', '<b>not bold</b>'],
    ['agent', evil],
    ['agent', 'Details: https://shop.example.com/help and javascript:alert(1)'],
  ]);
  const root = page.locator('#hub-widget');
  assert.equal(await root.locator('img').count(), 0);
  assert.equal(await root.locator('.bubble script, .bubble b').count(), 0);
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  // Only the http(s) URL became a link.
  const links = await root.locator('.bubble a').evaluateAll((as) => as.map((a) => [a.getAttribute('href'), a.getAttribute('rel')]));
  assert.deepEqual(links, [['https://shop.example.com/help', 'noopener noreferrer nofollow']]);

  // And the hub kept it as the agent wrote it (text, not sanitised away).
  await waitFor(async () => {
    const view = await ann.chat(chatId);
    return view.messages.some((m) => messageText(m) === evil);
  }, { what: 'the agent message stored as written' });
});

test('allowed_origins: the widget chats on the listed sites only', { timeout: TEST_TIMEOUT }, async (t) => {
  const ours = (await hub.widget({ name: 'listed', agents: ['ann@example.com'], allowed_origins: [site.origin] })).widget.widget_id;
  const theirs = (await hub.widget({ name: 'elsewhere', agents: ['ann@example.com'], allowed_origins: ['https://shop.example.com'] })).widget.widget_id;

  const v = await visitor(browser);
  t.after(() => v.context.close());
  const page = v.page;
  await openPage(page, site.url(ours));
  await api(page, 'open');
  await typeAndSend(page, 'Hello from a listed site.');
  await ann.chatWith('Hello from a listed site.');

  // Another site pasted the tag: the script loads, but the hub refuses its
  // calls, and the widget says so instead of retrying for ever.
  await openPage(page, site.url(theirs));
  await api(page, 'open');
  await w(page, 'hub-widget-status').filter({ hasText: 'not available on this site' }).waitFor();
  const refused = await api(page, 'sendMessage', 'Hello from an unlisted site.');
  assert.equal(refused.result, 'fail');
  const direct = await fetch(`${hub.base}/widget/v1/${theirs}/session`, {
    method: 'POST',
    headers: { Origin: site.origin, 'Content-Type': 'application/json' },
    body: '{}',
  });
  assert.equal(direct.status, 403);
  assert.equal((await direct.json()).result, 'fail');
});

test('a visitor flooding the chat is slowed down: the widget shows which messages were not sent', { timeout: TEST_TIMEOUT }, async (t) => {
  const { page } = await arrive(t);
  await api(page, 'open');
  const results = await page.evaluate(() => Array.from({ length: 30 }, (_, i) => window.widget_api.sendMessage(`flood ${i + 1}`).result));
  assert.deepEqual(new Set(results), new Set(['ok']), 'each call is accepted at once; the hub decides later');
  // Every message has its answer: sent, or refused by the hub.
  await page.waitForFunction(() => {
    const list = document.getElementById('hub-widget').shadowRoot.querySelectorAll('[data-testid="hub-widget-message"]');
    return list.length === 30 && Array.from(list).every((m) => m.getAttribute('data-local') !== 'pending');
  }, null, { timeout: 60_000 });
  const failed = page.locator('#hub-widget [data-local="failed"]');
  assert.ok(await failed.count() >= 1, 'some messages were refused');
  assert.match(await failed.first().textContent(), /Not sent: too many messages/);
  const sent = await page.locator('#hub-widget [data-testid="hub-widget-message"][data-id]').count();
  assert.ok(sent >= 20, `${sent} messages went through`);
  const chat = await ann.chatWith('flood 1');
  assert.equal(chat.messages.filter((m) => /^flood /.test(messageText(m) ?? '')).length, sent);
});
