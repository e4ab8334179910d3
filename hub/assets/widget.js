/*
 * hub/assets/widget.js - the hub's website chat widget.
 *
 * Role. A site owner pastes `<script src="//<hub>/widget/<widget_id>" async></script>`
 * into their pages. This script draws a chat button and window inside a Shadow DOM
 * (so the page's CSS cannot restyle it, nor ours leak out), lets the visitor chat
 * with the channel's agents and bots, and gives the page the scripting object
 * `widget_api` (also `window.jivo_api`) and the `widget_on*` / `jivo_on*`
 * callbacks, so pages written for the public service run unchanged.
 * One IIFE, vanilla ES2020, no dependencies, no build step.
 *
 * Contract with the hub (issue 15; docs/widget.md describes it for site owners):
 * - `GET /widget/<id>` serves this file with one line prepended:
 *   `var HUB_WIDGET = {"widget_id":"..","color":"#hex","base":"http://hub"};`
 *   The API base is taken from this script's own URL when known (the page may
 *   reach the hub under another host name than `base`), else HUB_WIDGET.base.
 * - B = <base>/widget/v1/<widget_id>. JSON bodies. The visitor token travels as
 *   `Authorization: Bearer <token>` (on the SSE stream as `?token=`) and is kept in
 *   localStorage `hub_widget_token:<widget_id>`, so history survives reloads.
 *   POST B/session (on load; retried with backoff), B/messages, B/typing,
 *   B/contacts, B/custom-data, B/user-token, B/page, B/attributes,
 *   B/offline-messages, B/calls, B/clear; GET B/callback, B/messages; GET
 *   B/stream?after=<newest message id the page has> (events: message, with the
 *   message id as the SSE id, typing, chat, mode, call; a resumed stream
 *   first sends the messages after `after` or Last-Event-ID, then chat, mode).
 * - Every widget_api method returns at once ({result:"ok"}, {result:"fail",
 *   reason|error}, or the value asked for); network work runs in the background.
 *   Only getVisitorNumber and isCallbackEnabled answer through their callback.
 * - Anything that came from the network or the page reaches the DOM through
 *   textContent / attributes, never as HTML.
 */
