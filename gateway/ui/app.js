// Gatehouse approvals page: lists the permission prompts of the signed-in
// principal and answers them through the /v0 API. Plain script, no build
// step, nothing fetched but this gateway's own API.
'use strict';

(() => {
  const TOKEN_KEY = 'gatehouse.token';
  const PEER_KEY = 'gatehouse.peer';
  const CHANNEL_ID = 'web';
  const POLL_MS = 2000;
  const NOTE_MS = 5000;
  // The gateway sends a heartbeat every 5 s: a stream silent for this long
  // is dead even if the socket still looks open.
  const STREAM_IDLE_MS = 20000;
  const BACKOFF_MIN_MS = 500;
  const BACKOFF_MAX_MS = 30000;
  const MAX_LIST_PAGES = 20;
  const SETTLED_MEMORY = 1000;

  // Relative to /ui/, so the page also works behind a proxy that mounts the
  // gateway under a path prefix.
  const API = new URL('../v0/', document.baseURI);

  const el = (id) => document.getElementById(id);
  const statusEl = el('status');
  const errorEl = el('error');
  const signinEl = el('signin');
  const tokenEl = el('token');
  const whoamiEl = el('whoami');
  const signoutEl = el('signout');
  const listEl = el('prompts');
  const emptyEl = el('empty');
  const countEl = el('count');
  const headingEl = el('prompts-title');
  const announceEl = el('announce');
  const template = el('prompt-template');
  const pushEl = el('push');
  const pushStatusEl = el('push-status');
  const pushOnEl = el('push-on');
  const pushOffEl = el('push-off');
  const linkedEl = el('linked');
  const linkedListEl = el('linked-prompts');
  const linkedErrorEl = el('linked-error');

  const DONE_TEXT = {
    allow_once: 'You allowed this call once.',
    allow_always: 'You allowed this tool for the rest of the session.',
    deny: 'You denied this call.',
  };

  // cards: action id -> {li, rec, busy, done}.
  const cards = new Map();
  // Settled action ids, so that a stale list page or a re-delivered frame
  // cannot bring back a prompt already answered.
  const settled = new Set();

  const token = () => sessionStorage.getItem(TOKEN_KEY) || '';

  function randomId() {
    // getRandomValues, not randomUUID: the latter needs a secure context,
    // and a gateway on a LAN address over plain HTTP is not one.
    const b = new Uint8Array(12);
    crypto.getRandomValues(b);
    return 'web-' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }

  // One peer id per browser, kept in localStorage, so that reloading the
  // page or opening it again registers no new channel: the gateway keeps a
  // channel per peer id (and a person's channels are capped). Two tabs open
  // at once cannot share an id, since each stream would keep taking the
  // other over, so a tab takes the first of <id>, <id>-2, <id>-3, ... that
  // no other open tab of this browser holds. The tab's id is also kept in
  // its sessionStorage, for the record.
  let peerId = '';

  function browserId() {
    let id = '';
    try { id = localStorage.getItem(PEER_KEY) || ''; } catch { /* storage disabled */ }
    if (!/^web-[0-9a-f]{24}$/.test(id)) {
      id = randomId();
      try { localStorage.setItem(PEER_KEY, id); } catch { /* storage disabled: one id per load */ }
    }
    return id;
  }

  // claimPeerId asks the other tabs, over a BroadcastChannel, which ids
  // they hold. A tab answers "taken" for the id it holds, and for the id it
  // is claiming itself when its own claim's nonce is lower, so two tabs
  // opened at the same instant do not both take one id.
  async function claimPeerId() {
    const base = browserId();
    if (typeof BroadcastChannel !== 'function') {
      peerId = base;
      return;
    }
    const bc = new BroadcastChannel('gatehouse-approvals');
    let pending = null; // {id, nonce, taken} while claiming
    bc.onmessage = (e) => {
      const m = e.data || {};
      if (m.claim && m.claim === peerId) {
        bc.postMessage({ taken: m.claim, to: m.nonce });
      } else if (m.claim && pending && m.claim === pending.id && m.nonce !== pending.nonce) {
        if (pending.nonce < m.nonce) bc.postMessage({ taken: m.claim, to: m.nonce });
        else pending.taken = true;
      }
      if (m.taken && pending && m.taken === pending.id && m.to === pending.nonce) pending.taken = true;
    };
    for (let n = 1; ; n++) {
      const nonce = randomId();
      pending = { id: n === 1 ? base : base + '-' + n, nonce, taken: false };
      bc.postMessage({ claim: pending.id, nonce });
      await sleep(150);
      if (!pending.taken) {
        peerId = pending.id;
        pending = null;
        try { sessionStorage.setItem(PEER_KEY, peerId); } catch { /* for the record only */ }
        return;
      }
    }
  }

  class APIError extends Error {
    constructor(status, code, message, details) {
      super(message);
      this.status = status;
      this.code = code;
      this.details = details;
    }
  }

  function authHeaders() {
    const h = {};
    const t = token();
    if (t) h.Authorization = 'Bearer ' + t;
    return h;
  }

  async function errorOf(resp) {
    const text = await resp.text().catch(() => '');
    let body = null;
    try { body = JSON.parse(text); } catch { /* not JSON: a proxy or router page */ }
    if (body && typeof body.error === 'string') {
      return new APIError(resp.status, body.code || 'HTTP_' + resp.status, body.error, body.details);
    }
    return new APIError(resp.status, 'HTTP_' + resp.status, text.trim() || resp.statusText);
  }

  async function api(method, path, body) {
    const headers = authHeaders();
    headers.Accept = 'application/json';
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(new URL(path, API), init);
    } catch {
      throw new APIError(0, 'NETWORK_ERROR', 'the gateway cannot be reached');
    }
    if (!resp.ok) throw await errorOf(resp);
    return resp.json();
  }

  const describe = (err) => (err && err.code ? err.code + ': ' + err.message : String(err));

  function showError(err) {
    errorEl.textContent = describe(err);
    errorEl.hidden = false;
    const auth = err && (err.status === 401 || err.status === 403);
    signinEl.classList.toggle('attention', !!auth);
  }

  function clearError() {
    errorEl.hidden = true;
    errorEl.textContent = '';
    signinEl.classList.remove('attention');
  }

  function announce(text) {
    announceEl.textContent = text;
  }

  function setStatus(text, cls) {
    // Unchanged text is not rewritten: screen readers would announce the
    // status again on every poll.
    if (statusEl.textContent !== text) statusEl.textContent = text;
    statusEl.className = cls;
  }

  function updateCount() {
    let n = 0;
    for (const c of cards.values()) if (!c.done) n++;
    countEl.textContent = n ? '(' + n + ')' : '';
    emptyEl.hidden = cards.size > 0;
    document.title = (n ? '(' + n + ') ' : '') + 'Gatehouse approvals';
  }

  function remember(id) {
    settled.add(id);
    if (settled.size > SETTLED_MEMORY) settled.delete(settled.values().next().value);
  }

  function formatTime(iso) {
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toLocaleString();
  }

  function formatLeft(ms) {
    if (ms <= 0) return 'now';
    const s = Math.ceil(ms / 1000);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const sec = String(s % 60).padStart(2, '0');
    if (h) return 'in ' + h + 'h ' + String(m).padStart(2, '0') + 'm';
    return 'in ' + (m ? m + 'm ' : '') + sec + 's';
  }

  function tickExpiry() {
    const now = Date.now();
    for (const c of cards.values()) {
      if (c.done || !c.expires) continue;
      const left = c.expires - now;
      c.expiryEl.textContent = formatLeft(left);
      c.expiryEl.classList.toggle('soon', left < 60000);
    }
  }

  function pretty(args) {
    if (args === undefined || args === null) return '(none)';
    return JSON.stringify(args, null, 2);
  }

  // buildCard makes the card of a pending prompt; its buttons call
  // onAnswer(card, decision).
  function buildCard(rec, onAnswer) {
    const li = template.content.firstElementChild.cloneNode(true);
    const q = (sel) => li.querySelector(sel);
    li.dataset.actionId = rec.action_id;
    const headingId = 'prompt-' + rec.action_id;
    q('h3').id = headingId;
    q('article').setAttribute('aria-labelledby', headingId);
    q('.tool').textContent = rec.tool_id;
    q('.reason').textContent = rec.reason || 'Policy asks a person to approve this call.';
    q('.execution').textContent = rec.execution_id;
    q('.agent').textContent = rec.agent_id || '–';
    const requested = q('.requested');
    requested.dateTime = rec.requested_at;
    requested.textContent = formatTime(rec.requested_at);
    q('.action').textContent = rec.action_id;
    q('.arguments').textContent = pretty(rec.arguments);
    q('.answer').setAttribute('aria-label', 'Answer for ' + rec.tool_id);
    const c = { li, rec, busy: false, done: false, expiryEl: q('.expiry'), expires: 0 };
    const expires = rec.expires_at ? Date.parse(rec.expires_at) : NaN;
    if (isNaN(expires)) {
      q('.expiry-term').hidden = true;
      c.expiryEl.hidden = true;
    } else {
      c.expires = expires;
      c.expiryEl.title = formatTime(rec.expires_at);
    }
    for (const b of li.querySelectorAll('button[data-decision]')) {
      b.addEventListener('click', () => onAnswer(c, b.dataset.decision));
    }
    return c;
  }

  function addCard(rec) {
    const c = buildCard(rec, answer);
    const li = c.li;
    // Action ids are UUIDv7: their order is the order of the requests.
    let before = null;
    for (const other of listEl.children) {
      if (other.dataset.actionId > rec.action_id) { before = other; break; }
    }
    listEl.insertBefore(li, before);
    cards.set(rec.action_id, c);
    tickExpiry();
    updateCount();
    announce('New prompt: ' + rec.tool_id);
  }

  // upsert shows a record: a new card for a pending prompt, a retraction
  // for a settled one.
  function upsert(rec) {
    if (!rec || typeof rec.action_id !== 'string') return;
    if (rec.state && rec.state !== 'pending') {
      retract(rec);
      return;
    }
    if (cards.has(rec.action_id) || settled.has(rec.action_id)) return;
    addCard(rec);
  }

  function mine(rec) {
    const by = rec.decided_by;
    return !!by && by.channel_id === CHANNEL_ID && by.native_peer_id === peerId;
  }

  function settledText(rec) {
    if (mine(rec) && DONE_TEXT[rec.decision]) return DONE_TEXT[rec.decision];
    const by = rec.decided_by;
    if (by && by.principal) {
      return 'Answered elsewhere: ' + rec.state + ' by ' + by.principal + (by.channel_id ? ' via ' + by.channel_id : '');
    }
    if (rec.state === 'expired') return 'No longer pending: the prompt expired.';
    if (rec.state === 'cancelled') return 'No longer pending: the execution was cancelled.';
    return 'No longer pending: answered elsewhere.';
  }

  // retract replaces a card's controls by a short note on how the prompt
  // was settled (text, or one made from the record), then removes it.
  function retract(rec, text) {
    remember(rec.action_id);
    closeCard(cards.get(rec.action_id), rec, text);
  }

  // closeCard settles card c (one of the list's, or the card a
  // notification opened) with a note, then removes it.
  function closeCard(c, rec, text) {
    if (!c || c.done) return;
    c.done = true;
    const hadFocus = c.li.contains(document.activeElement);
    const note = c.li.querySelector('.note');
    note.textContent = text || settledText(rec);
    note.hidden = false;
    c.li.querySelector('.answer').remove();
    c.li.querySelector('.expiry-term').hidden = true;
    c.expiryEl.hidden = true;
    c.li.classList.add('settled');
    if (hadFocus) note.focus();
    announce(c.rec.tool_id + ": " + note.textContent);
    updateCount();
    setTimeout(() => {
      const focusLost = c.li.contains(document.activeElement);
      c.li.remove();
      if (cards.get(c.rec.action_id) === c) cards.delete(c.rec.action_id);
      updateCount();
      if (focusLost) headingEl.focus();
    }, NOTE_MS);
  }

  async function answer(c, decision) {
    await settle(c, decision, () => api('POST', 'actions/' + encodeURIComponent(c.rec.action_id) + '/respond', {
      decision,
      reason: c.li.querySelector('.answer-reason').value.trim(),
      channel_id: CHANNEL_ID,
      native_peer_id: peerId,
    }));
  }

  // settle sends a card's answer with send, then shows how the prompt
  // ended: this answer, or the one recorded before it.
  async function settle(c, decision, send) {
    if (c.busy || c.done) return;
    c.busy = true;
    // aria-disabled, not disabled: a disabled button drops the keyboard
    // focus to the page's top, and the click handler checks busy anyway.
    const buttons = c.li.querySelectorAll('.answer button');
    const errEl = c.li.querySelector('.card-error');
    const group = c.li.querySelector('.answer');
    for (const b of buttons) b.setAttribute('aria-disabled', 'true');
    group.setAttribute('aria-busy', 'true');
    errEl.hidden = true;
    try {
      await send();
      // A 200 means this answer won, whatever the body says.
      remember(c.rec.action_id);
      closeCard(c, c.rec, DONE_TEXT[decision]);
    } catch (err) {
      const recorded = err.status === 409 && err.details && err.details.recorded;
      if (recorded) {
        remember(c.rec.action_id);
        closeCard(c, recorded);
        return;
      }
      c.busy = false;
      for (const b of buttons) b.removeAttribute('aria-disabled');
      group.removeAttribute('aria-busy');
      errEl.textContent = describe(err);
      errEl.hidden = false;
      if (err.status === 401) showError(err);
    }
  }

  // checkGone looks up a prompt that left the pending list, to say how it
  // was settled.
  async function checkGone(id) {
    try {
      const rec = await api('GET', 'actions/' + encodeURIComponent(id));
      if (rec.state !== 'pending') retract(rec);
    } catch (err) {
      if (err.status === 404) retract({ action_id: id, state: 'gone' });
    }
  }

  // reconcile brings the page in line with the pending list: new prompts
  // appear, prompts no longer listed are retracted.
  async function reconcile() {
    const shown = [];
    for (const [id, c] of cards) if (!c.done) shown.push(id);
    const seen = new Set();
    let cursor = '';
    for (let page = 0; page < MAX_LIST_PAGES; page++) {
      const q = new URLSearchParams({ status: 'pending', limit: '200' });
      if (cursor) q.set('cursor', cursor);
      const res = await api('GET', 'actions?' + q);
      for (const rec of res.actions || []) {
        seen.add(rec.action_id);
        upsert(rec);
      }
      cursor = res.next_cursor || '';
      if (!cursor) break;
    }
    if (cursor) return; // the list was cut short: absence proves nothing
    for (const id of shown) if (!seen.has(id)) checkGone(id);
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const jitter = (ms) => ms / 2 + Math.random() * ms / 2;

  // readSSE parses a text/event-stream body (the WHATWG rules) and calls
  // onFrame for each event; s.lastEventId tracks the id field across
  // reconnects, as EventSource would.
  async function readSSE(s, body, onChunk, onFrame) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    let event = '';
    let data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      onChunk();
      let text = buf + value;
      // A CR at the end may be the first half of a CRLF split across reads.
      const heldCR = text.endsWith('\r');
      if (heldCR) text = text.slice(0, -1);
      const lines = text.split(/\r\n|\r|\n/);
      buf = lines.pop() + (heldCR ? '\r' : '');
      for (const line of lines) {
        if (line === '') {
          if (data.length) onFrame(event || 'message', data.join('\n'));
          event = '';
          data = [];
          continue;
        }
        if (line[0] === ':') continue;
        const i = line.indexOf(':');
        const field = i < 0 ? line : line.slice(0, i);
        let v = i < 0 ? '' : line.slice(i + 1);
        if (v[0] === ' ') v = v.slice(1);
        if (field === 'event') event = v;
        else if (field === 'data') data.push(v);
        else if (field === 'id' && !v.includes('\0')) s.lastEventId = v;
      }
    }
  }

  // A session is one sign-in: its loops stop when another replaces it.
  let current = null;

  function onFrame(s, event, data) {
    let rec = null;
    try { rec = JSON.parse(data); } catch { return; }
    switch (event) {
      case 'permission.requested':
      case 'permission.resolved':
        upsert(rec);
        break;
      case 'stream.reset':
        reconcile().catch(showError);
        break;
      case 'stream.expired':
        showError(new APIError(401, rec.code || 'UNAUTHORIZED', 'the token expired: sign in again'));
        break;
    }
  }

  function setLive(s, live) {
    if (s !== current) return;
    s.live = live;
    if (live) {
      clearTimeout(s.pollTimer);
      s.pollRun = null;
      setStatus('Live', 'live');
    } else {
      startPolling(s);
    }
  }

  // startPolling lists the pending prompts every POLL_MS while the stream
  // is down, or absent on this gateway. Each run has its own identity, so
  // a list still in flight when the stream came back cannot restart an
  // old run next to a new one.
  function startPolling(s) {
    if (s.pollRun) return;
    const run = {};
    s.pollRun = run;
    const active = () => s === current && s.pollRun === run && !s.live;
    const tick = async () => {
      if (!active()) return;
      try {
        await reconcile();
        if (active()) {
          setStatus('Updating every ' + POLL_MS / 1000 + ' s', 'polling');
          clearError();
        }
      } catch (err) {
        if (active()) {
          setStatus(err.status === 0 ? 'Offline: retrying' : 'Not connected', 'down');
          showError(err);
        }
      }
      if (active()) s.pollTimer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  async function streamLoop(s) {
    const url = new URL('channels/stream', API);
    url.search = new URLSearchParams({ channel_id: CHANNEL_ID, peer_id: peerId });
    let backoff = BACKOFF_MIN_MS;
    while (s === current) {
      const ctrl = new AbortController();
      s.abort = ctrl;
      let idle = 0;
      const kick = () => {
        clearTimeout(idle);
        idle = setTimeout(() => ctrl.abort(), STREAM_IDLE_MS);
      };
      let wait = backoff;
      try {
        const headers = authHeaders();
        headers.Accept = 'text/event-stream';
        if (s.lastEventId) headers['Last-Event-ID'] = s.lastEventId;
        kick();
        const resp = await fetch(url, { headers, cache: 'no-store', signal: ctrl.signal });
        const type = resp.headers.get('Content-Type') || '';
        if (resp.ok && resp.body && type.startsWith('text/event-stream')) {
          setLive(s, true);
          clearError();
          backoff = BACKOFF_MIN_MS;
          wait = backoff;
          // Catch up with what was settled while no stream was open.
          reconcile().catch(showError);
          await readSSE(s, resp.body, kick, (event, data) => onFrame(s, event, data));
        } else if (resp.status === 404) {
          // This gateway has no channel stream: polling carries the page,
          // and an occasional probe notices an upgraded gateway.
          if (resp.body) resp.body.cancel().catch(() => {});
          wait = BACKOFF_MAX_MS;
        } else {
          const err = await errorOf(resp);
          if (s === current) showError(err);
        }
      } catch {
        // Aborted by the idle watchdog, a new session, or the network:
        // either way, reconnect below.
      } finally {
        clearTimeout(idle);
      }
      if (s !== current) return;
      setLive(s, false);
      await sleep(jitter(wait));
      backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
    }
  }

  function start() {
    if (current) {
      current.abort && current.abort.abort();
      clearTimeout(current.pollTimer);
    }
    for (const c of cards.values()) c.li.remove();
    cards.clear();
    settled.clear();
    updateCount();
    clearError();
    const signedIn = token() !== '';
    whoamiEl.textContent = signedIn
      ? 'Signed in with a token (kept in this tab only).'
      : 'No token: this works when the gateway runs without authentication.';
    signoutEl.hidden = !signedIn;
    setStatus('Connecting…', '');
    const s = { live: false, pollRun: null, pollTimer: 0, abort: null, lastEventId: '' };
    current = s;
    startPolling(s);
    streamLoop(s);
    pushSetup(s);
  }

  el('signin-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const t = tokenEl.value.trim();
    tokenEl.value = '';
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    else sessionStorage.removeItem(TOKEN_KEY);
    start();
  });
  signoutEl.addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    start();
    tokenEl.focus();
  });

  // Web Push. The page registers its service worker, which makes it an
  // installable app; once signed in to a gateway that pushes, the person
  // may subscribe this device.
  const pushSupported = 'serviceWorker' in navigator && 'PushManager' in window && 'Notification' in window;
  const registration = 'serviceWorker' in navigator
    ? navigator.serviceWorker.register('sw.js').then(() => navigator.serviceWorker.ready).catch(() => null)
    : Promise.resolve(null);
  let pushKey = '';

  function base64url(s) {
    const bin = atob(s.replace(/-/g, '+').replace(/_/g, '/') + '='.repeat((4 - s.length % 4) % 4));
    return Uint8Array.from(bin, (ch) => ch.charCodeAt(0));
  }

  async function subscription() {
    const reg = await registration;
    return reg ? reg.pushManager.getSubscription() : null;
  }

  function pushState(on, problem) {
    pushOnEl.hidden = on;
    pushOffEl.hidden = !on;
    pushStatusEl.textContent = problem || (on ? 'This device is notified of new prompts.' : 'This device is not notified of new prompts.');
  }

  // pushSetup shows the notifications section when the gateway pushes,
  // and tells it again of this device's subscription, which it may have
  // dropped (a push service that answered 410, another sign-in).
  async function pushSetup(s) {
    pushEl.hidden = true;
    if (!pushSupported) return;
    let info;
    try {
      info = await api('GET', 'channels/webpush');
    } catch {
      return; // this gateway does not push, or nobody is signed in
    }
    if (s !== current) return;
    pushKey = info.public_key;
    pushEl.hidden = false;
    const sub = await subscription();
    if (!sub) {
      pushState(false);
      return;
    }
    try {
      await api('PUT', 'channels/webpush/subscription', sub.toJSON());
      pushState(true);
    } catch (err) {
      pushState(false, 'Not notified: ' + describe(err));
    }
  }

  pushOnEl.addEventListener('click', async () => {
    try {
      if (await Notification.requestPermission() !== 'granted') {
        pushState(false, 'Notifications are blocked for this page in the browser\'s settings.');
        return;
      }
      const reg = await registration;
      if (!reg) throw new Error('the service worker did not start');
      const sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: base64url(pushKey) });
      await api('PUT', 'channels/webpush/subscription', sub.toJSON());
      pushState(true);
    } catch (err) {
      pushState(false, 'Not turned on: ' + describe(err));
    }
  });

  pushOffEl.addEventListener('click', async () => {
    try {
      const sub = await subscription();
      if (sub) {
        await api('DELETE', 'channels/webpush/subscription', { endpoint: sub.endpoint }).catch(() => {});
        await sub.unsubscribe();
      }
      pushState(false);
    } catch (err) {
      pushState(false, describe(err));
    }
  });

  // fromNotification shows the prompt a notification opened the page for
  // (#answer=<token>&action=<id>) and answers it with the notification's
  // token: no sign-in needed. The token leaves the address bar at once.
  async function fromNotification() {
    const h = new URLSearchParams(location.hash.slice(1));
    const token = h.get('answer') || '';
    const actionId = h.get('action') || '';
    if (!token || !actionId) return;
    history.replaceState(null, '', location.pathname + location.search);
    linkedEl.hidden = false;
    const sub = await subscription();
    const endpoint = sub ? sub.endpoint : '';
    let rec;
    try {
      rec = await api('POST', 'channels/webpush/prompt', { token, endpoint });
    } catch (err) {
      linkedErrorEl.textContent = describe(err);
      linkedErrorEl.hidden = false;
      return;
    }
    remember(rec.action_id);
    const c = buildCard(rec, (card, decision) => settle(card, decision,
      () => api('POST', 'channels/webpush/answer', { token, endpoint, action_id: rec.action_id, decision })));
    linkedListEl.append(c.li);
    if (rec.state !== 'pending') closeCard(c, rec);
  }

  setInterval(tickExpiry, 1000);
  // A notification clicked while the page is open navigates it to a new
  // fragment, which reloads nothing.
  window.addEventListener('hashchange', fromNotification);
  fromNotification();
  claimPeerId().then(start);
})();
