// The console's only way to the node: same-origin /api/v1 with the session's
// bearer token (sessionStorage, never the URL).
const KEY = 'freesan-token';

export const session = {
  get token() { return sessionStorage.getItem(KEY); },
  set token(t) { if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY); },
  who: null,
};

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export async function api(path, { method = 'GET', body } = {}) {
  const headers = { Authorization: `Bearer ${session.token}` };
  if (method !== 'GET') headers['Content-Type'] = 'application/json';
  let r;
  try {
    r = await fetch(`/api/v1${path}`, {
      method, headers, body: body === undefined ? (method === 'GET' ? undefined : '{}') : JSON.stringify(body),
      cache: 'no-store', credentials: 'omit',
    });
  } catch (e) {
    throw new ApiError(0, `the node did not answer (${e.message})`);
  }
  let data = null;
  const text = await r.text();
  try { data = text ? JSON.parse(text) : null; } catch { data = { error: text }; }
  if (!r.ok) {
    console.warn(`freesan: ${method} ${path}: ${r.status} ${(data && data.error) || ''}`);
    const err = new ApiError(r.status, (data && data.error) || `${r.status} ${r.statusText}`);
    if (r.status === 401) window.dispatchEvent(new CustomEvent('freesan-unauthorized'));
    throw err;
  }
  return data;
}

// The answer, or `fallback` when the node has no such route (404: an older node).
export async function optional(path, fallback = null) {
  try { return await api(path); } catch (e) { if (e.status === 404) return fallback; throw e; }
}

// Runs `tick` now and again every `base` ms while the page lives: slower when
// the tab is hidden, exponentially slower after errors (up to a minute).
export function poll(tick, base = 2000, onError = () => {}) {
  let stopped = false, timer = null, failures = 0;
  const run = async () => {
    timer = null;
    if (stopped) return;
    try { await tick(); failures = 0; } catch (e) { failures += 1; onError(e); }
    if (stopped) return;
    let delay = document.hidden ? base * 5 : base;
    if (failures) delay = Math.min(60000, base * 2 ** failures);
    timer = setTimeout(run, delay);
  };
  const wake = () => { if (!document.hidden && timer && !failures) { clearTimeout(timer); run(); } };
  document.addEventListener('visibilitychange', wake);
  run();
  return () => { stopped = true; if (timer) clearTimeout(timer); document.removeEventListener('visibilitychange', wake); };
}
