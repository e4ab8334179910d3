// Pictures of the widget on a customer's page, saved on every run under
// target/browser-artifacts/ (closed.png, open.png, offline.png) so a reviewer
// or CI can look at what visitors see; docs/widget.md shows copies of them.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import {
  TEST_TIMEOUT, api, messages, openPage, screenshot, startBrowser, startHub, startSite, typeAndSend, visitor, w,
} from './harness.mjs';

let hub;
let site;
let browser;
let ann;
let online;
let quiet;

before(async () => {
  hub = await startHub();
  ann = await hub.agent('Ann', 'ann@example.com');
  await ann.online(true);
  await hub.agent('Bob', 'bob@example.com');
  online = (await hub.widget({ name: 'shop', color: '#6d4c41', agents: ['ann@example.com'] })).widget.widget_id;
  quiet = (await hub.widget({ name: 'night shop', color: '#6d4c41', agents: ['bob@example.com'] })).widget.widget_id;
  site = await startSite(hub);
  browser = await startBrowser();
});

after(async () => {
  await browser?.close();
  await site?.stop();
  await hub?.stop();
});

/** The width and height of a PNG file, from its IHDR chunk. */
function pngSize(path) {
  const b = readFileSync(path);
  assert.equal(b.subarray(1, 4).toString(), 'PNG', `${path} is a PNG`);
  return [b.readUInt32BE(16), b.readUInt32BE(20)];
}

async function arrive(t, widget) {
  const v = await visitor(browser);
  t.after(() => v.context.close());
  await openPage(v.page, site.url(widget));
  return v.page;
}

test('screenshot: the widget closed (the chat button)', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, online);
  await w(page, 'hub-widget-button').waitFor();
  assert.deepEqual(pngSize(await screenshot(page, 'closed')), [900, 700]);
});

test('screenshot: the widget open, with a conversation', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, online);
  await w(page, 'hub-widget-button').click();
  await typeAndSend(page, 'Hi! Which beans would you recommend for a French press?');
  const chatId = (await ann.chatWith('Hi! Which beans would you recommend for a French press?')).chat.id;
  await ann.say(chatId, 'Hello! Our Sumatra dark roast, ground coarse. Details: https://shop.example.com/beans/sumatra');
  await messages(page, 'Sumatra dark roast').waitFor();
  await typeAndSend(page, 'Great, thanks. Do you ship to Vienna?');
  await ann.chatUntil(chatId, (v) => v.messages.length >= 3, 'the second question');
  await ann.say(chatId, 'Yes, in two to three working days.');
  await messages(page, 'two to three working days').waitFor();
  await ann.typing(chatId);
  await w(page, 'hub-widget-typing').waitFor();
  await w(page, 'hub-widget-status').filter({ hasText: 'Ann' }).waitFor();
  assert.deepEqual(pngSize(await screenshot(page, 'open')), [900, 700]);
});

test('screenshot: the widget offline (the offline form)', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t, quiet);
  await api(page, 'open');
  await w(page, 'hub-offline-form').waitFor();
  await w(page, 'hub-offline-name').fill('Eve');
  await w(page, 'hub-offline-email').fill('eve@example.com');
  await w(page, 'hub-offline-message').fill('Do you roast decaf beans?');
  assert.deepEqual(pngSize(await screenshot(page, 'offline')), [900, 700]);
});