(function () {
  'use strict';

  // A page that pastes the tag twice must still get one widget and one session.
  if (window.__hub_widget_loaded) return;
  window.__hub_widget_loaded = true;

  var CFG = (typeof HUB_WIDGET === 'object' && HUB_WIDGET) || {};
  var SRC = scriptSrc();
  var WIDGET_ID = String(CFG.widget_id || idFromSrc(SRC) || '');
  var BASE = baseFromSrc(SRC) || String(CFG.base || '').replace(/\/+$/, '');
  var API = BASE + '/widget/v1/' + encodeURIComponent(WIDGET_ID);
  var DEFAULT_COLOR = '#1e88e5';

  var K_TOKEN = 'hub_widget_token:' + WIDGET_ID;
  var K_ATTRS = 'hub_widget_attrs:' + WIDGET_ID;
  var K_VISITS = 'hub_widget_visits:' + WIDGET_ID;
  var K_SEEN = 'hub_widget_seen:' + WIDGET_ID;

  var PHONE_RE = /^\+?[0-9 ()-]{6,20}$/;
  var EMAIL_RE = /^[^\s@]+@[^\s@]+$/;

  function scriptSrc() {
    var s = document.currentScript;
    if (s && s.src) return s.src;
    // currentScript is null when the tag was injected in ways that hide it; the
    // embed URL shape is known, so look for it.
    var all = document.querySelectorAll('script[src]');
    for (var i = all.length - 1; i >= 0; i--) {
      if (/\/widget\/[^/?#]+\/?(?:[?#].*)?$/.test(all[i].src)) return all[i].src;
    }
    return '';
  }
  function idFromSrc(src) {
    var m = /\/widget\/([^/?#]+)\/?(?:[?#].*)?$/.exec(src || '');
    return m ? decodeURIComponent(m[1]) : '';
  }
  function baseFromSrc(src) {
    if (!src) return '';
    try {
      var u = new URL(src, location.href);
      // Keep a path prefix before /widget/<id> so a hub behind a reverse proxy
      // under /chat/ still works; in the plain case this is just the origin.
      var m = /^(.*?)\/(?:script\/)?widget\/[^/]+\/?$/.exec(u.pathname);
      return u.origin + (m ? m[1] : '');
    } catch (e) {
      return '';
    }
  }

  // ---------------------------------------------------------------- storage
  // localStorage throws in sandboxed iframes and some private modes; the widget
  // must keep working there, just without memory across page loads.
  var memStore = {};
  function load(k) {
    try {
      var v = localStorage.getItem(k);
      if (v !== null) return v;
    } catch (e) { /* fall through to memory */ }
    return Object.prototype.hasOwnProperty.call(memStore, k) ? memStore[k] : null;
  }
  function save(k, v) {
    if (v == null) delete memStore[k]; else memStore[k] = v;
    try {
      if (v == null) localStorage.removeItem(k); else localStorage.setItem(k, v);
    } catch (e) { /* memory copy above is enough */ }
  }
  function loadJSON(k, dflt) {
    try { var v = JSON.parse(load(k)); return v == null ? dflt : v; } catch (e) { return dflt; }
  }

  // -------------------------------------------------------------- callbacks
  var CALLBACKS = {
    Load: ['widget_onLoad', 'jivo_onLoadCallback'],
    Open: ['widget_onOpen', 'jivo_onOpen'],
    Close: ['widget_onClose', 'jivo_onClose'],
    MessageSent: ['widget_onMessageSent', 'jivo_onMessageSent'],
    ClientStartChat: ['widget_onClientStartChat', 'jivo_onClientStartChat'],
    Accept: ['widget_onAccept', 'jivo_onAccept'],
    Introduction: ['widget_onIntroduction', 'jivo_onIntroduction'],
    Resize: ['widget_onResize', 'jivo_onResizeCallback'],
    CallStart: ['widget_onCallStart', 'jivo_onCallStart'],
    CallEnd: ['widget_onCallEnd', 'jivo_onCallEnd'],
    ChangeState: ['widget_onChangeState', 'jivo_onChangeState'],
    MessageReceived: ['widget_onMessageReceived', 'jivo_onMessageReceived'],
    WidgetDestroy: ['widget_onWidgetDestroy', 'jivo_onWidgetDestroy']
  };
  // Callbacks often call widget_api again (open() inside onLoad, close() inside
  // onOpen). Queueing keeps every callback seeing the events in the order they
  // happened instead of nesting one transition inside another.
  var fireQueue = [];
  var firing = false;
  function fire(ev) {
    fireQueue.push([ev, Array.prototype.slice.call(arguments, 1)]);
    if (firing) return;
    firing = true;
    try {
      while (fireQueue.length) {
        var item = fireQueue.shift();
        var called = [];
        CALLBACKS[item[0]].forEach(function (name) {
          var fn = window[name];
          // A page may point both names at one function; it should run once.
          if (typeof fn !== 'function' || called.indexOf(fn) >= 0) return;
          called.push(fn);
          safeCall.apply(null, [fn].concat(item[1]));
        });
      }
    } finally {
      firing = false;
    }
  }
  // The page's bugs must never break the widget, but the page's developer should see them.
  function safeCall(fn) {
    try {
      fn.apply(window, Array.prototype.slice.call(arguments, 1));
    } catch (e) {
      if (window.console) console.error('[hub widget] page callback failed:', e);
    }
  }

  // ------------------------------------------------------------------ state
  var S = {
    token: load(K_TOKEN),
    conn: 'pending', // 'pending' until the first session answer, then 'ok' or 'down'
    loaded: false,
    loadFired: false,
    mounted: false,
    destroyed: false,
    visitor: null,
    chatMode: 'offline',
    color: validColor(CFG.color) ? String(CFG.color).trim() : DEFAULT_COLOR,
    colorFromPage: false,
    contact: { client_name: null, email: null, phone: null, description: null },
    chat: null,
    msgs: [],
    callback: null,
    unread: 0,
    vis: 'label', // 'label' | 'min' | 'open'
    view: 'chat', // 'chat' | 'contacts' | 'callback' | 'call'
    call: null,
    agentName: null,
    typingName: null,
    sentThisPage: false
  };
  var loadWaiters = [];
  var onlineWaiters = [];
  var localSeq = 0;

  // A "visit" is a run of page views less than 30 minutes apart, which is what
  // the `visits` rule counts.
  var VISITS = (function () {
    var v = loadJSON(K_VISITS, {});
    var n = Number(v.n) || 0;
    var now = Date.now();
    if (!n || now - (Number(v.t) || 0) > 30 * 60 * 1000) n++;
    save(K_VISITS, JSON.stringify({ n: n, t: now }));
    return n;
  })();

  window.jivo_config = Object.assign(
    window.jivo_config && typeof window.jivo_config === 'object' ? window.jivo_config : {},
    { widget_id: WIDGET_ID, widget_color: S.color }
  );

  // ---------------------------------------------------------------- network
  function backoff(n) {
    return Math.min(60000, 1000 * Math.pow(2, n)) * (0.75 + Math.random() / 2);
  }
  function setToken(t) {
    S.token = t || null;
    save(K_TOKEN, S.token);
  }
  function pageInfo() {
    return { url: location.href, title: document.title, referrer: document.referrer };
  }

  // Resolves (never rejects) with {status, data, ok}; status 0 means the hub was
  // not reached, so callers can tell "retry later" from "the hub said no".
  function req(method, path, body) {
    var headers = { Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (S.token) headers.Authorization = 'Bearer ' + S.token;
    var ctl = typeof AbortController === 'function' ? new AbortController() : null;
    var timer = ctl ? setTimeout(function () { ctl.abort(); }, 20000) : 0;
    return fetch(API + path, {
      method: method,
      headers: headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      mode: 'cors',
      credentials: 'omit',
      cache: 'no-store',
      // A setter called just before the page navigates away still arrives.
      keepalive: body === undefined || JSON.stringify(body).length < 60000,
      signal: ctl ? ctl.signal : undefined
    }).then(function (r) {
      return r.text().then(function (t) {
        var data = null;
        try { data = t ? JSON.parse(t) : null; } catch (e) { /* not JSON: judged by status */ }
        return { status: r.status, data: data };
      });
    }, function () {
      return { status: 0, data: null };
    }).then(function (res) {
      clearTimeout(timer);
      res.ok = res.status >= 200 && res.status < 300 && !(res.data && res.data.result === 'fail');
      // A token the hub no longer accepts (secret rotated, visitor removed) is
      // replaced by a fresh session rather than failing every call from now on.
      if (res.status === 401 && path !== '/session') startSession();
      return res;
    });
  }
  function failOf(res) {
    var d = res.data;
    if (d && d.result === 'fail') return d;
    var msg = d && d.error ? (typeof d.error === 'string' ? d.error : d.error.message || d.error.code) : null;
    return fail(msg || (res.status ? 'HTTP ' + res.status : 'the hub cannot be reached'));
  }
  function reasonOf(r) {
    return String((r && (r.reason || r.error)) || 'failed');
  }
  function whenOnline() {
    return S.conn === 'ok' ? Promise.resolve() : new Promise(function (r) { onlineWaiters.push(r); });
  }
  // A call waits for the user token the page set before it, so the hub knows
  // the token when it handles the call: the webhooks it causes carry it.
  var tokenSent = Promise.resolve();
  function post(path, body) {
    var token = tokenSent;
    return whenOnline()
      .then(function () { return token; })
      .then(function () { return req('POST', path, body); });
  }
  function setConn(c) {
    S.conn = c;
    if (c === 'ok') {
      onlineWaiters.splice(0).forEach(function (r) { r(); });
      pump();
    }
    renderHead();
    renderCompose();
  }
  function markLoaded() {
    if (S.loaded) return;
    S.loaded = true;
    loadWaiters.splice(0).forEach(function (f) { f(); });
    maybeFireLoad();
  }
  function maybeFireLoad() {
    if (S.loaded && S.mounted && !S.loadFired) {
      S.loadFired = true;
      fire('Load');
    }
  }

  var sessionBusy = false;
  var sessionTries = 0;
  var sessionTimer = 0;
  function startSession() {
    if (sessionBusy || S.destroyed) return;
    sessionBusy = true;
    clearTimeout(sessionTimer);
    var sentToken = S.token;
    req('POST', '/session', { token: sentToken || null, page: pageInfo() }).then(function (res) {
      sessionBusy = false;
      if (res.ok && res.data && (res.data.token || sentToken)) {
        sessionTries = 0;
        applySession(res.data);
        setConn('ok');
        openStream(true);
      } else if (sentToken && res.status === 401) {
        // The stored token is dead; a new visitor is better than no chat at all.
        setToken(null);
        startSession();
        return;
      } else if (res.status === 403 || res.status === 404) {
        // This site may not use the widget, or the widget is gone: asking
        // again will not change the answer.
        S.refused = true;
        setConn('down');
      } else {
        if (S.conn !== 'ok') setConn('down');
        sessionTimer = setTimeout(startSession, backoff(sessionTries++));
      }
      markLoaded();
    });
  }

  function applySession(d) {
    setToken(d.token || S.token);
    S.visitor = d.visitor && typeof d.visitor === 'object' ? d.visitor : S.visitor;
    S.chatMode = normMode(d.chat_mode);
    if (!S.colorFromPage && validColor(d.color)) S.color = String(d.color).trim();
    S.contact = normContact(d.contact_info);
    S.chat = d.chat && typeof d.chat === 'object' ? { id: d.chat.id == null ? null : d.chat.id, state: String(d.chat.state || 'open') } : null;
    if (d.callback && d.callback.result) S.callback = d.callback;
    var history = Array.isArray(d.messages) ? d.messages.map(normMsg).filter(Boolean) : [];
    // What only this page knows (unsent messages, invitations) stays after the history.
    var local = S.msgs.filter(function (m) { return m.local === 'pending' || m.local === 'failed' || m.local === 'proactive'; });
    S.msgs = history.concat(local);
    S.agentName = S.chat && S.chat.state === 'accepted' ? lastAgentName() : null;
    var seen = load(K_SEEN);
    var idx = seen ? indexOfKey(seen) : -1;
    if (S.vis === 'open') S.unread = 0;
    else if (idx >= 0) S.unread = S.msgs.slice(idx + 1).filter(countsAsUnread).length;
    else S.unread = Math.max(0, Number(d.unread) || 0);
    if (S.vis === 'open') markSeen();
    renderAll();
  }

  // ---------------------------------------------------------------- stream
  // Message events carry the message's id. The stream opens after the newest
  // message the page has (`after`), and the browser's own reconnects send the
  // last id they saw (`Last-Event-ID`): either way the hub first sends what
  // the page missed, in order. On top of that the page asks for its messages
  // again after every reconnect, so a proxy that drops the header or a hub
  // that lost track cannot make it miss a reply.
  var es = null;
  var streamTries = 0;
  var streamTimer = 0;
  var typingTimer = 0;
  function closeStream() {
    clearTimeout(streamTimer);
    if (es) { es.close(); es = null; }
  }
  function lastMsgId() {
    var last = 0;
    S.msgs.forEach(function (m) {
      var n = Number(m.id);
      if (!m.local && m.id != null && isFinite(n) && n > last) last = n;
    });
    return last;
  }
  // `fresh`: the page has just read its history with the session.
  function openStream(fresh) {
    closeStream();
    if (!S.token || S.destroyed || typeof EventSource !== 'function') return;
    var src = new EventSource(API + '/stream?token=' + encodeURIComponent(S.token) + '&after=' + lastMsgId());
    var missed = !fresh;
    es = src;
    src.onopen = function () {
      streamTries = 0;
      if (missed) showNewer(src);
      missed = false;
    };
    src.onerror = function () {
      if (es !== src) return;
      missed = true;
      // While CONNECTING the browser retries by itself; CLOSED means it gave up
      // (HTTP error, bad token), so a fresh session re-checks the token and
      // fetches what was missed before the stream is opened again.
      if (src.readyState !== 2) return;
      es = null;
      src.close();
      streamTimer = setTimeout(startSession, Math.min(backoff(streamTries++), 15000));
    };
    listen(src, 'message', onStreamMessage);
    listen(src, 'typing', onStreamTyping);
    listen(src, 'chat', onStreamChat);
    listen(src, 'mode', function (d) {
      S.chatMode = normMode(d.chat_mode);
      renderHead();
      renderCompose();
    });
    listen(src, 'call', onStreamCall);
  }
  // Messages newer than the newest the page has, read from the hub: after a
  // reconnect of stream `src` (what it may have missed), and after an offline
  // message (the visitor's window keeps it, as their own).
  function showNewer(src) {
    req('GET', '/messages').then(function (res) {
      if ((src && es !== src) || !res.ok || !res.data || !Array.isArray(res.data.messages)) return;
      var last = lastMsgId();
      res.data.messages.map(normMsg)
        .filter(function (m) { return m && Number(m.id) > last; })
        .sort(function (a, b) { return Number(a.id) - Number(b.id); })
        .forEach(onStreamMessage);
    });
  }
  // Back on a network: reconnect now rather than at the browser's next retry.
  window.addEventListener('online', function () {
    if (es && es.readyState !== 1 && !S.destroyed) openStream(false);
  });
  function listen(src, name, fn) {
    src.addEventListener(name, function (e) {
      if (es !== src) return;
      var d = null;
      try { d = JSON.parse(e.data); } catch (x) { return; }
      if (d && typeof d === 'object') fn(d);
    });
  }

  function onStreamMessage(d) {
    var m = normMsg(d);
    if (!m || (m.key && indexOfKey(m.key) >= 0)) return; // already here (history or our own POST answer)
    if (m.author === 'client') {
      // The stream can beat the POST answer for the visitor's own message.
      var p = S.msgs.find(function (x) { return x.local === 'pending' && x.text === m.text; });
      if (p) { replaceMsg(p, m); return; }
      addMsg(m);
      return;
    }
    addMsg(m);
    if (m.author !== 'agent' && m.author !== 'bot') return;
    if (m.author === 'agent' && m.name && S.chat && S.chat.state === 'accepted') S.agentName = m.name;
    if (S.typingName !== null && (!m.name || m.name === S.typingName || m.author === 'agent')) S.typingName = null;
    if (S.vis === 'open') markSeen();
    else S.unread++;
    renderBadge();
    renderHead();
    renderTyping();
    fire('MessageReceived', pub(m));
  }
  function onStreamTyping(d) {
    S.typingName = d.typing ? String(d.name || '') : null;
    clearTimeout(typingTimer);
    // A lost "typing:false" must not leave the indicator on forever.
    if (S.typingName !== null) typingTimer = setTimeout(function () { S.typingName = null; renderTyping(); }, 8000);
    renderTyping();
  }
  function onStreamChat(d) {
    var state = String(d.state || '');
    if (!state) return;
    var prev = S.chat ? S.chat.state : null;
    var id = d.id != null ? d.id : d.chat_id != null ? d.chat_id : S.chat ? S.chat.id : null;
    S.chat = { id: id, state: state };
    if (state === 'accepted') {
      S.agentName = d.agent && d.agent.name ? String(d.agent.name) : S.agentName || lastAgentName();
      if (prev !== 'accepted') fire('Accept');
    } else if (state === 'closed') {
      S.agentName = null;
      S.typingName = null;
    }
    renderHead();
    renderTyping();
    renderCompose();
  }
  function onStreamCall(d) {
    var status = String(d.status || '');
    if (status === 'start') {
      if (!S.call) S.call = { phone: '', started: false };
      callStarted();
    } else if (status === 'end' || status === 'error') {
      var result = status === 'error' || d.result === 'fail' ? 'fail' : 'ok';
      var out = { result: result };
      if (result === 'fail') out.reason = d.reason != null ? String(d.reason) : 'call failed';
      endCall(out);
      return;
    } else if (S.call) {
      S.call.status = status;
    }
    renderCall();
  }

  // --------------------------------------------------------------- messages
  function normMsg(m) {
    if (!m || typeof m !== 'object') return null;
    var author = /^(client|agent|bot|auto)$/.test(m.author) ? m.author : 'agent';
    var t = Number(m.created_at) || Date.now();
    if (t < 1e12) t *= 1000; // seconds from a lenient sender
    return {
      key: m.id == null ? null : 'h' + String(m.id),
      id: m.id == null ? null : m.id,
      author: author,
      name: m.name == null || m.name === '' ? null : String(m.name),
      text: m.text == null ? '' : String(m.text),
      buttons: Array.isArray(m.buttons)
        ? m.buttons.filter(function (b) { return b && b.text != null; }).map(function (b) {
          return { text: String(b.text), id: b.id == null ? null : String(b.id) };
        })
        : [],
      created_at: t,
      local: null
    };
  }
  function localMsg(author, text, kind) {
    return { key: 'l' + ++localSeq, id: null, author: author, name: null, text: text, buttons: [], created_at: Date.now(), local: kind };
  }
  function pub(m) {
    var o = { id: m.id, author: m.author, name: m.name, text: m.text, created_at: m.created_at };
    if (m.buttons.length) o.buttons = m.buttons.map(function (b) { return { text: b.text, id: b.id }; });
    return o;
  }
  function indexOfKey(key) {
    for (var i = 0; i < S.msgs.length; i++) if (S.msgs[i].key === key) return i;
    return -1;
  }
  function countsAsUnread(m) {
    return !m.local && (m.author === 'agent' || m.author === 'bot');
  }
  function lastAgentName() {
    for (var i = S.msgs.length - 1; i >= 0; i--) {
      if (S.msgs[i].author === 'agent' && S.msgs[i].name && !S.msgs[i].local) return S.msgs[i].name;
    }
    return null;
  }
  // Remembering the last message seen keeps the unread badge right across reloads
  // even though nothing tells the hub what the visitor has read.
  function markSeen() {
    for (var i = S.msgs.length - 1; i >= 0; i--) {
      if (!S.msgs[i].local && S.msgs[i].key) { save(K_SEEN, S.msgs[i].key); return; }
    }
  }
  function chatIsOpen() {
    return !!S.chat && S.chat.state !== 'closed';
  }

  // Visitor messages go out one at a time, in order, and wait for the session
  // while the hub is unreachable instead of being lost.
  var outbox = [];
  var outboxBusy = false;
  function queueMessage(text) {
    var m = localMsg('client', text, 'pending');
    addMsg(m, true);
    var startsChat = !chatIsOpen();
    if (startsChat) S.chat = { id: null, state: 'open' };
    outbox.push({ m: m, startsChat: startsChat, tries: 0 });
    stopTyping();
    renderCompose();
    pump();
  }
  function pump() {
    if (outboxBusy || !outbox.length || S.conn !== 'ok') return;
    outboxBusy = true;
    var item = outbox[0];
    req('POST', '/messages', { text: item.m.text }).then(function (res) {
      outboxBusy = false;
      if (res.status === 0 || res.status === 401 || res.status === 502 || res.status === 503 || res.status === 504) {
        setTimeout(pump, backoff(item.tries++));
        return;
      }
      outbox.shift();
      if (res.ok) {
        var m = normMsg(res.data && res.data.message);
        if (m && m.key && indexOfKey(m.key) >= 0) removeMsg(item.m);
        else if (m) replaceMsg(item.m, m);
        else { item.m.local = 'sent'; replaceMsg(item.m, item.m); }
        if (item.startsChat) fire('ClientStartChat');
        if (!S.sentThisPage) {
          S.sentThisPage = true;
          fire('MessageSent', pub(m || item.m));
        }
      } else {
        item.m.local = 'failed';
        item.m.error = reasonOf(failOf(res));
        replaceMsg(item.m, item.m);
        if (item.startsChat && S.chat && S.chat.id == null && S.chat.state === 'open') S.chat = null;
        renderCompose();
      }
      pump();
    });
  }

  var typingOn = false;
  var typingSentAt = 0;
  var typingIdle = 0;
  function onInputTyping() {
    if (!U.input.value.trim()) { stopTyping(); return; }
    clearTimeout(typingIdle);
    typingIdle = setTimeout(stopTyping, 5000);
    var now = Date.now();
    // The hub relays typing to agents; every 2 s keeps it alive without flooding.
    if (S.conn === 'ok' && now - typingSentAt >= 2000) {
      typingSentAt = now;
      typingOn = true;
      req('POST', '/typing', { typing: true });
    }
  }
  function stopTyping() {
    clearTimeout(typingIdle);
    if (!typingOn) return;
    typingOn = false;
    typingSentAt = 0;
    if (S.conn === 'ok') req('POST', '/typing', { typing: false });
  }

  // ------------------------------------------------------------------ calls
  function callStarted() {
    if (S.call && !S.call.started) {
      S.call.started = true;
      fire('CallStart');
    }
  }
  function endCall(out) {
    var had = !!S.call;
    S.call = null;
    renderCall();
    if (had || out.result === 'fail') fire('CallEnd', out);
    if (S.view === 'call') setUi(null, 'chat');
  }
  function checkCallback() {
    if (S.conn === 'down') return Promise.resolve(fail('the hub cannot be reached'));
    return whenOnline().then(function () { return req('GET', '/callback'); }).then(function (res) {
      var r = res.data && (res.data.result === 'ok' || res.data.result === 'fail') ? res.data : failOf(res);
      if (res.data && res.data.result) S.callback = res.data;
      renderCallbackStatus();
      return Object.assign({}, r);
    });
  }

  // ------------------------------------------------------------- validation
  function fail(reason) { return { result: 'fail', reason: reason }; }
  function ok() { return { result: 'ok' }; }
  function needHub() {
    return S.conn === 'down' ? fail('the hub cannot be reached') : null;
  }
  function normMode(m) {
    return m === 'online' || m === 1 || m === '1' || m === true ? 'online' : 'offline';
  }
  function normContact(c) {
    c = c && typeof c === 'object' ? c : {};
    var o = {};
    o.client_name = strOrNull(c.client_name != null ? c.client_name : c.name);
    o.email = strOrNull(c.email);
    o.phone = strOrNull(c.phone);
    o.description = strOrNull(c.description);
    return o;
  }
  function strOrNull(v) {
    return v == null || v === '' ? null : String(v);
  }
  // Lenient about numbers (a phone typed as 5550100), strict about anything else.
  function cleanFields(obj, keys) {
    var out = {};
    for (var i = 0; i < keys.length; i++) {
      var k = keys[i];
      var v = obj[k];
      if (v == null) continue;
      if (typeof v === 'number' && isFinite(v)) v = String(v);
      if (typeof v !== 'string') return { bad: k + ' must be a string' };
      v = v.trim();
      if (v) out[k] = v;
    }
    return { out: out };
  }
  function validColor(c) {
    if (typeof c !== 'string' || !c.trim()) return false;
    if (window.CSS && CSS.supports) return CSS.supports('color', c.trim());
    return /^#([0-9a-f]{3,4}|[0-9a-f]{6}|[0-9a-f]{8})$/i.test(c.trim());
  }
  function rgbOf(c) {
    var m = /^#([0-9a-f]{3}|[0-9a-f]{6})$/i.exec(c);
    if (m) {
      var h = m[1].length === 3 ? m[1].replace(/./g, '$&$&') : m[1];
      return [0, 2, 4].map(function (i) { return parseInt(h.substr(i, 2), 16); });
    }
    // Named and functional colours: let the browser resolve them.
    if (U.probe) {
      U.probe.style.color = '';
      U.probe.style.color = c;
      var r = /(\d+)[, ]+(\d+)[, ]+(\d+)/.exec(getComputedStyle(U.probe).color);
      if (r) return [+r[1], +r[2], +r[3]];
    }
    return null;
  }
  function isLight(c) {
    var rgb = rgbOf(c);
    if (!rgb) return false;
    var l = rgb.map(function (v) {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2] > 0.45;
  }

  // ------------------------------------------------------------------ rules
  var ruleTimers = [];
  var invited = {};
  function applyRules(list) {
    ruleTimers.forEach(clearTimeout);
    ruleTimers = [];
    list.forEach(function (r) {
      if (!r || typeof r !== 'object' || typeof r.text !== 'string' || !r.text.trim()) return;
      // A rule without `type` is read from the keys it has.
      var type = r.type || (r.seconds != null ? 'time_on_page' : r.pattern != null ? 'url' : r.min != null ? 'visits' : '');
      var text = r.text;
      var key = type + '\u0000' + text;
      if (type === 'time_on_page') {
        var wait = Math.max(0, (Number(r.seconds) || 0) * 1000 - performance.now());
        ruleTimers.push(setTimeout(function () { invite(key, text); }, wait));
      } else if (type === 'url') {
        if (r.pattern != null && String(r.pattern) !== '' && location.href.indexOf(String(r.pattern)) >= 0) invite(key, text);
      } else if (type === 'visits') {
        if (VISITS >= (Number(r.min) || 0)) invite(key, text);
      }
    });
  }
  function invite(key, text) {
    if (invited[key] || S.destroyed) return; // once per page load
    invited[key] = true;
    showInvitation(text);
  }
  function showInvitation(text) {
    addMsg(localMsg('agent', text, 'proactive'), true);
    setUi('open', 'chat');
  }

  // --------------------------------------------------------------------- UI
  var U = {};
  var SVG_NS = 'http://www.w3.org/2000/svg';
  var ICONS = {
    chat: 'M12 3C6.5 3 2 6.6 2 11c0 2.4 1.3 4.6 3.4 6.1L4.5 21l4.3-2.3c1 .3 2.1.4 3.2.4 5.5 0 10-3.6 10-8S17.5 3 12 3z',
    person: 'M12 12a4 4 0 1 0 0-8 4 4 0 0 0 0 8zm0 2c-3.3 0-8 1.7-8 5v1h16v-1c0-3.3-4.7-5-8-5z',
    minus: 'M5 11h14v2H5z',
    close: 'M6.4 5 5 6.4l5.6 5.6L5 17.6 6.4 19l5.6-5.6 5.6 5.6 1.4-1.4-5.6-5.6L19 6.4 17.6 5 12 10.6z'
  };

  // Font, colour and line height are inherited into a shadow tree, so they are
  // all set explicitly on the root; the host itself is reset with `all: initial`.
  var CSS_TEXT = `
.r{font:14px/1.4 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1f2328;text-align:left;letter-spacing:normal;word-spacing:normal;text-transform:none;font-style:normal;font-weight:400;direction:ltr}
.r *,.r *::before,.r *::after{box-sizing:border-box}
[hidden]{display:none!important}
button{font:inherit;cursor:pointer;margin:0}
svg{width:20px;height:20px;fill:currentColor;display:block}
.launcher{position:fixed;right:20px;bottom:20px;width:60px;height:60px;border-radius:50%;border:0;padding:0;background:var(--c);color:var(--fg);box-shadow:0 4px 14px rgba(0,0,0,.25);display:flex;align-items:center;justify-content:center;transition:transform .15s}
.launcher:hover{transform:scale(1.06)}
.launcher svg{width:30px;height:30px}
.badge{position:absolute;top:-3px;right:-3px;min-width:20px;height:20px;padding:0 6px;border-radius:10px;background:#e53935;color:#fff;font-size:12px;font-weight:600;line-height:20px;text-align:center}
.win{position:fixed;right:20px;bottom:20px;width:360px;height:520px;max-width:calc(100vw - 40px);max-height:calc(100vh - 40px);background:#fff;border-radius:12px;box-shadow:0 8px 32px rgba(0,0,0,.28);display:flex;flex-direction:column;overflow:hidden}
.win.min{height:auto}
.win.min .body{display:none}
.win.min .head{cursor:pointer}
.head{background:var(--c);color:var(--fg);display:flex;align-items:center;gap:2px;padding:8px 8px 8px 16px;min-height:56px;flex:none}
.titles{flex:1;min-width:0}
.title{font-weight:600;font-size:16px}
.sub{font-size:12px;opacity:.85;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.hbtn{background:transparent;border:0;color:inherit;width:32px;height:32px;border-radius:6px;display:flex;align-items:center;justify-content:center;padding:0}
.hbtn:hover,.hbtn:focus-visible{background:rgba(128,128,128,.25)}
.body{flex:1;display:flex;flex-direction:column;min-height:0}
.view{flex:1;display:flex;flex-direction:column;min-height:0}
.list{flex:1;overflow-y:auto;padding:12px;display:flex;flex-direction:column;gap:8px;background:#f5f6f8}
.msg{max-width:82%;display:flex;flex-direction:column;align-items:flex-start;align-self:flex-start}
.msg.client{align-self:flex-end;align-items:flex-end}
.msg.auto{align-self:center;align-items:center;max-width:92%}
.name{font-size:12px;color:#656d76;margin:0 4px 2px}
.bubble{padding:8px 12px;border-radius:14px;background:#fff;border:1px solid #e1e4e8;white-space:pre-wrap;overflow-wrap:anywhere}
.client .bubble{background:var(--c);color:var(--fg);border-color:transparent}
.auto .bubble{background:transparent;border:0;color:#656d76;font-size:12px;text-align:center;padding:2px 8px}
.proactive .bubble{border-color:var(--ct)}
.bubble a{color:inherit;text-decoration:underline}
.meta{font-size:11px;color:#8b949e;margin:2px 4px 0}
.pending .bubble{opacity:.6}
.failed .bubble{box-shadow:0 0 0 1px #d32f2f}
.failed .meta{color:#c62828;cursor:pointer}
.btns{display:flex;flex-wrap:wrap;gap:6px;margin-top:6px}
.btns button{border:1px solid var(--ct);color:var(--ct);background:#fff;border-radius:14px;padding:5px 12px}
.btns button:disabled{opacity:.5;cursor:default}
.typing{flex:none;padding:4px 14px;font-size:12px;font-style:italic;color:#656d76;background:#f5f6f8}
.compose{flex:none;display:flex;gap:8px;padding:10px;border-top:1px solid #e1e4e8;align-items:flex-end;background:#fff}
textarea,input{font:inherit;color:#1f2328;background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:8px 10px;margin:0;width:100%;outline:none}
textarea:focus,input:focus{border-color:var(--ct);box-shadow:0 0 0 2px rgba(128,128,128,.15)}
.compose textarea{flex:1;resize:none;min-height:38px;max-height:120px;height:38px;overflow-y:auto}
.primary{background:var(--c);color:var(--fg);border:0;border-radius:8px;padding:0 14px;height:38px;font-weight:600;flex:none}
.primary:disabled{opacity:.6;cursor:default}
.secondary{background:#fff;color:#1f2328;border:1px solid #d0d7de;border-radius:8px;padding:0 14px;height:38px;flex:none}
.f{display:flex;flex-direction:column;gap:8px;padding:12px 14px;overflow-y:auto;background:#fff}
.chatview .list{min-height:72px}
.chatview .f{flex:0 1 auto;min-height:0;border-top:1px solid #e1e4e8}
.f label{display:flex;flex-direction:column;gap:3px;font-size:12px;color:#57606a}
.f textarea{resize:vertical;min-height:60px}
.note{font-size:13px;color:#424a53}
.err{font-size:12px;color:#c62828}
.actions{display:flex;gap:8px;justify-content:flex-end}
@media (max-width:480px),(max-height:560px){.win{right:0;bottom:0;width:100vw;height:100vh;height:100dvh;max-width:none;max-height:none;border-radius:0}.win.min{height:auto}}
`;

  function h(tag, props, kids) {
    var el = document.createElement(tag);
    if (tag === 'button') el.type = 'button';
    if (props) {
      Object.keys(props).forEach(function (k) {
        var v = props[k];
        if (v == null || v === false) return;
        if (k === 'text') el.textContent = v;
        else if (k === 'class') el.className = v;
        else if (k === 'testid') el.setAttribute('data-testid', v);
        else if (k.slice(0, 2) === 'on') el.addEventListener(k.slice(2), v);
        else el.setAttribute(k, v === true ? '' : String(v));
      });
    }
    (kids || []).forEach(function (c) {
      if (c) el.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    });
    return el;
  }
  function icon(name) {
    var s = document.createElementNS(SVG_NS, 'svg');
    s.setAttribute('viewBox', '0 0 24 24');
    s.setAttribute('aria-hidden', 'true');
    var p = document.createElementNS(SVG_NS, 'path');
    p.setAttribute('d', ICONS[name]);
    s.appendChild(p);
    return s;
  }
  function input(testid, type, autocomplete) {
    return h('input', { testid: testid, type: type, autocomplete: autocomplete });
  }
  function labelled(text, el) {
    return h('label', null, [text, el]);
  }

  function build() {
    U.host = h('div', { id: 'hub-widget' });
    // Inline !important beats any page rule aimed at the host element itself
    // (e.g. `div { display: none }`); the zero-size box never covers the page.
    U.host.style.cssText = 'all:initial!important;display:block!important;position:fixed!important;right:0!important;bottom:0!important;width:0!important;height:0!important;overflow:visible!important;z-index:2147483000!important';
    var root = U.host.attachShadow({ mode: 'open' });
    root.appendChild(h('style', { text: CSS_TEXT }));

    U.badge = h('span', { class: 'badge', testid: 'hub-widget-unread', hidden: true });
    U.launcher = h('button', {
      class: 'launcher', testid: 'hub-widget-button', 'aria-label': 'Open chat',
      onclick: function () { userOpen(); }
    }, [icon('chat'), U.badge]);

    U.sub = h('div', { class: 'sub', testid: 'hub-widget-status' });
    U.head = h('div', {
      class: 'head',
      onclick: function (e) {
        if (S.vis === 'min' && !e.target.closest('button')) userOpen();
      }
    }, [
      h('div', { class: 'titles' }, [h('div', { class: 'title', text: 'Chat' }), U.sub]),
      h('button', {
        class: 'hbtn', testid: 'hub-contacts-open', title: 'Your contact details', 'aria-label': 'Your contact details',
        onclick: function () { openContacts(); }
      }, [icon('person')]),
      U.minBtn = h('button', {
        class: 'hbtn', testid: 'hub-widget-minimise', title: 'Minimise', 'aria-label': 'Minimise',
        onclick: function () { if (S.vis === 'min') userOpen(); else setUi('min'); }
      }, [icon('minus')]),
      h('button', {
        class: 'hbtn', testid: 'hub-widget-close', title: 'Close', 'aria-label': 'Close chat',
        onclick: function () { methods.close(); }
      }, [icon('close')])
    ]);

    // Chat view: messages, typing, and either the composer or the offline form.
    U.list = h('div', { class: 'list', role: 'log', 'aria-live': 'polite', testid: 'hub-widget-messages' });
    U.typing = h('div', { class: 'typing', testid: 'hub-widget-typing', hidden: true });
    U.input = h('textarea', {
      testid: 'hub-widget-input', rows: '1', placeholder: 'Type a message\u2026', 'aria-label': 'Message',
      onkeydown: function (e) {
        if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
          e.preventDefault();
          sendFromInput();
        }
      },
      oninput: function () { autosize(); onInputTyping(); }
    });
    U.send = h('button', { class: 'primary', testid: 'hub-widget-send', text: 'Send', onclick: sendFromInput });
    U.compose = h('div', { class: 'compose' }, [U.input, U.send]);

    U.off = {
      name: input('hub-offline-name', 'text', 'name'),
      email: input('hub-offline-email', 'email', 'email'),
      phone: input('hub-offline-phone', 'tel', 'tel'),
      message: h('textarea', { testid: 'hub-offline-message', rows: '3' }),
      error: h('div', { class: 'err', testid: 'hub-offline-error', role: 'alert', hidden: true }),
      done: h('div', { class: 'note', testid: 'hub-offline-done', hidden: true }),
      submit: h('button', { class: 'primary', type: 'submit', testid: 'hub-offline-submit', text: 'Send' })
    };
    U.offline = h('form', { class: 'f', testid: 'hub-offline-form', novalidate: true, onsubmit: submitOffline }, [
      h('div', { class: 'note', text: 'No one is online right now. Leave a message and we will get back to you.' }),
      labelled('Name', U.off.name),
      labelled('Email', U.off.email),
      labelled('Phone', U.off.phone),
      labelled('Message', U.off.message),
      U.off.error,
      U.off.done,
      h('div', { class: 'actions' }, [U.off.submit])
    ]);
    U.chatView = h('div', { class: 'view chatview' }, [U.list, U.typing, U.compose, U.offline]);

    U.ct = {
      name: input('hub-contacts-name', 'text', 'name'),
      email: input('hub-contacts-email', 'email', 'email'),
      phone: input('hub-contacts-phone', 'tel', 'tel'),
      error: h('div', { class: 'err', testid: 'hub-contacts-error', role: 'alert', hidden: true })
    };
    U.contacts = h('form', { class: 'view f', testid: 'hub-contacts-form', novalidate: true, onsubmit: submitContacts }, [
      h('div', { class: 'note', text: 'Introduce yourself so we can reach you if the chat gets cut off.' }),
      labelled('Name', U.ct.name),
      labelled('Email', U.ct.email),
      labelled('Phone', U.ct.phone),
      U.ct.error,
      h('div', { class: 'actions' }, [
        h('button', { class: 'secondary', testid: 'hub-contacts-cancel', text: 'Back', onclick: function () { setUi(null, 'chat'); } }),
        h('button', { class: 'primary', type: 'submit', testid: 'hub-contacts-submit', text: 'Save' })
      ])
    ]);

    U.cb = {
      status: h('div', { class: 'note', testid: 'hub-callback-status', hidden: true }),
      phone: input('hub-callback-phone', 'tel', 'tel'),
      error: h('div', { class: 'err', testid: 'hub-callback-error', role: 'alert', hidden: true })
    };
    U.callbackView = h('form', { class: 'view f', testid: 'hub-callback-form', novalidate: true, onsubmit: submitCallback }, [
      h('div', { class: 'note', text: 'Leave your phone number and we will call you back.' }),
      U.cb.status,
      labelled('Phone', U.cb.phone),
      U.cb.error,
      h('div', { class: 'actions' }, [
        h('button', { class: 'secondary', testid: 'hub-callback-cancel', text: 'Back to chat', onclick: function () { setUi(null, 'chat'); } }),
        h('button', { class: 'primary', type: 'submit', testid: 'hub-callback-submit', text: 'Call me back' })
      ])
    ]);

    U.callText = h('div', { class: 'note', testid: 'hub-call-status' });
    U.callView = h('div', { class: 'view f', testid: 'hub-call-view' }, [
      U.callText,
      h('div', { class: 'actions' }, [
        h('button', { class: 'secondary', testid: 'hub-call-back', text: 'Back to chat', onclick: function () { setUi(null, 'chat'); } })
      ])
    ]);

    U.body = h('div', { class: 'body' }, [U.chatView, U.contacts, U.callbackView, U.callView]);
    U.win = h('div', { class: 'win', testid: 'hub-widget-window', role: 'dialog', 'aria-label': 'Chat', hidden: true }, [U.head, U.body]);
    U.probe = h('span', { hidden: true });
    U.root = h('div', { class: 'r' }, [U.launcher, U.win, U.probe]);
    root.appendChild(U.root);
  }

  function mount() {
    if (S.mounted || S.destroyed) return;
    if (!document.body) {
      document.addEventListener('DOMContentLoaded', mount, { once: true });
      return;
    }
    build();
    document.body.appendChild(U.host);
    S.mounted = true;
    renderAll();
    // A page that removes the widget's container (SPA re-render, cookie wall)
    // ends the widget, and the page is told so.
    if (typeof MutationObserver === 'function') {
      new MutationObserver(function () {
        if (!U.host.isConnected) destroy();
      }).observe(document.body, { childList: true });
    }
    maybeFireLoad();
  }

  function renderAll() {
    if (!S.mounted) return;
    renderTheme();
    renderMsgs();
    renderWin();
    renderHead();
    renderTyping();
    renderCompose();
    renderBadge();
    renderCall();
    renderCallbackStatus();
  }
  function renderTheme() {
    window.jivo_config.widget_color = S.color;
    if (!S.mounted) return;
    var light = isLight(S.color);
    U.root.style.setProperty('--c', S.color);
    U.root.style.setProperty('--fg', light ? '#1f2328' : '#fff');
    U.root.style.setProperty('--ct', light ? '#1f2328' : S.color);
  }
  function renderWin() {
    if (!S.mounted) return;
    U.launcher.hidden = S.vis !== 'label';
    U.win.hidden = S.vis === 'label';
    U.win.classList.toggle('min', S.vis === 'min');
    U.minBtn.title = S.vis === 'min' ? 'Restore' : 'Minimise';
    U.chatView.hidden = S.view !== 'chat';
    U.contacts.hidden = S.view !== 'contacts';
    U.callbackView.hidden = S.view !== 'callback';
    U.callView.hidden = S.view !== 'call';
  }
  function renderHead() {
    if (!S.mounted) return;
    var t;
    if (S.refused) t = 'Chat is not available on this site';
    else if (S.conn !== 'ok') t = 'Connecting\u2026';
    else if (S.agentName && S.chat && S.chat.state === 'accepted') t = S.agentName;
    else t = S.chatMode === 'online' ? 'We are online' : 'We are offline';
    U.sub.textContent = t;
  }
  function renderTyping() {
    if (!S.mounted) return;
    U.typing.hidden = S.typingName === null;
    U.typing.textContent = S.typingName === null ? '' : (S.typingName || 'Agent') + ' is typing\u2026';
  }
  function renderCompose() {
    if (!S.mounted) return;
    // Before the hub has answered, the composer stays: messages wait in the outbox.
    var offline = S.conn === 'ok' && S.chatMode === 'offline' && !chatIsOpen();
    U.offline.hidden = !offline;
    U.compose.hidden = offline;
  }
  function renderBadge() {
    if (!S.mounted) return;
    U.badge.hidden = S.unread <= 0;
    U.badge.textContent = S.unread > 99 ? '99+' : String(S.unread);
    U.launcher.setAttribute('aria-label', S.unread > 0 ? 'Open chat, ' + S.unread + ' unread' : 'Open chat');
  }
  function renderCall() {
    if (!S.mounted) return;
    var c = S.call;
    var st = c && c.status;
    U.callText.textContent = !c ? 'No call in progress.'
      : st === 'client_connected' ? 'Call in progress.'
        : st === 'agent_connected' ? 'An agent is calling you now\u2026'
          : 'We will call you' + (c.phone ? ' at ' + c.phone : '') + ' shortly.';
  }
  function renderCallbackStatus() {
    if (!S.mounted) return;
    var r = S.callback;
    var off = r && r.result === 'fail';
    U.cb.status.hidden = !off;
    U.cb.status.textContent = off ? 'Calls are unavailable: ' + reasonOf(r) : '';
  }

  function renderMsgs() {
    if (!S.mounted) return;
    U.list.textContent = '';
    S.msgs.forEach(function (m) { m.el = msgEl(m); U.list.appendChild(m.el); });
    U.list.scrollTop = U.list.scrollHeight;
  }
  function addMsg(m, own) {
    S.msgs.push(m);
    if (!S.mounted) return;
    var l = U.list;
    var atBottom = l.scrollHeight - l.scrollTop - l.clientHeight < 80;
    m.el = msgEl(m);
    l.appendChild(m.el);
    // Do not yank the visitor away from older messages they scrolled up to read.
    if (atBottom || own) l.scrollTop = l.scrollHeight;
  }
  function replaceMsg(old, m) {
    var i = S.msgs.indexOf(old);
    if (i < 0) { addMsg(m); return; }
    S.msgs[i] = m;
    if (!S.mounted || !old.el) return;
    var el = msgEl(m);
    old.el.replaceWith(el);
    m.el = el;
  }
  function removeMsg(m) {
    var i = S.msgs.indexOf(m);
    if (i >= 0) S.msgs.splice(i, 1);
    if (m.el) m.el.remove();
  }
  function msgEl(m) {
    var el = h('div', {
      class: 'msg ' + m.author + (m.local ? ' ' + m.local : ''),
      testid: 'hub-widget-message',
      'data-author': m.author,
      'data-id': m.id == null ? null : String(m.id),
      'data-local': m.local
    });
    if ((m.author === 'agent' || m.author === 'bot') && m.name) el.appendChild(h('div', { class: 'name', text: m.name }));
    var b = h('div', { class: 'bubble' });
    linkify(b, m.text);
    el.appendChild(b);
    if (m.buttons.length) {
      var row = h('div', { class: 'btns' });
      m.buttons.forEach(function (btn) {
        row.appendChild(h('button', {
          testid: 'hub-widget-bot-button', 'data-button-id': btn.id, text: btn.text,
          disabled: !!m.answered,
          onclick: function () {
            // One answer per question: the buttons stay as a record, disabled.
            m.answered = true;
            Array.prototype.forEach.call(row.children, function (x) { x.disabled = true; });
            queueMessage(btn.text);
          }
        }));
      });
      el.appendChild(row);
    }
    var meta = m.local === 'pending' ? 'Sending\u2026'
      : m.local === 'failed' ? 'Not sent: ' + (m.error || 'error') + '. Click to retry.'
        : m.author === 'auto' ? null : timeOf(m.created_at);
    if (meta) {
      el.appendChild(h('div', {
        class: 'meta', text: meta,
        onclick: m.local === 'failed' ? function () { removeMsg(m); queueMessage(m.text); } : null
      }));
    }
    return el;
  }
  function timeOf(t) {
    try {
      return new Date(t).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
    } catch (e) {
      return '';
    }
  }
  // Links are built as elements with an http(s) href checked by the pattern, so
  // text from agents or bots cannot smuggle markup or javascript: URLs.
  function linkify(el, text) {
    var re = /\bhttps?:\/\/[^\s<>"']+/gi;
    var last = 0;
    var m;
    while ((m = re.exec(text))) {
      var url = m[0].replace(/[.,;:!?)\]]+$/, '');
      if (url.length < 9) continue;
      if (m.index > last) el.appendChild(document.createTextNode(text.slice(last, m.index)));
      el.appendChild(h('a', { href: url, target: '_blank', rel: 'noopener noreferrer nofollow', text: url }));
      last = m.index + url.length;
      re.lastIndex = last;
    }
    if (last < text.length) el.appendChild(document.createTextNode(text.slice(last)));
  }
  function autosize() {
    U.input.style.height = 'auto';
    U.input.style.height = Math.min(Math.max(U.input.scrollHeight + 2, 38), 120) + 'px';
  }

  // ------------------------------------------------------------ UI actions
  function sendFromInput() {
    var text = U.input.value.trim();
    if (!text) return;
    U.input.value = '';
    autosize();
    queueMessage(text);
    U.input.focus();
  }
  function userOpen() {
    methods.open();
    if (S.view === 'chat' && !U.compose.hidden) U.input.focus();
  }
  function openContacts() {
    U.ct.name.value = S.contact.client_name || '';
    U.ct.email.value = S.contact.email || '';
    U.ct.phone.value = S.contact.phone || '';
    U.ct.error.hidden = true;
    setUi('open', S.view === 'contacts' ? 'chat' : 'contacts');
    if (S.view === 'contacts') U.ct.name.focus();
  }
  function showErr(el, text) {
    if (!el) return;
    el.textContent = text || '';
    el.hidden = !text;
  }
  function submitContacts(e) {
    e.preventDefault();
    var r = methods.setContactInfo({ name: U.ct.name.value, email: U.ct.email.value, phone: U.ct.phone.value });
    if (r.result !== 'ok') { showErr(U.ct.error, reasonOf(r)); return; }
    showErr(U.ct.error, '');
    setUi(null, 'chat');
  }
  function submitOffline(e) {
    e.preventDefault();
    var data = { name: U.off.name.value, email: U.off.email.value, phone: U.off.phone.value, message: U.off.message.value };
    showErr(U.off.error, '');
    U.off.done.hidden = true;
    var r = offlineMessage(data, function (res) {
      U.off.submit.disabled = false;
      if (res.result === 'ok') {
        U.off.message.value = '';
        U.off.done.textContent = 'Thank you! Your message has been sent.';
        U.off.done.hidden = false;
      } else {
        showErr(U.off.error, reasonOf(res));
      }
    });
    if (r.result !== 'ok') showErr(U.off.error, reasonOf(r));
    else U.off.submit.disabled = true;
  }
  function submitCallback(e) {
    e.preventDefault();
    showErr(U.cb.error, '');
    var r = methods.startCall(U.cb.phone.value);
    if (r.result !== 'ok') showErr(U.cb.error, reasonOf(r));
  }

  // -------------------------------------------------------- window state
  function stateName() {
    if (S.vis === 'label') return 'label';
    if (S.vis === 'min') return 'chat/min';
    if (S.view === 'callback') return 'chat/call';
    if (S.view === 'call') return 'call';
    return 'chat';
  }
  function sizeOf() {
    if (!S.mounted) return { width: 0, height: 0 };
    var r = (S.vis === 'label' ? U.launcher : U.win).getBoundingClientRect();
    return { width: Math.round(r.width), height: Math.round(r.height) };
  }
  // Every transition goes through here so each callback fires once per real change.
  function setUi(vis, view) {
    var before = stateName();
    var wasVis = S.vis;
    if (vis) S.vis = vis;
    if (view) S.view = view;
    if (S.vis === 'open' && wasVis !== 'open') {
      S.unread = 0;
      markSeen();
      renderBadge();
    }
    renderWin();
    if (S.mounted && S.vis === 'open' && wasVis !== 'open') U.list.scrollTop = U.list.scrollHeight;
    if (S.view === 'callback' && before !== 'chat/call') {
      showErr(U.cb && U.cb.error, '');
      checkCallback();
    }
    var after = stateName();
    if (wasVis === 'label' && S.vis !== 'label') fire('Open');
    if (wasVis !== 'label' && S.vis === 'label') fire('Close');
    if (after !== before) fire('ChangeState', after);
    if (S.vis !== wasVis) fire('Resize', sizeOf());
  }

  // ------------------------------------------------------------ widget_api
  function offlineMessage(data, after) {
    function bad(error) { return { result: 'fail', error: error }; }
    if (!data || typeof data !== 'object' || Array.isArray(data)) return bad('parameters must be an object');
    var c = cleanFields(data, ['name', 'email', 'phone', 'description', 'message']);
    if (c.bad) return bad(c.bad);
    var d = c.out;
    if (!d.message) return bad('message is required');
    if (!d.email && !d.phone) return bad('email or phone is required');
    if (d.email && !EMAIL_RE.test(d.email)) return bad('invalid email');
    if (d.phone && !PHONE_RE.test(d.phone)) return bad('invalid phone number');
    if (S.conn === 'down') return bad('the hub cannot be reached');
    post('/offline-messages', d).then(function (res) {
      if (res.ok) showNewer(null);
      var r = res.ok ? ok() : failOf(res);
      if (r.result === 'fail' && !r.error) r = { result: 'fail', error: reasonOf(r) };
      if (after) after(r);
    });
    return ok();
  }

  var impl = {
    open: function (opts) {
      if (opts && typeof opts === 'object' && opts.start === 'call') setUi('open', 'callback');
      else if (S.vis !== 'open') setUi('open', S.vis === 'label' ? (S.call ? 'call' : 'chat') : null);
      return ok();
    },
    close: function () {
      if (S.vis !== 'label') setUi('label', S.call ? 'call' : 'chat');
      return ok();
    },
    chatMode: function () {
      return S.chatMode;
    },
    getContactInfo: function () {
      return Object.assign({}, S.contact);
    },
    getVisitorNumber: function (cb) {
      if (typeof cb !== 'function') return fail('callback must be a function');
      var answer = function () {
        var n = S.visitor && S.visitor.number;
        if (n != null && n !== '') safeCall(cb, null, isNaN(Number(n)) ? n : Number(n));
        else safeCall(cb, new Error('visitor number unknown: the hub cannot be reached'));
      };
      if (!S.loaded) loadWaiters.push(answer);
      else setTimeout(answer, 0);
      return ok();
    },
    setContactInfo: function (info) {
      if (!info || typeof info !== 'object' || Array.isArray(info)) return fail('contact info must be an object');
      var c = cleanFields(info, ['name', 'email', 'phone', 'description']);
      if (c.bad) return fail(c.bad);
      var d = c.out;
      if (!Object.keys(d).length) return fail('no contact details given');
      if (d.email && !EMAIL_RE.test(d.email)) return fail('invalid email');
      var nh = needHub();
      if (nh) return nh;
      if (d.name) S.contact.client_name = d.name;
      ['email', 'phone', 'description'].forEach(function (k) { if (d[k]) S.contact[k] = d[k]; });
      // The whole card goes out so a partial update never blanks known fields.
      var body = {};
      if (S.contact.client_name) body.name = S.contact.client_name;
      ['email', 'phone', 'description'].forEach(function (k) { if (S.contact[k]) body[k] = S.contact[k]; });
      post('/contacts', body);
      fire('Introduction');
      return ok();
    },
    setCustomData: function (fields) {
      if (!Array.isArray(fields)) return fail('fields must be an array');
      if (fields.length > 10) return fail('at most 10 fields');
      var clean = [];
      for (var i = 0; i < fields.length; i++) {
        var f = fields[i];
        if (!f || typeof f !== 'object') return fail('field ' + i + ' must be an object');
        var o = {};
        ['content', 'title', 'link', 'key'].forEach(function (k) { if (f[k] != null) o[k] = String(f[k]); });
        clean.push(o);
      }
      var nh = needHub();
      if (nh) return nh;
      post('/custom-data', { fields: clean });
      return ok();
    },
    setRules: function (rules) {
      if (typeof rules === 'string') {
        try { rules = JSON.parse(rules); } catch (e) { return fail('rules must be JSON'); }
      }
      if (rules && !Array.isArray(rules) && Array.isArray(rules.rules)) rules = rules.rules;
      if (!Array.isArray(rules)) return fail('rules must be an array');
      var copy = rules.slice();
      // Evaluated after returning so an invitation's callbacks do not run inside setRules.
      setTimeout(function () { applyRules(copy); }, 0);
      return ok();
    },
    setUserToken: function (token) {
      if (typeof token !== 'string' || !token.trim()) return { result: 'fail', token: false };
      if (S.conn === 'down') return { result: 'fail', token: token, reason: 'the hub cannot be reached' };
      tokenSent = post('/user-token', { token: token });
      return { result: 'ok', token: token };
    },
    showProactiveInvitation: function (text) {
      if (typeof text === 'number') text = String(text);
      if (typeof text !== 'string' || !text.trim()) return fail('invitation text must be a non-empty string');
      showInvitation(text);
      return ok();
    },
    startCall: function (phone) {
      if (typeof phone === 'number') phone = String(phone);
      if (typeof phone !== 'string' || !PHONE_RE.test(phone.trim())) return fail('invalid phone number');
      phone = phone.trim();
      if (S.callback && S.callback.result === 'fail') return Object.assign({}, S.callback);
      if (S.call) return fail('call already started');
      var nh = needHub();
      if (nh) return nh;
      var call = { phone: phone, started: false };
      S.call = call;
      renderCall();
      if (S.vis === 'open') setUi(null, 'call');
      post('/calls', { phone: phone }).then(function (res) {
        if (S.call !== call) return;
        if (res.ok) { callStarted(); return; }
        var r = failOf(res);
        S.call = null;
        if (S.view === 'call') {
          setUi(null, 'callback');
          showErr(U.cb.error, reasonOf(r));
        }
        renderCall();
        fire('CallEnd', { result: 'fail', reason: reasonOf(r) });
      });
      return ok();
    },
    isCallbackEnabled: function (cb) {
      if (typeof cb !== 'function') return fail('callback must be a function');
      checkCallback().then(function (r) { safeCall(cb, r); });
      return ok();
    },
    sendOfflineMessage: function (data) {
      return offlineMessage(data, null);
    },
    setClientAttributes: function (attrs) {
      if (!attrs || typeof attrs !== 'object' || Array.isArray(attrs)) return fail('attributes must be an object');
      var copy;
      try { copy = JSON.parse(JSON.stringify(attrs)); } catch (e) { return fail('attributes must be JSON data'); }
      var nh = needHub();
      if (nh) return nh;
      // The hub enforces the limit too; counting here saves pointless requests
      // and gives the page its answer synchronously.
      var now = Date.now();
      var calls = loadJSON(K_ATTRS, []);
      calls = (Array.isArray(calls) ? calls : []).filter(function (t) { return now - t < 3600 * 1000; });
      if (calls.length >= 10) return fail('rate limit: at most 10 calls per hour');
      calls.push(now);
      save(K_ATTRS, JSON.stringify(calls));
      post('/attributes', { attributes: copy });
      return ok();
    },
    setWidgetColor: function (color) {
      if (!validColor(color)) return fail('invalid color');
      S.color = color.trim();
      S.colorFromPage = true;
      renderTheme();
      return ok();
    },
    sendPageTitle: function (title) {
      if (title === undefined) title = document.title;
      if (typeof title === 'number') title = String(title);
      if (typeof title !== 'string') return fail('title must be a string');
      var nh = needHub();
      if (nh) return nh;
      post('/page', { url: location.href, title: title, referrer: document.referrer });
      return ok();
    },
    getUnreadMessagesCount: function () {
      return S.unread;
    },
    getUtm: function () {
      var q = new URLSearchParams(location.search);
      var o = {};
      ['source', 'medium', 'campaign', 'content', 'term'].forEach(function (k) {
        var v = q.get('utm_' + k);
        o[k] = v === null || v === '' ? null : v;
      });
      return o;
    },
    clearHistory: function () {
      var nh = needHub();
      if (nh) return nh;
      // Unsent messages are still on their way; everything else is forgotten.
      S.msgs = S.msgs.filter(function (m) { return m.local === 'pending'; });
      S.chat = outbox.length ? S.chat : null;
      S.agentName = null;
      S.unread = 0;
      save(K_SEEN, null);
      renderMsgs();
      renderBadge();
      renderHead();
      renderCompose();
      post('/clear');
      return ok();
    },
    sendMessage: function (text) {
      if (typeof text === 'number') text = String(text);
      if (typeof text !== 'string' || !text.trim()) return fail('message text is empty');
      var nh = needHub();
      if (nh) return nh;
      queueMessage(text.trim());
      return ok();
    }
  };

  // A bug in here must surface as a fail result, never as an exception in the
  // page's own code that happened to call us.
  var methods = {};
  Object.keys(impl).forEach(function (name) {
    methods[name] = function () {
      try {
        return impl[name].apply(null, arguments);
      } catch (e) {
        if (window.console) console.error('[hub widget] ' + name + ' failed:', e);
        return fail('internal error in ' + name);
      }
    };
  });
  // Pages written for other versions of the widget call methods we may not
  // have; they get a fail result instead of a TypeError that stops their script.
  var widgetApi = typeof Proxy === 'function'
    ? new Proxy(methods, {
      get: function (target, prop) {
        // `then` must stay undefined or `await widget_api` would hang forever.
        if (typeof prop !== 'string' || prop in target || prop === 'then' || prop === 'toJSON') return target[prop];
        return function () { return fail('unknown method ' + prop); };
      }
    })
    : methods;
  window.widget_api = widgetApi;
  window.jivo_api = widgetApi;

  // -------------------------------------------------------------- lifecycle
  var destroyTimers = function () {
    clearTimeout(sessionTimer);
    clearTimeout(typingTimer);
    ruleTimers.forEach(clearTimeout);
  };
  function destroy() {
    if (S.destroyed) return;
    S.destroyed = true;
    stopTyping();
    closeStream();
    destroyTimers();
    fire('WidgetDestroy');
  }
  window.addEventListener('pagehide', destroy);
  // A page restored from the back/forward cache comes back alive.
  window.addEventListener('pageshow', function (e) {
    if (!e.persisted || !S.destroyed || (S.mounted && !U.host.isConnected)) return;
    S.destroyed = false;
    startSession();
  });

  mount();
  startSession();
})();
