// freesan's web console: a login page (a bearer token, kept in sessionStorage),
// then one page per hash route, each updating itself by polling the API.
import './style.css';
import { api, session, ApiError } from './api.js';
import { html, notice } from './ui.js';
import * as pages from './pages.js';

const ROUTES = [
  ['overview', pages.overview], ['storage', pages.storage], ['san', pages.san], ['cache', pages.cache],
  ['ha', pages.ha], ['performance', pages.performance], ['events', pages.events],
];
const app = document.getElementById('app');
let unmount = null;

function login(message = '') {
  if (unmount) { unmount(); unmount = null; }
  session.token = null; session.who = null;
  document.title = 'Sign in · freesan console';
  app.innerHTML = html`<main class="login"><h1>freesan console</h1>
<form id="login" class="form stack">
<p>Sign in with an API token (<code>freesan api token create NAME</code> on the node).</p>
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="off" required spellcheck="false">
<p id="login-error" class="error" role="alert">${message}</p>
<button type="submit">Sign in</button></form></main>`.s;
  const f = document.getElementById('login');
  f.token.focus();
  f.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    session.token = f.token.value.trim();
    try {
      session.who = await api('/whoami');
    } catch (e) {
      const msg = e.status === 401 ? 'That token is not valid on this node.'
        : e.status === 404 ? 'This node does not know /api/v1/whoami: it is too old for this console.' : e.message;
      login(msg);
      return;
    }
    if (!location.hash || location.hash === '#/') location.hash = '#/overview';
    shell();
  });
}

function shell() {
  const who = session.who;
  app.innerHTML = html`<a class="skip" href="#page">Skip to the page</a>
<header class="top"><span class="brand">freesan</span>
<span class="who">Signed in as <b id="who-name">${who.name}</b> <span class="badge ${who.role === 'admin' ? 'good' : 'warn'}" id="who-role">${who.role}</span></span>
<button id="logout" class="secondary small">Sign out</button></header>
<nav aria-label="Pages"><ul>${ROUTES.map(([r, p]) => html`<li><a href="#/${r}" data-route="${r}">${p.title}</a></li>`)}</ul></nav>
<main id="page" tabindex="-1"></main>
<div id="notices" aria-live="polite"></div>`.s;
  document.getElementById('logout').addEventListener('click', () => { location.hash = ''; login(); });
  route();
}

function route() {
  if (!session.who) return;
  const name = (location.hash.replace(/^#\/?/, '') || 'overview').split('/')[0];
  const entry = ROUTES.find(([r]) => r === name) || ROUTES[0];
  if (unmount) { unmount(); unmount = null; }
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.route === entry[0]) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  document.title = `${entry[1].title} · freesan console`;
  const page = document.getElementById('page');
  // a fresh element per visit: listeners a page adds go away with it
  const root = document.createElement('div');
  page.replaceChildren(root);
  page.dataset.page = entry[0];
  unmount = entry[1].mount(root);
}

window.addEventListener('hashchange', route);
window.addEventListener('freesan-unauthorized', () => { if (session.who) login('The session ended: the token is no longer valid.'); });

(async () => {
  if (!session.token) return login();
  try { session.who = await api('/whoami'); shell(); } catch (e) { login(e instanceof ApiError && e.status === 401 ? '' : e.message); }
})();
window.freesanNotice = notice;
