// The agent console's administration view: channels, agents, bots, plugins
// and dead letters on the admin API. console.js calls
// `HubAdmin.mount(container, HubConsole)` for an admin agent; everything here
// renders inside `container`. Server data goes in through textContent only
// (the page's CSP forbids inline scripts and styles).
(function () {
  'use strict';

  /** An element: `attrs` are properties (class, text, htmlFor, type, ...) or `aria-*`/`data-*` attributes. */
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = String(v);
      else if (k.startsWith('aria-') || k.startsWith('data-') || k === 'role') el.setAttribute(k, String(v));
      else el[k] = v;
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  let seq = 0;
  const uid = (p) => `hub-admin-${p}-${++seq}`;

  /** A control with its label (and a hint that describes it, outside the label). */
  function field(label, control, hint) {
    control.id = control.id || uid('f');
    const check = control.type === 'checkbox';
    const lab = h('label', { class: 'admin-label', htmlFor: control.id, text: label });
    const wrap = h('div', { class: check ? 'admin-field admin-check' : 'admin-field' }, check ? [control, lab] : [lab, control]);
    if (hint) {
      const id = uid('hint');
      control.setAttribute('aria-describedby', id);
      wrap.append(h('small', { class: 'admin-hint', id, text: hint }));
    }
    return wrap;
  }
  const input = (type, name, extra) => h('input', { type, name, autocomplete: 'off', ...extra });

  /** A URL as a link when it is http(s), else as text. */
  function link(url) {
    if (typeof url !== 'string' || !url) return h('span', { class: 'admin-none', text: '—' });
    let ok = false;
    try {
      const u = new URL(url);
      ok = u.protocol === 'http:' || u.protocol === 'https:';
    } catch (_) { /* not a URL */ }
    return ok ? h('a', { href: url, target: '_blank', rel: 'noopener noreferrer', class: 'admin-url', text: url })
      : h('code', { class: 'admin-url', text: url });
  }
  const code = (s) => (s === null || s === undefined || s === '' ? h('span', { class: 'admin-none', text: '—' })
    : h('code', { class: 'admin-url', text: String(s) }));
  const list = (s) => String(s || '').split(/[\s,;]+/).map((x) => x.trim()).filter(Boolean);
  const when = (ms) => (typeof ms === 'number' ? new Date(ms).toLocaleString() : '');

  /** A table; `quiet`: its caption repeats the section's heading, so only screen readers get it. */
  function table(caption, heads, rows, empty, quiet) {
    if (!rows.length) return h('p', { class: 'admin-empty', text: empty });
    return h('div', { class: 'admin-table-wrap' }, h('table', { class: 'admin-table' },
      h('caption', { class: quiet ? 'sr-only' : 'admin-caption', text: caption }),
      h('thead', {}, h('tr', {}, heads.map((t) => h('th', { scope: 'col', text: t })))),
      h('tbody', {}, rows)));
  }
  const row = (...cells) => h('tr', {}, cells.map((c) => h('td', {}, c)));

  /** The text an answer's error carries. */
  function problem(r) {
    const e = r && r.body && r.body.error;
    if (e && typeof e.message === 'string' && e.message) return e.message;
    if (r && typeof r.body === 'string' && r.body) return r.body;
    return `the hub answered ${r ? r.status : 'nothing'}`;
  }
  const ok = (r) => r && r.status >= 200 && r.status < 300;

  function mount(container, hc) {
    const api = (method, path, body) => hc.api(method, path, body).catch((e) => ({ status: 0, body: { error: { message: `network error: ${e && e.message ? e.message : e}` } } }));
    container.replaceChildren();
    const root = h('div', { class: 'admin' });
    container.append(root);

    /** A section with heading, an aria-live line for results and errors, and a body re-rendered by `load`. */
    function section(title, intro) {
      const hid = uid('h');
      const live = h('p', { class: 'admin-live', role: 'status', 'aria-live': 'polite' });
      const body = h('div', { class: 'admin-list' });
      const forms = h('div', { class: 'admin-forms' });
      const sec = h('section', { class: 'admin-section', 'aria-labelledby': hid },
        h('h2', { id: hid, text: title }), intro ? h('p', { class: 'admin-intro', text: intro }) : null, live, body, forms);
      root.append(sec);
      return {
        list: body, forms,
        say(text, error) {
          live.textContent = text;
          live.classList.toggle('admin-error', !!error);
        },
      };
    }

    /** Runs `fn` with `button` disabled; an answer not 2xx goes to the section's live line. */
    async function act(sec, button, fn) {
      if (button) button.disabled = true;
      try {
        return await fn();
      } finally {
        if (button) button.disabled = false;
      }
    }

    /** GETs `path` and answers the body, or null after saying the error. */
    async function get(sec, path) {
      const r = await api('GET', path);
      if (!ok(r)) {
        sec.say(problem(r), true);
        return null;
      }
      return r.body || {};
    }

    function form(sec, title, controls, button, submit, parent) {
      const b = h('button', { type: 'submit', class: 'primary', text: button });
      const f = h('form', { class: 'admin-form', 'aria-label': title, noValidate: false },
        h(parent ? 'h4' : 'h3', { text: title }), h('div', { class: 'admin-controls' }, controls), h('div', { class: 'admin-actions' }, b));
      f.addEventListener('submit', (ev) => {
        ev.preventDefault();
        act(sec, b, () => submit(f));
      });
      (parent || sec.forms).append(f);
      return f;
    }

    // ---------------------------------------------------------------- top
    const refresh = h('button', { type: 'button', class: 'admin-refresh', text: 'Refresh' });
    root.append(h('div', { class: 'admin-toolbar' }, refresh));

    // ----------------------------------------------------------- channels
    const ch = section('Channels', 'Customers reach a channel at its endpoint URL; agents are assigned by e-mail.');
    let channels = [];
    const chSelect = h('select', { name: 'channel', required: true });
    const chAgents = input('text', 'agents');
    const whUrl = input('url', 'webhook_url', { placeholder: 'https://' });
    const whSecret = input('password', 'webhook_secret', { placeholder: 'whsec_…' });
    const whGen = input('checkbox', 'generate_secret');
    const chOut = h('div', { class: 'admin-output' });

    function fillChannelForms() {
      const c = channels.find((x) => String(x.id) === chSelect.value);
      chAgents.value = c ? (c.agents || []).join(', ') : '';
      whUrl.value = c && c.webhook_url ? c.webhook_url : '';
      whSecret.value = '';
      whGen.checked = false;
    }
    chSelect.addEventListener('change', fillChannelForms);

    async function loadChannels() {
      const b = await get(ch, '/admin/v1/channels');
      if (!b) return;
      channels = b.channels || [];
      ch.list.replaceChildren(channels.length ? h('ul', { class: 'admin-cards' }, channels.map((c) => {
        const w = c.widget;
        const dl = h('dl', { class: 'admin-dl' });
        const add = (k, v) => dl.append(h('dt', { text: k }), h('dd', {}, v));
        add('Endpoint URL', code(c.endpoint_url));
        add('Status URL', link(c.status_url));
        if (c.type !== 'widget') add('Customer endpoint', code(c.customer_endpoint));
        if (w) {
          add('Widget id', code(w.widget_id));
          add('Embed', code(w.embed));
          add('Demo page', link(w.demo_url));
        }
        add('Agents', (c.agents || []).length ? c.agents.join(', ') : h('span', { class: 'admin-none', text: 'none' }));
        add('Webhook URL', c.webhook_url ? h('span', {}, code(c.webhook_url), c.webhook_signed ? ' (signed)' : ' (not signed)') : h('span', { class: 'admin-none', text: 'none' }));
        return h('li', { class: 'admin-card', 'data-channel': c.public_id },
          h('h3', {}, h('span', { text: c.name }), h('span', { class: 'admin-tag', text: ` ${c.type || 'custom'}${c.declared ? ', from hub.toml' : ''}` })),
          dl);
      })) : h('p', { class: 'admin-empty', text: 'No channels yet.' }));
      const keep = chSelect.value;
      chSelect.replaceChildren(...channels.map((c) => h('option', { value: String(c.id), text: c.name })));
      if (channels.some((c) => String(c.id) === keep)) chSelect.value = keep;
      fillChannelForms();
    }

    {
      const name = input('text', 'name', { required: true });
      const type = h('select', { name: 'type' }, h('option', { value: 'custom', text: 'custom' }), h('option', { value: 'widget', text: 'widget' }));
      const endpoint = input('url', 'customer_endpoint', { placeholder: 'https://' });
      const agents = input('text', 'agents');
      form(ch, 'New channel', [
        field('Name', name),
        field('Type', type),
        field('Customer endpoint URL', endpoint, 'Where agent replies go (custom channels).'),
        field('Agents', agents, 'E-mails, separated by commas.'),
      ], 'Create channel', async (f) => {
        const body = { name: name.value.trim(), type: type.value, agents: list(agents.value) };
        if (type.value !== 'widget' && endpoint.value.trim()) body.customer_endpoint = endpoint.value.trim();
        const r = await api('POST', '/admin/v1/channels', body);
        if (!ok(r)) return ch.say(problem(r), true);
        f.reset();
        ch.say(`Channel ${r.body.name} created.`);
        await loadChannels();
      });
      const box = h('div', { class: 'admin-group', role: 'group', 'aria-label': 'Change a channel' },
        h('h3', { text: 'Change a channel' }), h('div', { class: 'admin-controls' }, field('Channel', chSelect)));
      ch.forms.append(box);
      form(ch, 'Channel agents', [
        field('Agents of the channel', chAgents, 'E-mails, separated by commas; replaces the list.'),
      ], 'Save agents', async () => {
        const c = channels.find((x) => String(x.id) === chSelect.value);
        if (!c) return ch.say('Choose a channel first.', true);
        const r = await api('PUT', `/admin/v1/channels/${encodeURIComponent(c.id)}/agents`, { agents: list(chAgents.value) });
        if (!ok(r)) return ch.say(problem(r), true);
        ch.say(`Agents of ${c.name} saved.`);
        await loadChannels();
      }, box);
      form(ch, 'Channel webhook', [
        field('Webhook URL', whUrl, 'Empty removes the webhook.'),
        field('Webhook secret', whSecret, 'Optional Standard Webhooks secret (whsec_…).'),
        field('Generate a new secret', whGen),
      ], 'Save webhook', async () => {
        const c = channels.find((x) => String(x.id) === chSelect.value);
        if (!c) return ch.say('Choose a channel first.', true);
        const body = { url: whUrl.value.trim() || null };
        if (whGen.checked) body.generate_secret = true;
        else if (whSecret.value) body.secret = whSecret.value;
        const r = await api('PUT', `/admin/v1/channels/${encodeURIComponent(c.id)}/webhook`, body);
        if (!ok(r)) return ch.say(problem(r), true);
        ch.say(`Webhook of ${c.name} saved${r.body && r.body.signed ? ', signed' : ''}.`);
        chOut.replaceChildren(r.body && r.body.secret
          ? h('p', {}, 'New signing secret (shown once): ', code(r.body.secret)) : '');
        await loadChannels();
      }, box);
      box.append(chOut);
    }

    // ------------------------------------------------------------- agents
    const ag = section('Agents');
    let agents = [];
    const agSelect = h('select', { name: 'agent', required: true });
    const agOut = h('div', { class: 'admin-output', 'aria-live': 'polite' });

    async function loadAgents() {
      const b = await get(ag, '/admin/v1/agents');
      if (!b) return;
      agents = b.agents || [];
      ag.list.replaceChildren(table('Agents', ['Name', 'E-mail', 'Admin', 'Online', 'Created'],
        agents.map((a) => row(a.name, a.email, a.admin ? 'yes' : 'no', a.online ? 'online' : 'offline', when(a.created_at))),
        'No agents yet.', true));
      const keep = agSelect.value;
      agSelect.replaceChildren(...agents.map((a) => h('option', { value: String(a.id), text: `${a.name} <${a.email}>` })));
      if (agents.some((a) => String(a.id) === keep)) agSelect.value = keep;
    }

    {
      const name = input('text', 'name', { required: true });
      const email = input('email', 'email', { required: true });
      const pw = input('password', 'password', { autocomplete: 'new-password' });
      const admin = input('checkbox', 'admin');
      form(ag, 'New agent', [
        field('Name', name), field('E-mail', email),
        field('Password', pw, 'Optional; lets the agent sign in to the console.'),
        field('Administrator', admin),
      ], 'Create agent', async (f) => {
        const body = { name: name.value.trim(), email: email.value.trim(), admin: admin.checked };
        if (pw.value) body.password = pw.value;
        const r = await api('POST', '/admin/v1/agents', body);
        if (!ok(r)) return ag.say(problem(r), true);
        f.reset();
        ag.say(`Agent ${r.body.name} created.`);
        agOut.replaceChildren(h('p', {}, `API token of ${r.body.email} (shown only now): `, code(r.body.token)));
        await loadAgents();
      });
      const npw = input('password', 'new_password', { required: true, autocomplete: 'new-password' });
      form(ag, 'Agent password', [field('Agent', agSelect), field('New password', npw)], 'Set password', async (f) => {
        const a = agents.find((x) => String(x.id) === agSelect.value);
        if (!a) return ag.say('Choose an agent first.', true);
        const r = await api('PUT', `/admin/v1/agents/${encodeURIComponent(a.id)}/password`, { password: npw.value });
        if (!ok(r)) return ag.say(problem(r), true);
        npw.value = '';
        ag.say(`Password of ${a.email} set.`);
      });
      ag.forms.append(agOut);
    }

    // --------------------------------------------------------------- bots
    const bo = section('Bots', 'A channel\'s new chats start with its bot.');
    const boOut = h('div', { class: 'admin-output', 'aria-live': 'polite' });

    function deleteCell(b) {
      const cell = h('div', { class: 'admin-row-actions' });
      const start = h('button', { type: 'button', class: 'danger-ghost small', text: 'Delete bot', 'aria-label': `Delete bot ${b.name}` });
      start.addEventListener('click', () => {
        const yes = h('button', { type: 'button', class: 'danger-ghost small', text: 'Confirm delete', 'aria-label': `Confirm delete of bot ${b.name}` });
        const no = h('button', { type: 'button', class: 'small', text: 'Cancel' });
        no.addEventListener('click', () => { cell.replaceChildren(start); start.focus(); });
        yes.addEventListener('click', () => act(bo, yes, async () => {
          const r = await api('DELETE', `/admin/v1/bots/${encodeURIComponent(b.id)}`);
          if (!ok(r)) return bo.say(problem(r), true);
          bo.say(`Bot ${b.name} deleted.`);
          await loadBots();
        }));
        cell.replaceChildren(h('span', { text: `Delete ${b.name}? ` }), yes, no);
        no.focus();
      });
      cell.append(start);
      return cell;
    }

    async function loadBots() {
      const b = await get(bo, '/admin/v1/bots');
      if (!b) return;
      const bots = b.bots || [];
      bo.list.replaceChildren(table('Bots', ['Name', 'Target', 'Channels', 'Webhooks URL', 'Providers URL', 'Action'],
        bots.map((x) => row(
          h('span', {}, x.name, x.declared ? h('span', { class: 'admin-tag', text: ' from hub.toml' }) : null),
          x.plugin ? `plugin ${x.plugin}` : code(x.endpoint),
          (x.channels || []).join(', ') || '—',
          code(x.webhooks_url), code(x.providers_url), deleteCell(x))),
        'No bots.', true));
    }

    {
      const name = input('text', 'name', { required: true });
      const endpoint = input('url', 'endpoint', { required: true, placeholder: 'https://' });
      const token = input('text', 'token', { required: true });
      const chans = input('text', 'channels');
      form(bo, 'New provider bot', [
        field('Bot name', name), field('Provider endpoint', endpoint, 'The hub posts to <endpoint>/<token>.'),
        field('Provider token', token), field('Bot channels', chans, 'Channel names, separated by commas.'),
      ], 'Create bot', async (f) => {
        const body = { name: name.value.trim(), endpoint: endpoint.value.trim(), token: token.value.trim(), channels: list(chans.value) };
        const r = await api('POST', '/admin/v1/bots', body);
        if (!ok(r)) return bo.say(problem(r), true);
        f.reset();
        bo.say(`Bot ${r.body.name} created.`);
        boOut.replaceChildren(h('dl', { class: 'admin-dl' },
          h('dt', { text: 'Webhooks URL' }), h('dd', {}, code(r.body.webhooks_url)),
          h('dt', { text: 'Providers URL' }), h('dd', {}, code(r.body.providers_url))));
        await loadBots();
      });
      bo.forms.append(boOut);
    }

    // ------------------------------------------------------------ plugins
    const pl = section('Plugins');

    async function loadPlugins() {
      const b = await get(pl, '/admin/v1/plugins');
      if (!b) return;
      const plugins = b.plugins || [];
      const errs = (c) => {
        const e = Object.entries((c && c.errors) || {}).filter(([, n]) => n > 0);
        return e.length ? e.map(([k, n]) => `${k}: ${n}`).join(', ') : '0';
      };
      // The newest of `counters.last_errors` ({at_ms, kind, event, message}, oldest first).
      const lastError = (c) => {
        const all = (c && c.last_errors) || [];
        const e = all[all.length - 1];
        return e ? `${e.kind}: ${e.message} (${when(e.at_ms)})` : '—';
      };
      const n = (c, k) => String(c && typeof c[k] === 'number' ? c[k] : 0);
      const parts = [table('Loaded plugins', ['Name', 'SHA-256', 'Limits', 'Calls', 'Drops', 'Replies', 'Forwards', 'Errors', 'Last error'],
        plugins.map((p) => {
          const c = p.counters;
          return row(p.name, h('code', { title: p.sha256 || '', text: String(p.sha256 || '').slice(0, 12) }),
            `${p.timeout_ms} ms, ${p.memory_mb} MB${p.kv ? ', kv' : ''}`,
            n(c, 'calls'), n(c, 'drops'), n(c, 'replies'), n(c, 'forwards'), errs(c),
            lastError(c));
        }), 'No plugins loaded.')];
      const un = b.unavailable || [];
      if (un.length) {
        parts.push(table('Plugins that failed to load', ['Name', 'Error'], un.map((u) => row(u.name, u.error)), ''));
      }
      const routes = b.routes || [];
      if (routes.length) {
        parts.push(table('Routes', ['Events', 'Channels', 'Plugins', 'Shadows', 'On error'], routes.map((r) => row(
          (r.events || []).join(', '), (r.channels || []).join(', ') || 'all',
          [...(r.plugins || []), ...(r.missing || []).map((m) => `${m} (missing)`)].join(', '),
          (r.shadow || []).join(', ') || '—', r.on_error)), ''));
      }
      const shadows = [...new Set(routes.flatMap((r) => r.shadow || []))];
      for (const name of shadows) {
        const s = await get(pl, `/admin/v1/plugins/${encodeURIComponent(name)}/shadow`);
        if (s) parts.push(shadowView(name, s));
      }
      pl.list.replaceChildren(...parts);
    }

    /** A payload as indented JSON, for reading side by side. */
    const json = (v) => h('pre', { class: 'admin-json', text: JSON.stringify(v, null, 2) });

    /** A shadow plugin's counts and its latest differing events, live and shadow side by side. */
    function shadowView(name, s) {
      const counts = Object.entries(s.counts || {}).map(([k, n]) => `${k} ${n}`).join(', ');
      const recent = s.recent || [];
      return h('div', { class: 'admin-shadow' },
        h('h3', { text: `Shadow ${name}` }),
        h('p', { class: 'admin-intro', text: `Compared with live: ${counts}. Nothing a shadow does takes effect.` }),
        table(`Recent differences of shadow ${name}`, ['Event', 'Kind', 'Result', 'Live', 'Shadow'],
          recent.map((d) => row(h('span', {}, code(d.event_id), h('br'), when(d.at)), d.kind,
            h('span', { class: 'admin-nowrap', text: d.error_kind ? `${d.result} (${d.error_kind})` : d.result }),
            json(d.live), json(d.shadow))),
          'No differences yet.'));
    }

    // ------------------------------------------------------- dead letters
    const dead = section('Dead letters', 'Deliveries that failed for good. "Replay all" sends every failed webhook and CRM delivery again; replay others one by one.');
    const replayAll = h('button', { type: 'button', text: 'Replay all' });
    dead.forms.append(h('div', { class: 'admin-actions' }, replayAll));

    function replayed(r, what) {
      if (!ok(r)) return dead.say(problem(r), true);
      const n = (r.body && r.body.replayed || []).length;
      dead.say(`${what}: ${n} ${n === 1 ? 'delivery' : 'deliveries'} queued again.`);
      return loadDead();
    }
    replayAll.addEventListener('click', () => act(dead, replayAll, async () =>
      replayed(await api('POST', '/admin/v1/deliveries/replay'), 'Replay all')));

    async function loadDead() {
      const b = await get(dead, '/admin/v1/deliveries?state=dead');
      if (!b) return;
      const items = b.deliveries || [];
      dead.list.replaceChildren(table('Dead letters', ['Id', 'Kind', 'Target', 'Attempts', 'Last error', 'Failed', 'Action'],
        items.map((d) => {
          const btn = h('button', { type: 'button', class: 'small', text: 'Replay', 'data-delivery': d.id });
          btn.addEventListener('click', () => act(dead, btn, async () =>
            replayed(await api('POST', `/admin/v1/deliveries/${encodeURIComponent(d.id)}/replay`), `Replay ${d.id}`)));
          return row(code(d.id), d.kind, code(d.target_url), String(d.attempts), d.last_error || '—', when(d.finished_at), btn);
        }), 'No dead letters.', true));
    }

    // ---------------------------------------------------------------- all
    const loadAll = () => Promise.all([loadChannels(), loadAgents(), loadBots(), loadPlugins(), loadDead()]);
    refresh.addEventListener('click', () => act(null, refresh, loadAll));
    return loadAll();
  }

  window.HubAdmin = { mount };
})();
