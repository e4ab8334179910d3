// An open widget whose live stream breaks: the hub restarts (same address,
// same database), or the visitor's connection drops. What the agent answers
// while the page is away shows up once it is back: each reply exactly once,
// in order, and widget_onMessageReceived once per reply.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  TEST_TIMEOUT, events, messages, openPage, screenshot, startBrowser, startHub, startRelay, startSite,
  typeAndSend, visitor, w, waitFor,
} from './harness.mjs';

let hub;
let browser;
let ann;
let widgetId;

before(async () => {
  hub = await startHub();
  ann = await hub.agent('Ann', 'ann@example.com');
  await ann.online(true);
  widgetId = (await hub.widget({ name: 'shop', agents: ['ann@example.com'] })).widget.widget_id;
  browser = await startBrowser();
});

after(async () => {
  await browser?.close();
  await hub?.stop();
});

/** The widget's bubbles, in order, as [author, text]. */
function shown(page) {
  return page.locator('#hub-widget').evaluate((host) => Array.from(
    host.shadowRoot.querySelectorAll('[data-testid="hub-widget-message"]'),
    (el) => [el.getAttribute('data-author'), el.querySelector('.bubble').textContent],
  ));
}

/** The texts widget_onMessageReceived was called with, in order. */
async function received(page) {
  return (await events(page, 'widget_onMessageReceived')).map((e) => e.args[0].text);
}

/**
 * A visitor on `site` who asked `question` and got Ann's first answer live;
 * answers the page and the chat's id once the hub holds no other stream.
 */
async function talking(t, site, question, answer) {
  const v = await visitor(browser);
  t.after(() => v.context.close());
  await openPage(v.page, site.url(widgetId));
  await w(v.page, 'hub-widget-button').click();
  await typeAndSend(v.page, question);
  const chatId = (await ann.chatWith(question)).chat.id;
  await ann.say(chatId, answer);
  await messages(v.page, answer).waitFor();
  // Earlier tests' pages are closed: this page's stream is the only one.
  await waitFor(async () => (await hub.widgetStreams()) === 1, { what: 'one visitor stream open' });
  return { page: v.page, chatId };
}

test('replies sent while the hub restarts reach the open page once each, in order', { timeout: TEST_TIMEOUT }, async (t) => {
  const site = await startSite(hub);
  t.after(() => site.stop());
  const { page, chatId } = await talking(t, site, 'Is my order on its way?', 'Let me look it up.');
  const expected = [['client', 'Is my order on its way?'], ['agent', 'Let me look it up.']];

  // Ann answers as soon as the hub is back. The page's browser reconnects
  // a few seconds later; should it be quicker once, the next round has the
  // gap the test is about.
  let gaps = 0;
  for (let round = 1; round <= 3 && gaps === 0; round++) {
    await hub.restart();
    const before = await hub.widgetStreams();
    const replies = [`It left the depot (${round}).`, `It arrives tomorrow (${round}).`];
    for (const text of replies) {
      await ann.say(chatId, text);
      expected.push(['agent', text]);
    }
    if (before === 0 && (await hub.widgetStreams()) === 0) gaps++;
    await messages(page, replies[1]).waitFor();
  }
  assert.equal(gaps, 1, 'replies went out while the page was not connected');

  // The stream is live again.
  await ann.say(chatId, 'Anything else I can do?');
  expected.push(['agent', 'Anything else I can do?']);
  await messages(page, 'Anything else I can do?').waitFor();
  assert.deepEqual(await shown(page), expected);
  assert.deepEqual(await received(page), expected.filter(([who]) => who === 'agent').map(([, text]) => text));
  await w(page, 'hub-widget-status').filter({ hasText: 'Ann' }).waitFor();
  await screenshot(page, 'widget-after-restart');
});

test('replies sent while the visitor\'s connection is down reach the page once each, in order, when it is back', { timeout: TEST_TIMEOUT }, async (t) => {
  // The page reaches the hub only through the relay: the visitor's network.
  const relay = await startRelay(hub.port);
  t.after(() => relay.stop());
  const site = await startSite({ port: relay.port });
  t.after(() => site.stop());
  const { page, chatId } = await talking(t, site, 'Do you roast decaf?', 'Yes, every Monday.');

  relay.cut();
  await waitFor(async () => (await hub.widgetStreams()) === 0, { what: 'the hub to see the page gone' });
  const replies = ['Colombian and Ethiopian.', 'Both in 250 g bags.', 'Shall I reserve one?'];
  for (const text of replies) await ann.say(chatId, text);
  // Still cut off: the page has none of them.
  await new Promise((ok) => setTimeout(ok, 1000));
  assert.equal(await messages(page, 'Colombian and Ethiopian.').count(), 0);
  await screenshot(page, 'widget-connection-lost');

  // Besides the stream's own catch-up, the widget reads its messages again
  // once reconnected.
  const resync = page.waitForRequest((r) => r.method() === 'GET' && new URL(r.url()).pathname.endsWith('/messages'));
  relay.restore();
  await messages(page, 'Shall I reserve one?').waitFor();
  await resync;
  await ann.say(chatId, 'Reserved for you.');
  await messages(page, 'Reserved for you.').waitFor();
  const agent = ['Yes, every Monday.', ...replies, 'Reserved for you.'];
  assert.deepEqual(await shown(page), [['client', 'Do you roast decaf?'], ...agent.map((text) => ['agent', text])]);
  assert.deepEqual(await received(page), agent);
  await screenshot(page, 'widget-connection-back');
});
