// The agent console: sign-in, the chat list, one open chat and the client
// panel, kept live by the agent stream (GET /agent/v1/stream). No framework.
// Everything that comes from customers, integrators or visitors' pages is
// untrusted: it reaches the page only through textContent / text nodes, and
// only http(s) URLs become links or images.
(function () {
  'use strict';

  const TITLE = 'Hub console';
  const TYPING_EVERY_MS = 5000; // at most one typein per chat this often
  const TYPING_IDLE_MS = 6000; // then typeout after this much quiet
  const CLIENT_TYPING_MS = 15000; // a client "typing…" with no news fades
  const CLOSED_SHOWN = 50;
  const STREAM_EVENTS = ['chat.opened', 'chat.message', 'chat.invited', 'chat.client', 'chat.call',
    'chat.custom_data', 'chat.page', 'chat.typing', 'chat.accepted', 'chat.closed',
    'channel.availability', 'message.delivery', 'chat.integration', 'chat.crm_linked', 'lagged'];

  const $ = (id) => document.getElementById(id);

  const S = {
    agent: null,
    csrf: null,
    chats: new Map(), // id -> chat summary (as GET /agent/v1/chats lists it)
    channels: new Map(), // channel_id -> name
    agents: new Map(), // agent_id -> name (learned from typing events)
    unread: new Map(), // chat id -> Set of unread client message ids
    touched: new Map(), // chat id -> when an event last changed it (performance.now())
    seen: {}, // chat id -> last_message_at seen here (localStorage)
    openId: null,
    view: null, // GET /agent/v1/chats/{id} of the open chat
    msgEls: new Map(), // message id -> <li>
    crm: null, // {deals, tasks} of the open chat's client
    pipelines: null,
    es: null,
    streamDown: false,
    retry: null,
    audio: null,
    typing: { chat: null, sentAt: 0, idle: null },
    clientTyping: null,
    loadSeq: 0,
  };

  // ------------------------------------------------------------- helpers

  /** An element; props: class, text, on<event> (listeners), plain attributes. */
  function h(tag, props, kids) {
    const el = document.createElement(tag);
    if (props) {
      for (const k of Object.keys(props)) {
        const v = props[k];
        if (v == null || v === false) continue;
        if (k === 'class') el.className = v;
        else if (k === 'text') el.textContent = String(v);
        else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
        else if (k === 'value') el.value = v;
        else if (k === 'hidden' || k === 'disabled' || k === 'required' || k === 'selected') el[k] = true;
        else el.setAttribute(k, v === true ? '' : String(v));
      }
    }
    add(el, kids);
    return el;
  }

  function add(el, kids) {
    if (kids == null) return el;
    for (const c of [kids].flat(Infinity)) {
      if (c == null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function clear(el) {
    while (el.firstChild) el.firstChild.remove();
    return el;
  }

  /** The URL if it is http(s), else null: nothing else becomes a link or an image. */
  function safeUrl(u) {
    if (typeof u !== 'string' || !u) return null;
    try {
      const url = new URL(u);
      return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
    } catch {
      return null;
    }
  }

  /** A link for an http(s) URL (opened in a new tab), else the text alone. */
  function link(url, text) {
    const href = safeUrl(url);
    const label = text == null || text === '' ? String(url) : String(text);
    if (!href) return h('span', { text: label });
    return h('a', { href, target: '_blank', rel: 'noopener noreferrer', text: label });
  }

  /**
   * The hub HTML-escapes custom data from webhook replies (for apps that
   * render it as HTML); the console renders text, so it shows it as sent.
   */
  function unescapeHtml(s) {
    if (s == null) return '';
    return String(s).replace(/&(lt|gt|quot|#39|amp);/g, (_, e) =>
      ({ lt: '<', gt: '>', quot: '"', '#39': "'", amp: '&' })[e]);
  }

  /** A URL as people read it: no scheme, no trailing slash. */
  const shortUrl = (u) => String(u).replace(/^https?:\/\//, '').replace(/\/$/, '');

  const str = (v) => (v == null ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v));

  function when(ms) {
    if (!ms) return '';
    const d = new Date(ms);
    const now = new Date();
    const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
    if (d.toDateString() === now.toDateString()) return time;
    return `${d.toLocaleDateString([], { day: 'numeric', month: 'short' })} ${time}`;
  }

  const visible = () => document.visibilityState === 'visible';

  function initial(name) {
    const c = String(name || '?').trim().charAt(0);
    return c ? c.toUpperCase() : '?';
  }

  /** Rows of a definition list; empty values are left out. */
  function dl(rows) {
    const list = h('dl', { class: 'facts' });
    for (const [k, v] of rows) {
      if (v == null || v === '' || (Array.isArray(v) && !v.length)) continue;
      add(list, [h('dt', { text: k }), h('dd', null, v instanceof Node ? v : str(v))]);
    }
    return list.childNodes.length ? list : null;
  }

  function box(title, kids, cls) {
    return h('section', { class: `box ${cls || ''}` }, [h('h3', { text: title }), kids]);
  }

  // ----------------------------------------------------------------- API

  /** One request with the session cookie and, when it changes state, the CSRF token. */
  async function api(method, path, body) {
    method = String(method || 'GET').toUpperCase();
    const headers = { Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (method !== 'GET' && method !== 'HEAD' && S.csrf) headers['X-CSRF-Token'] = S.csrf;
    let r;
    try {
      r = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: 'same-origin',
        cache: 'no-store',
      });
    } catch {
      return { status: 0, body: { error: { code: 'network', message: 'the hub cannot be reached' } } };
    }
    const text = await r.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = text;
    }
    if (r.status === 401 && S.agent && !path.startsWith('/console/v1/session')) {
      signedOut('Your session has ended. Please sign in again.');
    }
    return { status: r.status, body: data };
  }

  const ok = (r) => r.status >= 200 && r.status < 300;
  const errorText = (r) =>
    (r.body && r.body.error && r.body.error.message) || (typeof r.body === 'string' && r.body) || `HTTP ${r.status}`;

  window.HubConsole = {
    api,
    get agent() {
      return S.agent;
    },
  };

  // ------------------------------------------------------------- sign-in

  async function boot() {
    $('signin-form').addEventListener('submit', signIn);
    $('signout').addEventListener('click', signOut);
    $('online').addEventListener('click', toggleOnline);
    $('view-chats').addEventListener('click', () => showView('chats'));
    $('view-admin').addEventListener('click', () => showView('admin'));
    $('accept').addEventListener('click', accept);
    $('close').addEventListener('click', closeChat);
    $('composer').addEventListener('submit', (e) => {
      e.preventDefault();
      send();
    });
    $('message').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      }
    });
    $('message').addEventListener('input', agentTyping);
    $('message').addEventListener('blur', () => stopTyping());
    $('media-form').addEventListener('submit', (e) => {
      e.preventDefault();
      sendMedia();
    });
    document.addEventListener('visibilitychange', () => {
      if (visible() && S.openId) seeOpenChat();
    });
    document.addEventListener('pointerdown', unlockAudio, { once: true });
    document.addEventListener('keydown', unlockAudio, { once: true });
    // Up and down arrows move between the chats of the list.
    document.querySelector('.list').addEventListener('keydown', (e) => {
      if (e.key !== 'ArrowDown' && e.key !== 'ArrowUp') return;
      const items = [...document.querySelectorAll('.list .item')];
      const i = items.indexOf(document.activeElement);
      if (i < 0) return;
      e.preventDefault();
      const next = items[i + (e.key === 'ArrowDown' ? 1 : -1)];
      if (next) next.focus();
    });
    window.addEventListener('hashchange', () => {
      const id = hashChat();
      if (S.agent && id && id !== S.openId) openChat(id);
    });
    const r = await api('GET', '/console/v1/session');
    $('boot').hidden = true;
    if (r.status === 200 && r.body && r.body.agent) start(r.body);
    else showSignIn('');
  }

  function showSignIn(message) {
    $('app').hidden = true;
    $('signin').hidden = false;
    $('signin-error').textContent = message || '';
    $('signin-submit').disabled = false;
    document.title = TITLE;
    $('signin-email').focus();
  }

  async function signIn(e) {
    e.preventDefault();
    unlockAudio();
    const email = $('signin-email').value.trim();
    const password = $('signin-password').value;
    const err = $('signin-error');
    if (!email || !password) {
      err.textContent = 'Enter your e-mail and password';
      return;
    }
    $('signin-submit').disabled = true;
    err.textContent = '';
    const r = await api('POST', '/console/v1/session', { email, password });
    $('signin-submit').disabled = false;
    if (r.status === 200 && r.body && r.body.agent) {
      $('signin-password').value = '';
      start(r.body);
      return;
    }
    $('signin-password').value = '';
    if (r.status === 401) err.textContent = 'Wrong e-mail or password';
    else if (r.status === 429) err.textContent = 'Too many attempts, try again later';
    else err.textContent = `Cannot sign in: ${errorText(r)}`;
    $('signin-password').focus();
  }

  function start(session) {
    S.agent = session.agent;
    S.csrf = session.csrf_token;
    try {
      S.seen = JSON.parse(localStorage.getItem(seenKey()) || '{}') || {};
    } catch {
      S.seen = {};
    }
    $('signin').hidden = true;
    $('app').hidden = false;
    $('me').textContent = S.agent.name || S.agent.email;
    $('me').title = S.agent.email;
    $('view-admin').hidden = !S.agent.admin;
    showView('chats');
    renderPresence();
    closeOpenChat();
    openStream();
    loadChats().then(() => {
      const id = hashChat();
      if (id && S.agent) openChat(id);
    });
  }

  async function signOut() {
    await stopTyping();
    await api('DELETE', '/console/v1/session');
    signedOut('');
  }

  /** Forgets everything of the session and shows the form. */
  function signedOut(message) {
    if (S.es) S.es.close();
    clearTimeout(S.retry);
    S.es = null;
    S.agent = null;
    S.csrf = null;
    S.chats = new Map();
    S.unread = new Map();
    S.touched = new Map();
    closeOpenChat();
    renderList();
    clear($('admin-view'));
    history.replaceState(null, '', location.pathname + location.search);
    showSignIn(message);
  }

  function seenKey() {
    return `hub-console-seen-${S.agent ? S.agent.id : 0}`;
  }

  function markSeen(c) {
    if (!c) return;
    const at = c.last_message_at || 0;
    if ((S.seen[c.id] || 0) >= at) return;
    S.seen[c.id] = at;
    const keys = Object.keys(S.seen);
    if (keys.length > 500) for (const k of keys.slice(0, keys.length - 500)) delete S.seen[k];
    try {
      localStorage.setItem(seenKey(), JSON.stringify(S.seen));
    } catch {
      /* private mode: unread counts then last for this page only */
    }
  }

  // ------------------------------------------------------- presence, views

  function renderPresence() {
    const on = !!(S.agent && S.agent.online);
    $('online').textContent = on ? 'Go offline' : 'Go online';
    $('presence').textContent = on ? 'Online' : 'Offline';
    $('presence').className = `presence ${on ? 'on' : 'off'}`;
  }

  async function toggleOnline() {
    unlockAudio();
    const want = !S.agent.online;
    // A user gesture: the moment to ask for notifications of new chats.
    if (want && 'Notification' in window && Notification.permission === 'default') {
      try {
        Notification.requestPermission();
      } catch {
        /* old browsers: no notifications */
      }
    }
    $('online').disabled = true;
    const r = await api('PUT', '/agent/v1/status', { online: want });
    $('online').disabled = false;
    if (ok(r)) {
      S.agent.online = r.body && typeof r.body.online === 'boolean' ? r.body.online : want;
      renderPresence();
    } else {
      setConn(`Cannot change the status: ${errorText(r)}`);
    }
  }

  function showView(which) {
    const admin = which === 'admin' && S.agent && S.agent.admin;
    $('chats-view').hidden = !!admin;
    $('admin-view').hidden = !admin;
    $('view-chats').setAttribute('aria-pressed', String(!admin));
    $('view-admin').setAttribute('aria-pressed', String(!!admin));
    if (!admin) return;
    const el = clear($('admin-view'));
    if (window.HubAdmin && typeof window.HubAdmin.mount === 'function') {
      try {
        window.HubAdmin.mount(el, window.HubConsole);
      } catch (e) {
        add(el, h('p', { class: 'form-error', text: `The administration view failed: ${e.message}` }));
      }
    } else {
      add(el, h('p', { class: 'pad muted', text: 'The administration view is not available.' }));
    }
  }

  /** Read out by screen readers (a polite live region). */
  function announce(text) {
    const el = $('announce');
    el.textContent = '';
    setTimeout(() => { el.textContent = text; }, 50);
  }

  function setConn(text) {
    $('conn').textContent = text || '';
  }

  // ---------------------------------------------------------- chat list

  async function loadChats() {
    const seq = ++S.loadSeq;
    const started = performance.now();
    const r = await api('GET', '/agent/v1/chats?state=all');
    if (!S.agent || seq !== S.loadSeq) return;
    if (!ok(r)) {
      setConn(`Cannot load the chats: ${errorText(r)}`);
      return;
    }
    const fresh = new Map();
    for (const c of r.body.chats || []) {
      fresh.set(c.id, c);
      S.channels.set(c.channel_id, c.channel);
    }
    // What events changed while the list was on its way is newer than the list.
    for (const [id, c] of S.chats) if ((S.touched.get(id) || 0) > started) fresh.set(id, c);
    S.chats = fresh;
    const todo = [];
    for (const c of fresh.values()) {
      if (c.state === 'closed' || (S.seen[c.id] || 0) >= c.last_message_at) S.unread.delete(c.id);
      else if (c.id === S.openId && visible()) {
        S.unread.delete(c.id);
        markSeen(c);
      } else todo.push(c);
    }
    for (const id of [...S.unread.keys()]) if (!fresh.has(id)) S.unread.delete(id);
    renderList();
    // Unread: client messages after both what this browser saw and the last agent reply.
    const queue = todo.slice(0, 40);
    const worker = async () => {
      for (let c = queue.shift(); c; c = queue.shift()) {
        const v = await api('GET', `/agent/v1/chats/${c.id}`);
        if (ok(v) && seq === S.loadSeq) {
          const ids = countUnread(v.body.messages || [], S.seen[c.id] || 0);
          for (const m of S.unread.get(c.id) || []) ids.add(m);
          if (ids.size && c.id !== S.openId) S.unread.set(c.id, ids);
        }
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
    if (seq === S.loadSeq) renderList();
  }

  /** The ids of client messages after both `seenAt` and the last agent reply. */
  function countUnread(messages, seenAt) {
    const ids = new Set();
    for (const m of messages) {
      if (m.author === 'agent') ids.clear();
      else if (m.author === 'client' && m.created_at > seenAt) ids.add(m.id);
    }
    return ids;
  }

  const unreadOf = (id) => (S.unread.has(id) ? S.unread.get(id).size : 0);

  function group(c) {
    if (c.state === 'closed') return 'closed';
    if (c.state === 'open') return 'waiting';
    return S.agent && c.agent_id === S.agent.id ? 'mine' : 'others';
  }

  function renderList() {
    const focused = document.activeElement && document.activeElement.dataset
      ? document.activeElement.dataset.chat : null;
    const groups = { waiting: [], mine: [], others: [], closed: [] };
    const sorted = [...S.chats.values()].sort((a, b) => b.last_message_at - a.last_message_at || b.id - a.id);
    for (const c of sorted) groups[group(c)].push(c);
    groups.closed = groups.closed.slice(0, CLOSED_SHOWN);
    for (const g of Object.keys(groups)) {
      const ul = clear($(`l-${g}`));
      const list = groups[g];
      $(`c-${g}`).textContent = list.length ? String(list.length) : '';
      if (!list.length && g !== 'others') {
        add(ul, h('li', { class: 'none', text: g === 'waiting' ? 'No one is waiting' : 'None' }));
      }
      for (const c of list) add(ul, h('li', null, chatItem(c)));
    }
    $('s-others').hidden = !groups.others.length;
    if (focused) {
      const again = document.querySelector(`.item[data-chat="${CSS.escape(focused)}"]`);
      if (again) again.focus();
    }
    updateTitle();
  }

  function chatItem(c) {
    const n = unreadOf(c.id);
    const name = c.client_name || 'Anonymous';
    let tag = '';
    if (c.bot && c.state === 'open') tag = c.bot.state === 'bot' ? `with bot ${c.bot.name || ''}` : 'invited by a bot';
    const label = `${name}${n ? `, ${n} unread` : ''}`;
    return h('button', {
      type: 'button',
      class: `item${c.id === S.openId ? ' current' : ''}${n ? ' has-unread' : ''}`,
      'data-chat': String(c.id),
      'aria-label': label,
      'aria-current': c.id === S.openId ? 'true' : null,
      onclick: () => openChat(c.id),
    }, [
      h('span', { class: 'avatar', 'aria-hidden': 'true', text: initial(name) }),
      h('span', { class: 'item-main' }, [
        h('span', { class: 'item-name', text: name }),
        h('span', { class: 'item-sub', text: [c.channel, tag].filter(Boolean).join(' · ') }),
      ]),
      h('span', { class: 'item-side' }, [
        h('span', { class: 'item-time', text: when(c.last_message_at) }),
        n ? h('span', { class: 'badge', text: String(n) }) : null,
      ]),
    ]);
  }

  function updateTitle() {
    let n = 0;
    for (const [id, k] of S.unread) {
      const c = S.chats.get(id);
      if (c && c.state !== 'closed') n += k.size;
    }
    document.title = n ? `(${n}) ${TITLE}` : TITLE;
  }

  /** Merges a chat object from an event into the list. */
  function upsertChat(chat, extra) {
    if (!chat || chat.id == null) return null;
    const c = S.chats.get(chat.id) || { channel: S.channels.get(chat.channel_id) || '', client_name: 'Anonymous' };
    Object.assign(c, chat, extra || {});
    S.chats.set(chat.id, c);
    S.touched.set(chat.id, performance.now());
    return c;
  }

  // ------------------------------------------------------------ stream

  function openStream() {
    if (S.es) S.es.close();
    const es = new EventSource('/agent/v1/stream');
    S.es = es;
    // Subscribed: read the list now, so nothing that happened before is missed.
    es.onopen = () => {
      setConn('');
      const was = S.streamDown;
      S.streamDown = false;
      loadChats();
      if (was && S.openId) openChat(S.openId, true);
    };
    es.onerror = () => {
      if (S.es !== es) return;
      S.streamDown = true;
      setConn('Reconnecting…');
      if (es.readyState === EventSource.CLOSED) {
        // The browser gave up (e.g. the session ended): check, then open again.
        clearTimeout(S.retry);
        S.retry = setTimeout(async () => {
          if (S.es !== es || !S.agent) return;
          const r = await api('GET', '/console/v1/session');
          if (r.status === 200 && S.agent) openStream();
          else if (r.status === 401 && S.agent) signedOut('Your session has ended. Please sign in again.');
          else if (S.agent) openStream();
        }, 3000);
      }
    };
    for (const name of STREAM_EVENTS) {
      es.addEventListener(name, (e) => {
        let ev;
        try {
          ev = JSON.parse(e.data);
        } catch {
          return;
        }
        try {
          onEvent(name, ev || {});
        } catch (err) {
          console.error('console: event', name, err);
        }
      });
    }
  }

  function reloadAll() {
    loadChats();
    if (S.openId) openChat(S.openId, true);
  }

  function onEvent(name, ev) {
    const d = ev.data || {};
    const id = ev.chat_id;
    const isOpen = id != null && id === S.openId && S.view;
    switch (name) {
      case 'chat.opened':
      case 'chat.invited': {
        const known = S.chats.get(id);
        const extra = {};
        if (d.client && d.client.name) extra.client_name = d.client.name;
        if (d.bot) extra.bot = { name: d.bot.name, state: d.bot.state };
        const c = upsertChat(d.chat || { id, channel_id: ev.channel_id }, extra);
        renderList();
        if (!known || name === 'chat.invited') {
          newChat(c);
          announce(`New chat: ${c.client_name || 'Anonymous'}`);
        }
        if (isOpen) refreshView();
        break;
      }
      case 'chat.message': {
        const m = d.message;
        if (!m) break;
        const c = S.chats.get(id);
        if (c) {
          c.last_message_at = Math.max(c.last_message_at || 0, m.created_at || Date.now());
          if (d.client && d.client.name) c.client_name = d.client.name;
          S.touched.set(id, performance.now());
        } else loadChats(); // a chat this page has not seen yet
        if (m.author === 'client') {
          if (isOpen && visible()) markSeen(c);
          else S.unread.set(id, (S.unread.get(id) || new Set()).add(m.id));
        } else if (m.author === 'agent') {
          S.unread.delete(id);
        }
        renderList();
        if (isOpen) {
          if (d.client) S.view.client = d.client;
          if (m.author === 'client') showClientTyping(false);
          const fresh = !S.msgEls.has(m.id);
          addMessage(m);
          if (fresh && m.author !== 'agent') {
            const [who] = authorOf(m);
            const text = messageBody(m.body || {}).map((el) => el.textContent).join(' ');
            announce(`${who}: ${text}`);
          }
        }
        break;
      }
      case 'chat.accepted':
      case 'chat.closed': {
        if (d.chat) upsertChat(d.chat);
        if (name === 'chat.closed') S.unread.delete(id);
        renderList();
        if (isOpen && d.chat) {
          S.view.chat = Object.assign(S.view.chat || {}, d.chat);
          renderHead();
        }
        break;
      }
      case 'chat.typing':
        if (d.by === 'agent' && d.name && d.agent_id) S.agents.set(d.agent_id, d.name);
        if (isOpen && d.by === 'client') showClientTyping(!!d.typing);
        break;
      case 'chat.client':
      case 'chat.custom_data':
      case 'chat.page':
      case 'chat.call': {
        const c = S.chats.get(id);
        if (c && d.client && d.client.name && c.client_name !== d.client.name) {
          c.client_name = d.client.name;
          renderList();
        }
        if (isOpen) refreshView();
        break;
      }
      case 'chat.integration':
        if (isOpen) {
          S.view.integration = d.integration || null;
          renderIntegration();
          // A reply's contact details change the client's profile too.
          if (d.integration && d.integration.contact_info) refreshView();
        }
        break;
      case 'chat.crm_linked':
        if (isOpen) {
          S.view.crmLinked = d.crm_link || true;
          renderIntegration();
        }
        break;
      case 'message.delivery':
        if (isOpen) setDelivery(d.message_id, d.state, d.error);
        break;
      case 'channel.availability':
        break;
      case 'lagged':
        reloadAll();
        break;
    }
  }

  // ----------------------------------------------- sound, notifications

  function unlockAudio() {
    if (S.audio) return;
    const Ctx = window.AudioContext || window.webkitAudioContext;
    if (!Ctx) return;
    try {
      S.audio = new Ctx();
    } catch {
      S.audio = null;
    }
  }

  function beep() {
    const ctx = S.audio;
    if (!ctx) return;
    try {
      if (ctx.state === 'suspended') ctx.resume();
      const t = ctx.currentTime;
      for (const [f, at] of [[880, 0], [1320, 0.16]]) {
        const o = ctx.createOscillator();
        const g = ctx.createGain();
        o.type = 'sine';
        o.frequency.value = f;
        g.gain.setValueAtTime(0.0001, t + at);
        g.gain.exponentialRampToValueAtTime(0.2, t + at + 0.02);
        g.gain.exponentialRampToValueAtTime(0.0001, t + at + 0.14);
        o.connect(g).connect(ctx.destination);
        o.start(t + at);
        o.stop(t + at + 0.15);
      }
    } catch {
      /* no sound: the list still shows the chat */
    }
  }

  function newChat(c) {
    if (!c || c.state === 'closed') return;
    beep();
    if (!('Notification' in window) || Notification.permission !== 'granted') return;
    if (visible() && document.hasFocus()) return;
    try {
      const n = new Notification('New chat', { body: c.client_name || 'A customer is waiting', tag: `hub-chat-${c.id}` });
      n.onclick = () => {
        window.focus();
        openChat(c.id);
        n.close();
      };
    } catch {
      /* notifications may be refused by the platform */
    }
  }

  // ------------------------------------------------------- the open chat

  function hashChat() {
    const m = /^#chat-(\d+)$/.exec(location.hash);
    return m ? Number(m[1]) : null;
  }

  function closeOpenChat() {
    S.openId = null;
    S.view = null;
    S.crm = null;
    S.msgEls = new Map();
    $('chat-main').hidden = true;
    $('chat-empty').hidden = false;
    clear($('panel'));
    add($('panel'), h('p', { class: 'muted pad', text: 'Open a chat to see the client.' }));
  }

  async function openChat(id, keep) {
    if (!S.agent) return;
    if (S.openId !== id) {
      await stopTyping();
      S.openId = id;
      S.view = null;
      S.crm = null;
      $('message').value = '';
      $('media-url').value = '';
      $('chat-error').textContent = '';
      showClientTyping(false);
      clear($('messages'));
      S.msgEls = new Map();
      renderList();
      history.replaceState(null, '', `#chat-${id}`);
    }
    const r = await api('GET', `/agent/v1/chats/${id}`);
    if (S.openId !== id) return;
    if (!ok(r)) {
      $('chat-empty').hidden = false;
      $('chat-main').hidden = true;
      setConn(r.status === 404 ? 'That chat is not yours to see' : `Cannot open the chat: ${errorText(r)}`);
      return;
    }
    S.view = r.body;
    upsertChat(S.view.chat, { client_name: S.view.client && S.view.client.name });
    $('chat-empty').hidden = true;
    $('chat-main').hidden = false;
    renderHead();
    if (!keep) clear($('messages')), (S.msgEls = new Map());
    for (const m of S.view.messages || []) addMessage(m, true);
    scrollDown(true);
    renderPanel();
    if (!keep || !S.crm) loadCrm();
    seeOpenChat();
  }

  /** The open chat is being looked at: nothing in it is unread. */
  function seeOpenChat() {
    const c = S.chats.get(S.openId);
    if (!c || !visible()) return;
    markSeen(c);
    if (S.unread.has(c.id)) {
      S.unread.delete(c.id);
      renderList();
    }
  }

  let refreshTimer = null;
  /** Reads the open chat again for its profile and panel (events coalesced). */
  function refreshView() {
    clearTimeout(refreshTimer);
    const id = S.openId;
    refreshTimer = setTimeout(async () => {
      const r = await api('GET', `/agent/v1/chats/${id}`);
      if (!ok(r) || S.openId !== id || !S.view) return;
      const linked = S.view.crmLinked;
      S.view = Object.assign(r.body, { crmLinked: linked });
      for (const m of r.body.messages || []) addMessage(m);
      renderHead();
      renderPanel();
    }, 150);
  }

  function renderHead() {
    const v = S.view;
    const c = v.chat || {};
    const name = (v.client && v.client.name) || 'Anonymous';
    $('chat-title').textContent = name;
    const mine = c.state === 'accepted' && c.agent_id === S.agent.id;
    let state = 'Waiting for an agent';
    if (c.state === 'accepted') state = mine ? 'Accepted by you' : `Accepted by ${S.agents.get(c.agent_id) || 'a colleague'}`;
    if (c.state === 'closed') state = 'Closed';
    if (v.bot && c.state === 'open') state += ` · bot ${v.bot.name || ''} (${v.bot.state})`;
    const channel = S.channels.get(c.channel_id);
    $('chat-sub').textContent = [state, channel && `channel ${channel}`].filter(Boolean).join(' · ');
    $('accept').hidden = c.state !== 'open';
    $('close').hidden = c.state === 'closed';
    const canWrite = c.state === 'open' || mine;
    for (const id of ['message', 'send', 'media-url', 'media-type', 'send-media']) $(id).disabled = !canWrite;
    $('message').placeholder = canWrite
      ? 'Write a reply. Enter sends, Shift+Enter adds a line.'
      : c.state === 'closed' ? 'This chat is closed.' : 'A colleague has this chat.';
  }

  function authorOf(m) {
    const v = S.view;
    switch (m.author) {
      case 'client':
        return [(v && v.client && v.client.name) || 'Client', 'client'];
      case 'agent':
        if (S.agent && m.agent_id === S.agent.id) return [S.agent.name || 'You', 'agent'];
        return [m.author_name || S.agents.get(m.agent_id) || 'Agent', 'agent'];
      case 'bot':
        return [m.author_name || 'Bot', 'bot'];
      case 'auto':
        return [m.author_name || 'Automatic reply', 'auto'];
      default:
        return [m.author_name || String(m.author || ''), String(m.author || '')];
    }
  }

  function addMessage(m, bulk) {
    if (!m || m.id == null) return;
    const old = S.msgEls.get(m.id);
    if (old) {
      if (m.delivery) setDelivery(m.id, m.delivery, m.delivery_error);
      return;
    }
    const [who, kind] = authorOf(m);
    const mine = m.author === 'agent' && S.agent && m.agent_id === S.agent.id;
    const li = h('li', { class: `msg ${kind}${mine ? ' mine' : ''}`, 'data-id': String(m.id) }, [
      h('div', { class: 'msg-meta' }, [
        h('span', { class: 'msg-author', text: who }),
        h('span', { class: 'chip', text: kind }),
        h('time', { class: 'msg-time', datetime: new Date(m.created_at || Date.now()).toISOString(), text: when(m.created_at) }),
      ]),
      h('div', { class: 'bubble' }, messageBody(m.body || {})),
    ]);
    if (m.delivery) add(li, h('p', { class: 'delivery' }));
    S.msgEls.set(m.id, li);
    const list = $('messages');
    // Keep the order by id, whatever order the answer and the stream arrive in.
    let before = null;
    for (let el = list.lastElementChild; el; el = el.previousElementSibling) {
      if (Number(el.dataset.id) > m.id) before = el;
      else break;
    }
    const near = list.scrollHeight - list.scrollTop - list.clientHeight < 80;
    list.insertBefore(li, before);
    if (m.delivery) setDelivery(m.id, m.delivery, m.delivery_error);
    if (!bulk) scrollDown(near || mine);
  }

  function scrollDown(force) {
    const list = $('messages');
    if (force) list.scrollTop = list.scrollHeight;
  }

  function setDelivery(id, state, error) {
    const li = S.msgEls.get(id);
    if (!li) return;
    const word = state === 'delivered' || state === 'failed' ? state : 'pending';
    // Answers and stream events race: a settled state never goes back to pending.
    if (word === 'pending' && li.dataset.delivery && li.dataset.delivery !== 'pending') return;
    li.dataset.delivery = word;
    let p = li.querySelector('.delivery');
    if (!p) p = add(li, h('p', { class: 'delivery' })).lastChild;
    clear(p);
    add(p, [h('span', { class: `state ${word}`, text: word })]);
    if (word === 'failed' && error) add(p, [' ', h('span', { class: 'delivery-error', text: String(error) })]);
    li.classList.toggle('failed', word === 'failed');
  }

  const MEDIA = { video: 'Video', audio: 'Audio', voice: 'Voice message', document: 'File', file: 'File', sticker: 'Sticker', photo: 'Photo' };

  /** A message body as elements: text, a picture preview, a link to a file or a place. */
  function messageBody(b) {
    const type = String(b.type || '').toLowerCase();
    const out = [];
    const text = b.text != null ? b.text : b.message && b.message.text;
    if (type === 'photo' || type === 'sticker') {
      const src = safeUrl(b.thumb) || safeUrl(b.file || b.file_url);
      const href = safeUrl(b.file || b.file_url);
      if (src && href) {
        out.push(h('a', { href, target: '_blank', rel: 'noopener noreferrer', class: 'preview' }, [
          h('img', { src, alt: b.file_name || MEDIA[type], loading: 'lazy', referrerpolicy: 'no-referrer' }),
        ]));
      }
      out.push(h('p', { class: 'file' }, link(b.file || b.file_url, `${MEDIA[type]}: ${b.file_name || 'picture'}`)));
    } else if (MEDIA[type]) {
      out.push(h('p', { class: 'file' }, link(b.file || b.file_url, `${MEDIA[type]}: ${b.file_name || b.title || 'file'}`)));
    } else if (type === 'location') {
      const lat = Number(b.latitude);
      const lon = Number(b.longitude);
      const label = `Location: ${b.title || `${lat}, ${lon}`}`;
      out.push(h('p', { class: 'file' }, Number.isFinite(lat) && Number.isFinite(lon)
        ? link(`https://www.openstreetmap.org/?mlat=${lat}&mlon=${lon}#map=16/${lat}/${lon}`, label)
        : label));
    }
    if (text != null && text !== '') out.push(h('p', { class: 'text', text: String(text) }));
    const buttons = b.buttons || (b.message && b.message.buttons);
    if (Array.isArray(buttons) && buttons.length) {
      out.push(h('p', { class: 'bot-buttons' }, buttons.map((x) => h('span', { class: 'chip', text: str(x && (x.text || x.title) || x) }))));
    }
    if (!out.length) out.push(h('p', { class: 'text muted', text: type ? `[${type}]` : str(b) }));
    return out;
  }

  function showClientTyping(on) {
    clearTimeout(S.clientTyping);
    const name = (S.view && S.view.client && S.view.client.name) || 'The client';
    $('typing').textContent = on ? `${name} is typing…` : '';
    if (on) S.clientTyping = setTimeout(() => showClientTyping(false), CLIENT_TYPING_MS);
  }

  // ------------------------------------------------------------ actions

  function chatError(r, what) {
    $('chat-error').textContent = r ? `${what}: ${errorText(r)}` : '';
  }

  async function accept() {
    const id = S.openId;
    chatError(null);
    const r = await api('POST', `/agent/v1/chats/${id}/accept`);
    if (!ok(r)) return chatError(r, 'Cannot accept the chat');
    if (S.openId === id && S.view) {
      // The button goes away: its focus moves on to the reply box, unless the agent is elsewhere already.
      const where = document.activeElement;
      const move = !where || where === document.body || where === $('accept');
      S.view.chat = Object.assign(S.view.chat || {}, r.body);
      upsertChat(r.body);
      renderList();
      renderHead();
      if (move) $('message').focus();
    }
  }

  async function closeChat() {
    const id = S.openId;
    chatError(null);
    await stopTyping();
    const r = await api('POST', `/agent/v1/chats/${id}/close`);
    if (!ok(r)) return chatError(r, 'Cannot close the chat');
    upsertChat(r.body);
    S.unread.delete(id);
    renderList();
    if (S.openId === id && S.view) {
      S.view.chat = Object.assign(S.view.chat || {}, r.body);
      renderHead();
    }
  }

  async function post(body, what) {
    const id = S.openId;
    chatError(null);
    const r = await api('POST', `/agent/v1/chats/${id}/messages`, body);
    if (!ok(r)) {
      chatError(r, what);
      return false;
    }
    if (S.openId === id && r.body && r.body.message) addMessage(r.body.message);
    return true;
  }

  async function send() {
    const box = $('message');
    const text = box.value;
    if (!text.trim() || box.disabled || !S.openId) return;
    S.typing.chat = null;
    clearTimeout(S.typing.idle);
    box.value = '';
    if (!(await post({ type: 'text', text }, 'Not sent'))) box.value = text;
    box.focus();
  }

  async function sendMedia() {
    const input = $('media-url');
    const url = safeUrl(input.value.trim());
    if (!url) {
      $('chat-error').textContent = 'Enter an http:// or https:// URL';
      input.focus();
      return;
    }
    const u = new URL(url);
    let name = u.pathname.split('/').filter(Boolean).pop() || u.hostname;
    try {
      name = decodeURIComponent(name);
    } catch {
      /* keep it encoded */
    }
    const ext = (name.split('.').pop() || '').toLowerCase();
    let type = $('media-type').value;
    if (!type) {
      if (/^(jpe?g|png|gif|webp|bmp|svg|avif)$/.test(ext)) type = 'photo';
      else if (/^(mp4|webm|mov|mkv|avi)$/.test(ext)) type = 'video';
      else if (/^(mp3|ogg|oga|wav|m4a|aac|flac|opus)$/.test(ext)) type = 'audio';
      else type = 'document';
    }
    // The channel protocol needs a size; the console cannot read other sites, so it says 1.
    if (await post({ type, file: url, file_name: name, file_size: 1 }, 'Media not sent')) input.value = '';
  }

  /** Tells the customer the agent is typing: one typein per few seconds, typeout when quiet. */
  function agentTyping() {
    const c = S.view && S.view.chat;
    if (!c || c.state !== 'accepted' || c.agent_id !== S.agent.id) return;
    if (!$('message').value.trim()) {
      stopTyping();
      return;
    }
    const now = Date.now();
    if (S.typing.chat !== c.id || now - S.typing.sentAt > TYPING_EVERY_MS) {
      S.typing.chat = c.id;
      S.typing.sentAt = now;
      api('POST', `/agent/v1/chats/${c.id}/messages`, { type: 'typein' });
    }
    clearTimeout(S.typing.idle);
    S.typing.idle = setTimeout(stopTyping, TYPING_IDLE_MS);
  }

  async function stopTyping() {
    clearTimeout(S.typing.idle);
    const id = S.typing.chat;
    if (id == null) return;
    S.typing.chat = null;
    const c = S.chats.get(id);
    if (c && c.state === 'accepted' && S.agent && c.agent_id === S.agent.id) {
      await api('POST', `/agent/v1/chats/${id}/messages`, { type: 'typeout' });
    }
  }

  // -------------------------------------------------------- the panel

  function renderPanel() {
    const panel = clear($('panel'));
    const v = S.view;
    if (!v) return;
    const c = v.client || {};
    const photo = safeUrl(c.photo);
    add(panel, h('div', { class: 'profile' }, [
      photo
        ? h('img', { class: 'photo', src: photo, alt: `Photo of ${c.name || 'the client'}`, referrerpolicy: 'no-referrer' })
        : h('span', { class: 'avatar big', 'aria-hidden': 'true', text: initial(c.name) }),
      h('div', null, [
        h('h2', { class: 'profile-name', text: c.name || 'Anonymous' }),
        c.visitor_number ? h('p', { class: 'muted', text: `Visitor ${c.visitor_number}` }) : null,
      ]),
    ]));
    add(panel, h('div', { id: 'p-integration' }));
    add(panel, box('Profile', dl([
      ['Phone', c.phone],
      ['E-mail', c.email],
      ['Page', c.url ? link(c.url, shortUrl(c.url)) : null],
      ['Invite', c.invite],
      ['User ID', c.external_id],
      ['User token', v.visitor && v.visitor.user_token],
    ]) || h('p', { class: 'muted', text: 'Nothing more is known.' })));
    const visitor = visitorBox(v.visitor);
    if (visitor) add(panel, visitor);
    add(panel, h('div', { id: 'p-crm' }));
    add(panel, h('div', { id: 'p-attributes' }));
    if (Array.isArray(v.calls) && v.calls.length) {
      add(panel, box('Calls', h('ul', { class: 'rows' }, v.calls.map((k) =>
        h('li', { text: [k.type, k.phone, k.status, k.reason].filter(Boolean).join(' · ') })))));
    }
    renderIntegration();
    renderAttributes();
    renderCrm();
  }

  function customFields(fields, escaped) {
    const t = escaped ? unescapeHtml : (x) => (x == null ? '' : String(x));
    return h('ul', { class: 'fields' }, fields.map((f) => {
      const content = t(f.content);
      const title = f.title != null ? t(f.title) : '';
      const line = h('p', { class: 'field-line' }, [
        f.key != null && f.key !== '' ? h('strong', { text: `${t(f.key)}: ` }) : null,
        safeUrl(f.link) ? link(f.link, content || title || f.link) : h('span', { text: content }),
      ]);
      return h('li', { class: 'field' }, [title ? h('p', { class: 'field-title', text: title }) : null, line]);
    }));
  }

  function visitorBox(x) {
    if (!x) return null;
    const rows = [];
    const page = x.page || {};
    // A custom channel's page is the client's url, already in the profile.
    const same = page.url && S.view && S.view.client && page.url === S.view.client.url && !page.title;
    if ((page.url || page.title) && !same) rows.push(['On page', page.url ? link(page.url, page.title || shortUrl(page.url)) : page.title]);
    if (x.referrer) rows.push(['Came from', link(x.referrer, x.referrer)]);
    if (x.utm_json && typeof x.utm_json === 'object') {
      for (const k of Object.keys(x.utm_json)) rows.push([`UTM ${k}`, str(x.utm_json[k])]);
    }
    if (x.geoip && typeof x.geoip === 'object') {
      const g = x.geoip;
      rows.push(['Location', [g.city, g.region, g.country].map((p) => p && (p.name || p)).filter(Boolean).map(str).join(', ')]);
    }
    rows.push(['IP', x.ip], ['Browser', x.user_agent], ['Visits', x.visits_count || null], ['About', x.description]);
    const list = dl(rows);
    const custom = Array.isArray(x.custom_data) && x.custom_data.length ? customFields(x.custom_data, false) : null;
    if (!list && !custom) return null;
    return box('Visitor', [list, custom && h('p', { class: 'sub', text: 'From the page' }), custom]);
  }

  function renderIntegration() {
    const el = $('p-integration');
    if (!el || !S.view) return;
    clear(el);
    const i = S.view.integration;
    if (!i) return;
    const kids = [];
    if (Array.isArray(i.custom_data) && i.custom_data.length) kids.push(customFields(i.custom_data, true));
    if (i.contact_info) {
      const ci = i.contact_info;
      kids.push(dl([['Name', ci.name], ['Phone', ci.phone], ['E-mail', ci.email]]));
    }
    if (i.page && i.page.url) kids.push(dl([['Now on', link(i.page.url, i.page.title || i.page.url)]]));
    if (i.crm_link && i.enable_assign) {
      kids.push(h('p', { class: 'crm-link' }, h('button', { type: 'button', class: 'primary', onclick: linkCrm, text: 'Open in CRM' })));
    } else if (i.crm_link) {
      kids.push(h('p', { class: 'crm-link' }, link(i.crm_link, 'CRM card')));
    } else if (i.enable_assign) {
      kids.push(h('p', { class: 'muted', text: 'Linking to the CRM is allowed, but no CRM link was offered.' }));
    }
    if (S.view.crmLinked) {
      kids.push(h('p', { class: 'ok-note', role: 'status' }, ['Linked to the CRM: ',
        link(typeof S.view.crmLinked === 'string' ? S.view.crmLinked : i.crm_link, 'open the card')]));
    }
    add(el, box('From the integration', kids.filter(Boolean), 'integration'));
  }

  async function linkCrm() {
    const id = S.openId;
    // Opened now, while the click still counts as the user's, and pointed at the card below.
    const tab = window.open('about:blank', '_blank');
    const r = await api('POST', `/agent/v1/chats/${id}/crm-link`);
    if (!ok(r)) {
      if (tab) tab.close();
      return chatError(r, 'Cannot link to the CRM');
    }
    const url = safeUrl(r.body && r.body.crm_link);
    if (tab && url) {
      tab.opener = null;
      tab.location.href = url;
    } else if (tab) tab.close();
    if (S.openId === id && S.view) {
      S.view.crmLinked = url || true;
      renderIntegration();
    }
  }

  // ---------------------------------------------------------- attributes

  function renderAttributes() {
    const el = $('p-attributes');
    if (!el || !S.view) return;
    clear(el);
    const attrs = S.view.attributes && typeof S.view.attributes === 'object' ? S.view.attributes : {};
    const keys = Object.keys(attrs);
    const list = h('ul', { class: 'rows' }, keys.map((k) => h('li', { class: 'attr' }, [
      h('span', { class: 'attr-k', text: k }),
      h('span', { class: 'attr-v', text: str(attrs[k]) }),
      h('button', { type: 'button', class: 'icon', 'aria-label': `Remove attribute ${k}`, title: 'Remove', text: '×', onclick: () => saveAttribute(k, null) }),
    ])));
    const name = h('input', { id: 'attr-name', required: true, autocomplete: 'off' });
    const value = h('input', { id: 'attr-value', autocomplete: 'off' });
    const form = h('form', { class: 'mini' }, [
      h('div', { class: 'two' }, [
        h('div', null, [h('label', { for: 'attr-name', text: 'Attribute' }), name]),
        h('div', null, [h('label', { for: 'attr-value', text: 'Value' }), value]),
      ]),
      h('button', { type: 'submit', class: 'primary', text: 'Save attribute' }),
    ]);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      if (name.value.trim()) saveAttribute(name.value.trim(), value.value);
    });
    add(el, box('Attributes', [keys.length ? list : h('p', { class: 'muted', text: 'No attributes yet.' }), quick('Set an attribute', form)]));
  }

  async function saveAttribute(key, value) {
    const id = S.openId;
    const r = await api('PUT', `/agent/v1/chats/${id}/attributes`, { attributes: { [key]: value } });
    if (!ok(r)) return chatError(r, 'Cannot save the attribute');
    if (S.openId === id && S.view) {
      S.view.attributes = (r.body && r.body.attributes) || {};
      renderAttributes();
    }
  }

  // ----------------------------------------------------------------- CRM

  async function loadCrm() {
    const id = S.openId;
    const client = S.view && S.view.client && S.view.client.id;
    if (client == null) return;
    const [deals, tasks, pipes] = await Promise.all([
      api('GET', `/agent/v1/crm/deals?client_id=${encodeURIComponent(client)}`),
      api('GET', `/agent/v1/crm/tasks?client_id=${encodeURIComponent(client)}`),
      api('GET', '/agent/v1/crm/pipelines'),
    ]);
    if (S.openId !== id) return;
    if (pipes && ok(pipes)) S.pipelines = pipes.body.pipelines || [];
    S.crm = {
      deals: ok(deals) ? deals.body.deals || [] : null,
      tasks: ok(tasks) ? tasks.body.tasks || [] : null,
      error: ok(deals) && ok(tasks) ? '' : errorText(ok(deals) ? tasks : deals),
    };
    renderCrm();
  }

  function stageOf(deal) {
    const pid = deal.pipeline && deal.pipeline.pipeline_id;
    const sid = deal.pipeline && deal.pipeline.pipeline_status && deal.pipeline.pipeline_status.pipeline_status_id;
    const p = (S.pipelines || []).find((x) => x.pipeline_id === pid);
    const s = p && (p.pipeline_statuses || []).find((x) => x.pipeline_status_id === sid);
    return { pipeline: p, stage: s };
  }

  function renderCrm() {
    const el = $('p-crm');
    if (!el || !S.view) return;
    clear(el);
    const crm = S.crm;
    if (!crm) {
      add(el, box('Deals and tasks', h('p', { class: 'muted', text: 'Loading…' })));
      return;
    }
    const deals = crm.deals || [];
    const dealList = h('ul', { class: 'rows' }, deals.map((d) => {
      const { pipeline, stage } = stageOf(d);
      const amount = d.amount != null ? `${d.amount}${pipeline ? ` ${pipeline.currency}` : ''}` : '';
      return h('li', { class: 'deal' }, [
        h('span', { class: 'deal-title', text: d.title }),
        h('span', { class: 'muted', text: [amount, stage && stage.title, d.closed_ts ? 'closed' : ''].filter(Boolean).join(' · ') }),
      ]);
    }));
    const pipes = S.pipelines || [];
    const title = h('input', { id: 'deal-title', required: true, autocomplete: 'off' });
    const amount = h('input', { id: 'deal-amount', type: 'number', min: '0', step: 'any', inputmode: 'decimal' });
    const pipeline = h('select', { id: 'deal-pipeline', disabled: !pipes.length },
      pipes.length ? pipes.map((p) => h('option', { value: String(p.pipeline_id), text: `${p.title} (${p.currency})` }))
        : h('option', { value: '', text: 'No pipelines yet' }));
    const dealForm = h('form', { class: 'mini' }, [
      h('label', { for: 'deal-title', text: 'Deal title' }), title,
      h('div', { class: 'two' }, [
        h('div', null, [h('label', { for: 'deal-amount', text: 'Amount' }), amount]),
        h('div', null, [h('label', { for: 'deal-pipeline', text: 'Pipeline' }), pipeline]),
      ]),
      pipes.length ? null : h('p', { class: 'muted', text: 'Deals need a pipeline: create one in the CRM first.' }),
      h('button', { type: 'submit', class: 'primary', disabled: !pipes.length, text: 'Add deal' }),
    ]);
    dealForm.addEventListener('submit', async (e) => {
      e.preventDefault();
      if (!title.value.trim() || !pipeline.value) return title.focus();
      const body = { client_id: S.view.client.id, title: title.value.trim(), pipeline_id: Number(pipeline.value) };
      if (amount.value !== '') body.amount = Number(amount.value);
      const r = await api('POST', '/agent/v1/crm/deals', body);
      if (!ok(r)) return crmError(r, 'Cannot add the deal');
      loadCrm();
    });

    const tasks = crm.tasks || [];
    const taskList = h('ul', { class: 'rows' }, tasks.map((t) => h('li', { class: `task ${t.status}` }, [
      h('span', { class: 'task-text', text: t.text }),
      h('span', { class: 'muted', text: `${when(t.notify_ts * 1000)}${t.status === 'completed' ? ' · done' : ''}` }),
      t.status === 'active'
        ? h('button', { type: 'button', class: 'small', 'aria-label': `Complete task ${t.text}`, text: 'Done', onclick: () => completeTask(t.task_id) })
        : null,
    ])));
    const text = h('input', { id: 'task-text', required: true, autocomplete: 'off' });
    const due = h('input', { id: 'task-due', type: 'datetime-local', required: true, value: localInput(Date.now() + 3600_000) });
    const taskForm = h('form', { class: 'mini' }, [
      h('label', { for: 'task-text', text: 'Task' }), text,
      h('label', { for: 'task-due', text: 'Due' }), due,
      h('button', { type: 'submit', class: 'primary', text: 'Add task' }),
    ]);
    taskForm.addEventListener('submit', async (e) => {
      e.preventDefault();
      const at = new Date(due.value).getTime();
      if (!text.value.trim() || !Number.isFinite(at)) return text.focus();
      const r = await api('POST', '/agent/v1/crm/tasks', {
        client_id: S.view.client.id, text: text.value.trim(), notify_ts: Math.floor(at / 1000),
      });
      if (!ok(r)) return crmError(r, 'Cannot add the task');
      loadCrm();
    });

    add(el, [
      box('Deals', [
        deals.length ? dealList : h('p', { class: 'muted', text: crm.deals ? 'No deals yet.' : 'Deals cannot be read.' }),
        quick('New deal', dealForm),
      ]),
      box('Tasks', [
        tasks.length ? taskList : h('p', { class: 'muted', text: crm.tasks ? 'No tasks yet.' : 'Tasks cannot be read.' }),
        quick('New task', taskForm),
      ]),
      h('p', { id: 'crm-error', class: 'form-error', role: 'alert', text: crm.error ? `CRM: ${crm.error}` : '' }),
    ]);
  }

  /** A quick-create form, folded under a summary until wanted. */
  function quick(title, form) {
    const d = h('details', { class: 'quick' }, [h('summary', { text: title }), form]);
    d.addEventListener('toggle', () => {
      const first = d.open && form.querySelector('input');
      if (first) first.focus();
    });
    return d;
  }

  function crmError(r, what) {
    const el = $('crm-error');
    if (el) el.textContent = `${what}: ${errorText(r)}`;
  }

  async function completeTask(taskId) {
    const r = await api('POST', `/agent/v1/crm/tasks/${taskId}/complete`);
    if (!ok(r)) return crmError(r, 'Cannot complete the task');
    loadCrm();
  }

  function localInput(ms) {
    const d = new Date(ms);
    const p = (n) => String(n).padStart(2, '0');
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot);
  else boot();
})();
