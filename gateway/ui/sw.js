// Gatehouse approvals service worker: shows a notification for each
// permission prompt pushed to this browser, replaces it by its outcome once
// the prompt is answered anywhere, and answers from the notification's
// actions with the prompt's one-time token, so a phone answers in one tap
// without signing in. Plain script, no build step.
'use strict';

// Relative to the worker's scope (/ui/), so it also works behind a proxy
// that mounts the gateway under a path prefix.
const API = new URL('../v0/', self.registration.scope);

const DECISIONS = { allow_once: 'Allow once', deny: 'Deny' };

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil(self.clients.claim()));

self.addEventListener('push', (e) => {
  let m = null;
  try { m = e.data ? e.data.json() : null; } catch { m = null; }
  e.waitUntil(received(m));
});

self.addEventListener('notificationclick', (e) => {
  e.waitUntil(clicked(e.notification, e.action));
});

// received shows a prompt, or replaces a settled one's notification by
// its outcome: quietly, without actions. Every push shows something, as
// browsers require of a subscription that is userVisibleOnly.
async function received(m) {
  if (!m || typeof m.action_id !== 'string' || typeof m.title !== 'string') {
    return self.registration.showNotification('Gatehouse approvals', {
      body: 'A message arrived that this page cannot read: open the approvals page.', tag: 'gatehouse-unreadable',
    });
  }
  if (m.type === 'resolved') {
    return self.registration.showNotification(m.title, {
      body: m.body, tag: m.action_id, silent: true, icon: 'icon-192.png', data: { action_id: m.action_id },
    });
  }
  return self.registration.showNotification(m.title, {
    body: m.body,
    tag: m.action_id,
    renotify: true,
    requireInteraction: true,
    icon: 'icon-192.png',
    data: { action_id: m.action_id, token: m.token || '' },
    actions: Object.entries(DECISIONS).map(([action, title]) => ({ action, title })),
  });
}

// clicked answers with the action pressed, or, for a click on the
// notification itself, opens the approvals page at the prompt.
async function clicked(n, action) {
  const d = n.data || {};
  if (DECISIONS[action] && d.token) return answer(n, d, action);
  n.close();
  const url = new URL('./', self.registration.scope);
  if (d.token) url.hash = new URLSearchParams({ answer: d.token, action: d.action_id }).toString();
  const open = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
  for (const c of open) {
    if (c.url.startsWith(self.registration.scope) && 'navigate' in c) {
      await c.focus();
      return c.navigate(url.href);
    }
  }
  return self.clients.openWindow(url.href);
}

// answer posts the decision with the notification's token and this
// browser's subscription, then shows how the prompt ended.
async function answer(n, d, decision) {
  let text;
  try {
    const sub = await self.registration.pushManager.getSubscription();
    const resp = await fetch(new URL('channels/webpush/answer', API), {
      method: 'POST',
      cache: 'no-store',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
      body: JSON.stringify({ token: d.token, action_id: d.action_id, decision, endpoint: sub ? sub.endpoint : '' }),
    });
    const body = await resp.json().catch(() => ({}));
    if (resp.ok) text = outcome(body);
    else if (resp.status === 409 && body.details && body.details.recorded) text = 'Already answered: ' + outcome(body.details.recorded);
    else text = 'Not recorded (' + (body.code || 'HTTP ' + resp.status) + '): open the approvals page to answer.';
  } catch {
    text = 'Not recorded: the gateway cannot be reached. Open the approvals page to answer.';
  }
  return self.registration.showNotification(n.title, {
    body: text, tag: d.action_id, silent: true, icon: 'icon-192.png', data: { action_id: d.action_id },
  });
}

// outcome says how a settled prompt ended, as the gateway's other
// channels say it.
function outcome(rec) {
  const what = {
    approved: rec.decision === 'allow_always' ? 'Allowed for the rest of the session' : 'Allowed once',
    denied: 'Denied',
    expired: 'Expired with no answer',
    cancelled: 'Withdrawn: the execution ended',
  }[rec.state] || 'Pending';
  const by = rec.decided_by;
  return by && by.principal ? what + ' by ' + by.principal + (by.channel_id ? ' via ' + by.channel_id : '') : what;
}
