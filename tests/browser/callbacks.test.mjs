// The page's callbacks fire at the moments a visitor would notice, once per
// real change, and pages written for the public service (jivo_* names,
// window.jivo_api, window.jivo_config) run unchanged.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  CALLBACKS, TEST_TIMEOUT, api, events, eventsSince, mark, messages, openPage, startBrowser, startHub,
  startSite, typeAndSend, visitor, w, waitEvent,
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
  widgetId = (await hub.widget({ name: 'shop', color: '#2e7d32', agents: ['ann@example.com'] })).widget.widget_id;
  site = await startSite(hub);
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
  return v.page;
}

/** The widget_on* callbacks among `list`, as [name, ...args]. */
const own = (list) => list.filter((e) => e.name.startsWith('widget_')).map((e) => [e.name, ...e.args]);

test('widget_onLoad fires once per page load, with widget_api ready', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  const [load] = await events(page, 'widget_onLoad');
  assert.equal(load.api, true, 'widget_api exists when widget_onLoad runs');
  // Whatever happens next, the page is not told again that the widget loaded.
  await api(page, 'open');
  await typeAndSend(page, 'Hello?');
  await api(page, 'close');
  assert.equal((await events(page, 'widget_onLoad')).length, 1);
  assert.equal((await events(page, 'jivo_onLoadCallback')).length, 1);

  await page.reload();
  await waitEvent(page, 'widget_onLoad');
  assert.equal((await events(page, 'widget_onLoad')).length, 1, 'once on the new page load too');
});

test('opening and closing the window fire onOpen/onClose and onChangeState; repeating them fires nothing', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);

  // The visitor clicks the chat button.
  let n = await mark(page);
  await w(page, 'hub-widget-button').click();
  await w(page, 'hub-widget-window').waitFor();
  let fired = await eventsSince(page, n);
  assert.deepEqual(own(fired).filter(([name]) => name !== 'widget_onResize'), [['widget_onOpen'], ['widget_onChangeState', 'chat']]);
  const [, size] = own(fired).find(([name]) => name === 'widget_onResize');
  assert.ok(size.width > 200 && size.height > 200, `the open window's size ${JSON.stringify(size)}`);

  // Opening an open window changes nothing, so nothing is called.
  n = await mark(page);
  assert.deepEqual(await api(page, 'open'), { result: 'ok' });
  assert.deepEqual(await eventsSince(page, n), []);

  // Minimised and restored.
  n = await mark(page);
  await w(page, 'hub-widget-minimise').click();
  assert.deepEqual(own(await eventsSince(page, n)).filter(([name]) => name === 'widget_onChangeState'), [['widget_onChangeState', 'chat/min']]);
  n = await mark(page);
  await w(page, 'hub-widget-minimise').click();
  assert.deepEqual(own(await eventsSince(page, n)).filter(([name]) => name === 'widget_onChangeState'), [['widget_onChangeState', 'chat']]);

  // The visitor closes the window with its close button.
  n = await mark(page);
  await w(page, 'hub-widget-close').click();
  await w(page, 'hub-widget-button').waitFor();
  fired = own(await eventsSince(page, n));
  assert.deepEqual(fired.filter(([name]) => name !== 'widget_onResize'), [['widget_onClose'], ['widget_onChangeState', 'label']]);

  // Closing a closed window calls nothing.
  n = await mark(page);
  assert.deepEqual(await api(page, 'close'), { result: 'ok' });
  assert.deepEqual(await eventsSince(page, n), []);

  // The page opens it on the callback form: the spec's "chat/call" state.
  n = await mark(page);
  assert.deepEqual(await api(page, 'open', { start: 'call' }), { result: 'ok' });
  assert.deepEqual(own(await eventsSince(page, n)).filter(([name]) => name !== 'widget_onResize'), [['widget_onOpen'], ['widget_onChangeState', 'chat/call']]);
});

test('the first message fires onClientStartChat and onMessageSent; later messages do not', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  await w(page, 'hub-widget-button').click();
  const n = await mark(page);
  await typeAndSend(page, 'Which grinder for espresso?');
  const [sent] = await waitEvent(page, 'widget_onMessageSent');
  assert.equal(sent.args[0].text, 'Which grinder for espresso?');
  assert.equal(sent.args[0].author, 'client');
  assert.deepEqual(own(await eventsSince(page, n)).map(([name]) => name), ['widget_onClientStartChat', 'widget_onMessageSent']);

  await typeAndSend(page, 'Budget is about 200 EUR.');
  await typeAndSend(page, 'And it should be quiet.');
  assert.equal((await events(page, 'widget_onMessageSent')).length, 1);
  assert.equal((await events(page, 'widget_onClientStartChat')).length, 1);
});

