// Small DOM helpers: escaped HTML templates, numbers, tables, dialogs, notices.
export const esc = (v) => String(v ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);

// html`...${x}...` escapes every value except raw(...) ones.
export class Raw { constructor(s) { this.s = s; } toString() { return this.s; } }
export const raw = (s) => new Raw(s);
export function html(strings, ...vals) {
  let out = strings[0];
  vals.forEach((v, i) => {
    const s = Array.isArray(v) ? v.map((x) => (x instanceof Raw ? x.s : esc(x))).join('') : v instanceof Raw ? v.s : esc(v);
    out += s + strings[i + 1];
  });
  return raw(out);
}

export function bytes(n) {
  if (n == null || isNaN(n)) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0; n = Number(n);
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i && n < 10 ? 1 : 0)} ${u[i]}`;
}
export const num = (n, d = 0) => (n == null || isNaN(n) ? '–' : Number(n).toFixed(d));
export const pct = (n) => (n == null || isNaN(n) ? '–' : `${Number(n).toFixed(1)} %`);
export function eta(secs) {
  if (secs == null || !isFinite(secs)) return '';
  secs = Math.round(secs);
  if (secs < 60) return `${secs} s`;
  if (secs < 3600) return `${Math.floor(secs / 60)} min ${secs % 60} s`;
  return `${Math.floor(secs / 3600)} h ${Math.floor((secs % 3600) / 60)} min`;
}
export function stateBadge(s) {
  const v = String(s ?? 'unknown');
  const cls = /^info$/i.test(v) ? 'info' : /^(ok|active|online|healthy|up|primary|done|optimal|clean|in_sync|insync|in-sync|leader|connected|member|attached|consistent)$/i.test(v) ? 'good'
    : /(fail|fault|error|offline|down|lost|missing|split|critical|stalled)/i.test(v) ? 'bad' : 'warn';
  return html`<span class="badge ${cls}">${v}</span>`;
}

export function table(cols, rows, empty = 'None.') {
  if (!rows.length) return html`<p class="empty">${empty}</p>`;
  return html`<div class="tablewrap"><table><thead><tr>${cols.map((c) => html`<th scope="col">${c}</th>`)}</tr></thead>
<tbody>${rows.map((r) => html`<tr>${r.map((c) => html`<td>${c}</td>`)}</tr>`)}</tbody></table></div>`;
}

export function $(sel, root = document) { return root.querySelector(sel); }

export function notice(msg, kind = 'info') {
  const box = $('#notices');
  if (!box) return;
  const p = document.createElement('p');
  p.className = `notice ${kind}`;
  p.textContent = msg;
  box.append(p);
  while (box.children.length > 3) box.firstChild.remove();
  setTimeout(() => p.remove(), kind === 'error' ? 10000 : 4000);
}

// Asks the user to confirm a destructive action by typing `name`; resolves true
// when they did.
export function confirmByName(what, name, verb = 'Confirm') {
  return new Promise((resolve) => {
    const d = document.createElement('dialog');
    d.className = 'confirm';
    d.setAttribute('aria-labelledby', 'confirm-title');
    d.innerHTML = html`<form method="dialog">
<h2 id="confirm-title">${what}</h2>
<p>This cannot be undone. Type <strong class="mono">${name}</strong> to confirm.</p>
<label for="confirm-name">Name</label>
<input id="confirm-name" name="confirm-name" autocomplete="off" spellcheck="false">
<div class="buttons"><button type="button" value="cancel" class="secondary">Cancel</button>
<button type="submit" value="ok" class="danger" disabled>${verb}</button></div></form>`.s;
    document.body.append(d);
    const input = d.querySelector('input'), ok = d.querySelector('button[value=ok]');
    input.addEventListener('input', () => { ok.disabled = input.value !== name; });
    d.querySelector('button[value=cancel]').addEventListener('click', () => d.close('cancel'));
    d.addEventListener('close', () => { resolve(d.returnValue === 'ok' && input.value === name); d.remove(); });
    d.showModal();
    input.focus();
  });
}