test('the agent accepting fires onAccept; the agent\'s message fires onMessageReceived', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  await api(page, 'open');
  await typeAndSend(page, 'Is anyone there?');
  const chat = await ann.chatWith('Is anyone there?');
  assert.equal((await events(page, 'widget_onAccept')).length, 0);

  await ann.accept(chat.chat.id);
  await waitEvent(page, 'widget_onAccept');
  await w(page, 'hub-widget-status').filter({ hasText: 'Ann' }).waitFor();

  await ann.say(chat.chat.id, 'Hi, Ann here. How can I help?');
  const [received] = await waitEvent(page, 'widget_onMessageReceived');
  assert.equal(received.args[0].text, 'Hi, Ann here. How can I help?');
  assert.equal(received.args[0].author, 'agent');
  assert.equal(received.args[0].name, 'Ann');
  assert.equal((await events(page, 'widget_onAccept')).length, 1, 'accepted once');
});

test('the contacts form fires onIntroduction', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  await w(page, 'hub-widget-button').click();
  await w(page, 'hub-contacts-open').click();
  await w(page, 'hub-contacts-name').fill('Eve Visitor');
  await w(page, 'hub-contacts-email').fill('eve@example.com');
  const n = await mark(page);
  await w(page, 'hub-contacts-submit').click();
  await w(page, 'hub-contacts-form').waitFor({ state: 'hidden' });
  assert.deepEqual(own(await eventsSince(page, n)).map(([name]) => name), ['widget_onIntroduction']);
});

test('every jivo_* twin is called like its widget_on* callback; jivo_api is widget_api; jivo_config names the widget', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  await w(page, 'hub-widget-button').click();
  await typeAndSend(page, 'Twins?');
  const chat = await ann.chatWith('Twins?');
  await ann.say(chat.chat.id, 'Yes, twins.');
  await waitEvent(page, 'jivo_onMessageReceived');
  await w(page, 'hub-widget-close').click();
  await waitEvent(page, 'jivo_onClose');

  const all = await events(page);
  const widget = all.filter((e) => e.name.startsWith('widget_'));
  const jivo = all.filter((e) => e.name.startsWith('jivo_'));
  assert.deepEqual(
    jivo.map((e) => [e.name, e.args]),
    widget.map((e) => [CALLBACKS[e.name], e.args]),
  );
  for (const name of ['jivo_onLoadCallback', 'jivo_onOpen', 'jivo_onChangeState', 'jivo_onResizeCallback', 'jivo_onClientStartChat',
    'jivo_onMessageSent', 'jivo_onAccept', 'jivo_onMessageReceived', 'jivo_onClose']) {
    assert.ok(jivo.some((e) => e.name === name), `${name} was called`);
  }

  const globals = await page.evaluate(() => ({
    same: window.jivo_api === window.widget_api,
    config: window.jivo_config,
  }));
  assert.equal(globals.same, true);
  assert.deepEqual(globals.config, { widget_id: widgetId, widget_color: '#2e7d32' });
});

test('a page written for the public service runs unchanged: jivo_onLoadCallback, jivo_api.chatMode(), jivo_api.open()', { timeout: TEST_TIMEOUT }, async (t) => {
  const { context, page } = await visitor(browser);
  t.after(() => context.close());
  await openPage(page, `${site.url(widgetId, 'legacy')}?legacy=1`);
  assert.equal(await page.evaluate(() => window.__mode), 'online');
  await w(page, 'hub-widget-window').waitFor();
  await waitEvent(page, 'jivo_onOpen');
  assert.deepEqual((await events(page, 'jivo_onChangeState')).map((e) => e.args), [['chat']]);
  await typeAndSend(page, 'Sent from an old page');
  await waitEvent(page, 'jivo_onMessageSent');
  await ann.chatWith('Sent from an old page');
  assert.equal(await messages(page, 'Sent from an old page').count(), 1);
});

test('a page that removes the widget gets onWidgetDestroy once', { timeout: TEST_TIMEOUT }, async (t) => {
  const page = await arrive(t);
  await page.evaluate(() => document.getElementById('hub-widget').remove());
  await waitEvent(page, 'widget_onWidgetDestroy');
  await waitEvent(page, 'jivo_onWidgetDestroy');
  await page.evaluate(() => document.body.appendChild(document.createElement('div')));
  assert.equal((await events(page, 'widget_onWidgetDestroy')).length, 1);
});
