// The console's pages. Each page's mount(el) draws its frame once (forms stay
// put while the user types) and returns a function that stops its polling.
import { api, optional, poll, session } from './api.js';
import { html, raw, esc, bytes, num, pct, eta, stateBadge, table, notice, confirmByName } from './ui.js';
import { LiveChart, columns } from './chart.js';

const admin = () => session.who?.role === 'admin';

// Without GET /api/v1/history (an older node), the node's rates come from the
// I/O totals of GET /api/v1/status, sampled by the pages while they poll.
const sampled = { last: null, series: [] };
function sampleNode(status) {
  const io = status?.io;
  if (!io) return sampled.series;
  const t = Date.now();
  const l = sampled.last;
  if (l && t > l.t) {
    const dt = (t - l.t) / 1000;
    const d = (k) => Math.max(0, (io[k] - l.io[k]) / dt);
    sampled.series.push({ t, read_iops: d('read_ops'), write_iops: d('write_ops'), read_mbs: d('read_bytes') / 1e6, write_mbs: d('write_bytes') / 1e6, latency_us: null });
    if (sampled.series.length > 600) sampled.series.shift();
  }
  sampled.last = { t, io };
  return sampled.series;
}
// "2026-11-25T15:29:19.468Z" -> "2026-11-25 15:29:19 UTC"
const when = (t) => (typeof t === 'string' ? t.replace('T', ' ').replace(/\.\d+Z$|Z$/, ' UTC') : t ?? '–');
const NA = (what) => html`<p class="empty">${what} not available on this node.</p>`;

// A disk's state badge, with why a failed disk was failed when it stopped
// answering (and how many of its requests the device still holds: it can be
// taken back once none), and how often a request to it was waited for past
// its command timeout (its pool or cache could not do without it).
function diskState(d) {
  if (!d.state) return '–';
  const held = d.stopped_answering && d.in_flight ? html`<br><span class="muted">${d.in_flight} request${d.in_flight === 1 ? '' : 's'} still at the device: it can be taken back once ${d.in_flight === 1 ? 'it ends' : 'they end'}</span>` : '';
  const why = d.stopped_answering ? html`<br><span class="muted">stopped answering: ${d.stopped_answering}</span>${held}` : '';
  const waited = d.timeouts_waited ? html`<br><span class="muted">waited past its timeout ${d.timeouts_waited}×</span>` : '';
  return html`${stateBadge(d.state)}${why}${waited}`;
}

// Runs a changing request from a button or form; reports the outcome.
async function act(label, path, body) {
  try {
    await api(path, { method: 'POST', body });
    notice(`${label}: done`, 'ok');
    return true;
  } catch (e) {
    notice(`${label}: ${e.message}`, 'error');
    return false;
  }
}

// Binds clicks on [data-act] buttons inside `root` to handlers[name](dataset).
function delegate(root, handlers) {
  root.addEventListener('click', async (ev) => {
    const b = ev.target.closest('button[data-act]');
    if (!b || !root.contains(b)) return;
    const h = handlers[b.dataset.act];
    if (!h) return;
    b.disabled = true;
    try { await h(b.dataset, b); } finally { b.disabled = false; }
  });
}

// Replaces the content of `sel` only when it changed (a poll must not take the
// keyboard focus away), and puts the focus back on the same control if it was
// inside.
const focusKey = (e) => e && (e.id || ['act', 'pool', 'name', 'lun', 'target', 'cache', 'position', 'device'].map((k) => e.dataset?.[k] ?? '').join('|'));
function set(el, sel, content) { put(el.querySelector(sel), content); }
function put(n, content) {
  if (!n) return;
  const s = String(content);
  if (n.freesanHtml === s) return;
  n.freesanHtml = s;
  const had = n.contains(document.activeElement) ? focusKey(document.activeElement) : null;
  n.innerHTML = s;
  if (had) {
    const back = [...n.querySelectorAll('a, button, input, select, textarea')].find((x) => focusKey(x) === had);
    if (back) back.focus();
  }
}

// The newest `n` events (the API pages oldest first from a sequence number).
async function newestEvents(n) {
  const head = await api('/events?limit=1');
  const since = Math.max(0, (head.last_seq || 0) - n);
  const r = await api(`/events?since=${since}&limit=${Math.min(n, 1000)}`);
  return (r.events || []).slice().reverse();
}

function progressBar(label, frac, extra = '') {
  const p = Math.max(0, Math.min(100, frac * 100));
  return html`<div class="progress"><progress max="100" value="${p.toFixed(1)}" aria-label="${label}">${p.toFixed(0)} %</progress>
<span>${label}: ${p.toFixed(1)} %${extra ? ` · ${extra}` : ''}</span></div>`;
}

// Whatever a pool reports of a rebuild/resync/scrub in progress, with an ETA.
function poolActivity(p) {
  const out = [];
  for (const key of ['rebuild', 'resync', 'scrub', 'reshape']) {
    const a = p[key];
    if (!a || typeof a !== 'object') continue;
    const done = a.done_bytes ?? a.position_bytes ?? a.completed_bytes;
    const total = a.total_bytes ?? a.size_bytes;
    let frac = a.progress ?? a.fraction ?? (a.percent != null ? a.percent / 100 : null);
    if (frac == null && done != null && total) frac = done / total;
    const st = a.state || (a.running === false ? 'done' : 'running');
    let extra = st;
    if (a.eta_secs != null) extra += ` · ETA ${eta(a.eta_secs)}`;
    else if (a.rate_mb_s && done != null && total) extra += ` · ETA ${eta((total - done) / (a.rate_mb_s * 1e6))}`;
    if (a.errors != null) extra += ` · ${a.errors} errors`;
    if (a.mismatches != null) extra += ` · ${a.mismatches} mismatches`;
    out.push(frac != null ? progressBar(key, frac, extra) : html`<p>${key}: ${extra}</p>`);
  }
  return out.length ? out : [html`<span class="muted">idle</span>`];
}

// ---------------------------------------------------------------- Overview
export const overview = {
  title: 'Overview',
  mount(el) {
    el.innerHTML = html`<h1>Overview</h1>
<section class="cards" id="ov-cards" aria-label="Health and capacity"></section>
<section aria-labelledby="ov-alerts-h"><h2 id="ov-alerts-h">Recent alerts</h2><div id="ov-alerts"></div></section>
<section aria-labelledby="ov-io-h"><h2 id="ov-io-h">Node I/O (last 5 minutes)</h2><p class="muted" id="ov-io-note"></p>
<div class="figures" id="ov-figs"></div>
<div class="chart" id="ov-iops"></div><div class="chart" id="ov-lat"></div></section>`.s;
    const iops = new LiveChart(el.querySelector('#ov-iops'), 'node-iops', [{ label: 'read IOPS' }, { label: 'write IOPS' }], { yLabel: 'IOPS' });
    const lat = new LiveChart(el.querySelector('#ov-lat'), 'node-latency', [{ label: 'latency µs' }], { yLabel: 'µs' });
    const stop = poll(async () => {
      const [status, pools, events, hist] = await Promise.all([
        api('/status'), api('/pools'), newestEvents(200), optional('/history?window=300'),
      ]);
      const cap = pools.reduce((a, p) => a + (p.usable_bytes ?? p.capacity_bytes ?? 0), 0);
      const bad = pools.filter((p) => !/^(ok|optimal)$/i.test(p.state || '') || p.lost_blocks > 0);
      const alerts = events.filter((e) => e.severity !== 'info').slice(0, 10);
      const badCaches = (status.caches || []).filter((c) => c.state && c.state !== 'ok');
      const health = pools.some((p) => p.state === 'failed') ? 'failed' : bad.length || badCaches.length ? 'degraded' : 'ok';
      const luns = (status.targets || []).reduce((a, t) => a + (t.luns?.length ?? 0), 0) || (status.luns?.length ?? 0);
      set(el, '#ov-cards', html`
<div class="card"><h2>Health</h2><p class="big" id="ov-health">${stateBadge(health)}</p></div>
<div class="card"><h2>Pools</h2><p class="big">${pools.length}</p><p>${bad.length ? `${bad.length} need${bad.length === 1 ? 's' : ''} attention: ${bad.map((p) => `${p.name} ${p.state}${p.lost_blocks > 0 ? `, ${p.lost_blocks} blocks lost` : ''}`).join(', ')}` : 'all optimal'}</p></div>
<div class="card"><h2>Capacity</h2><p class="big">${bytes(cap)}</p><p>usable in pools</p></div>
<div class="card"><h2>LUNs</h2><p class="big">${luns}</p><p>${(status.portals || []).join(', ')}</p></div>
<div class="card"><h2>Version</h2><p class="big">${status.version ?? '–'}</p></div>`);
      set(el, '#ov-alerts', alerts.length
        ? html`<ul class="alerts">${alerts.map((e) => html`<li class="alert sev-${e.severity}">${stateBadge(e.severity)} <time>${when(e.time)}</time> <strong>${e.object}</strong> ${e.message}</li>`)}</ul>`
        : html`<p class="empty">No warnings.</p>`);
      const s = hist ? hist.node || [] : sampleNode(status);
      el.querySelector('#ov-io-note').textContent = hist ? '' : 'This node keeps no I/O history: the rates are sampled by this page while it is open (no latency).';
      const last = s[s.length - 1] || {};
      set(el, '#ov-figs', html`<span class="fig">read <b id="ov-riops">${num(last.read_iops)}</b> IOPS</span>
<span class="fig">write <b id="ov-wiops">${num(last.write_iops)}</b> IOPS</span>
<span class="fig"><b>${num((last.read_mbs ?? 0) + (last.write_mbs ?? 0), 1)}</b> MB/s</span>
<span class="fig"><b>${num(last.latency_us)}</b> µs</span>`);
      const [x, ys] = columns(s, ['read_iops', 'write_iops']);
      iops.set(x, ys);
      const [x2, ys2] = columns(s, ['latency_us']);
      lat.set(x2, ys2);
    }, 2000, (e) => notice(`Overview: ${e.message}`, 'error'));
    return () => { stop(); iops.destroy(); lat.destroy(); };
  },
};

// ---------------------------------------------------------------- Storage
export const storage = {
  title: 'Storage',
  mount(el) {
    el.innerHTML = html`<h1>Storage</h1>
<section aria-labelledby="st-pools-h"><h2 id="st-pools-h">Pools</h2><div id="st-pools"></div></section>
${admin() ? html`<section aria-labelledby="st-new-h"><h2 id="st-new-h">Create a pool</h2>
<form id="st-new" class="form">
<label for="st-new-name">Name</label><input id="st-new-name" name="name" required pattern="[A-Za-z0-9_.-]+">
<label for="st-new-level">Level</label><select id="st-new-level" name="level">
<option>raid1</option><option>raid5</option><option>raid6</option><option>raid10</option><option>raid0</option></select>
<fieldset><legend>Free disks</legend><div id="st-free"></div></fieldset>
<button type="submit">Create pool</button></form></section>` : ''}
<section aria-labelledby="st-disks-h"><h2 id="st-disks-h">Disks</h2><div id="st-disks"></div></section>`.s;
    let freeNames = null;
    const form = el.querySelector('#st-new');
    if (form) {
      form.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        const members = [...form.querySelectorAll('input[name=disk]:checked')].map((c) => c.value);
        if (members.length < 2) { notice('Choose at least two free disks.', 'error'); return; }
        const body = { name: form.name.value.trim(), level: form.level.value, members };
        if (await act(`Create pool ${body.name}`, '/pools', body)) { form.reset(); tick(); }
      });
    }
    delegate(el, {
      scrub: (d) => act(`Scrub ${d.pool}`, `/pools/${encodeURIComponent(d.pool)}/scrub`),
      fail: async (d) => {
        if (!(await confirmByName(`Fail member ${d.name}`, d.name, 'Fail'))) return;
        await act(`Fail ${d.name}`, `/pools/${encodeURIComponent(d.pool)}/fail`, { position: Number(d.position) });
        tick();
      },
      replace: async (d) => {
        const sel = el.querySelector(`#st-rep-${CSS.escape(d.pool)}`);
        if (!sel || !sel.value) { notice('Choose a free disk to replace with.', 'error'); return; }
        if (!(await confirmByName(`Replace member ${d.name}`, d.name, 'Replace'))) return;
        await act(`Replace ${d.name}`, `/pools/${encodeURIComponent(d.pool)}/replace`, { position: Number(d.position), disk: sel.value });
        tick();
      },
      spare: async (d) => {
        const sel = el.querySelector(`#st-rep-${CSS.escape(d.pool)}`);
        if (!sel || !sel.value) { notice('Choose a free disk to add as a spare.', 'error'); return; }
        await act(`Add spare ${sel.value}`, `/pools/${encodeURIComponent(d.pool)}/spares`, { disk: sel.value });
        tick();
      },
      // a disk that stopped answering, answering again: back to the free
      // disks (the node refuses while the device still holds a request, or
      // while something serves from the disk, and says why)
      reopen: async (d) => {
        try {
          const r = await api('/disks/reopen', { method: 'POST', body: { name: d.name } });
          const at = r.failed_in;
          const back = at ? ` · give it back to pool ${at.pool} with Replace… at position ${at.position} (rebuilt onto it)` : '';
          notice(`Take back ${d.name}: done${back}`, 'ok');
        } catch (e) {
          notice(`Take back ${d.name}: ${e.message}`, 'error');
        }
        tick();
      },
      rate: async (d) => {
        const inp = el.querySelector(`#st-rate-${CSS.escape(d.pool)}`);
        await act(`Rebuild rate of ${d.pool}`, `/pools/${encodeURIComponent(d.pool)}/rebuild-rate`, { mb_s: Number(inp.value) || 0 });
        tick();
      },
    });
    const tick = async () => {
      const [pools, disks] = await Promise.all([api('/pools'), api('/disks')]);
      const used = new Set();
      for (const p of pools) for (const m of [...(p.members || []), ...(p.spares || [])]) used.add(typeof m === 'string' ? m : m.name);
      const isFree = (d) => (d.role ? d.role === 'free' : d.free ?? !used.has(d.name));
      const free = disks.filter(isFree);
      const size = (d) => (d.size_bytes != null ? bytes(d.size_bytes) : d.size ?? '–');
      const freeOpts = html`<option value="">free disk…</option>${free.map((d) => html`<option>${d.name}</option>`)}`;
      set(el, '#st-pools', pools.length ? raw(pools.map((p) => html`<article class="pool" data-pool="${p.name}">
<h3>${p.name} <span class="muted">${p.level}</span> ${stateBadge(p.state)}</h3>
<p>${bytes(p.usable_bytes ?? p.capacity_bytes)} usable · redundancy ${p.redundancy ?? '–'} · rebuild rate ${p.rebuild_rate_mb_s ? `${p.rebuild_rate_mb_s} MB/s` : 'uncapped'}</p>
<div class="activity">${poolActivity(p)}</div>
${p.rebuild_stalled ? html`<p class="alert sev-critical stalled">${stateBadge('stalled')} <strong>Rebuild stalled at stripe ${p.rebuild_stalled.stripe}</strong> after ${p.rebuild_stalled.attempts} attempts: ${p.rebuild_stalled.error}. The pool stays degraded until that stripe can be read or given up, or the disk named is replaced.</p>` : ''}
${p.lost_blocks ? html`<p class="alert sev-critical lost">${stateBadge('lost')} <strong>${p.lost_blocks} block${p.lost_blocks === 1 ? '' : 's'} lost</strong>: a rebuild met unreadable sectors where no redundancy was left and gave them up (pool blocks ${(p.lost_ranges || []).slice(0, 8).map(([a, n]) => (n === 1 ? `${a}` : `${a}–${a + n - 1}`)).join(', ')}${(p.lost_ranges || []).length > 8 ? ', …' : ''}). Reads of them fail until they are written again: restore them from a backup.</p>` : ''}
${p.last_scrub ? html`<p>Last scrub: ${p.last_scrub.stripes_checked} stripes checked, ${p.last_scrub.mismatches} mismatches, ${p.last_scrub.repaired} repaired, ${p.last_scrub.unrepairable} unrepairable, ${p.last_scrub.read_errors} read errors</p>` : ''}
${table(['#', 'Disk', 'State', 'Errors', ...(admin() ? ['Actions'] : [])], (p.members || []).map((m, i) => {
        const name = typeof m === 'string' ? m : m.name;
        const pos = m.position ?? i;
        return [pos, name, stateBadge(m.state), m.errors ?? '–', ...(admin() ? [html`<button class="danger small" data-act="fail" data-pool="${p.name}" data-position="${pos}" data-name="${name}">Fail…</button>
<button class="small secondary" data-act="replace" data-pool="${p.name}" data-position="${pos}" data-name="${name}">Replace…</button>`] : [])];
      }))}
<p>Spares: ${(p.spares || []).map((s) => (typeof s === 'string' ? s : s.name)).join(', ') || 'none'}</p>
${admin() ? html`<div class="actions"><button class="small" data-act="scrub" data-pool="${p.name}">Scrub</button>
<label for="st-rep-${p.name}">Free disk</label><select id="st-rep-${p.name}">${freeOpts}</select>
<button class="small secondary" data-act="spare" data-pool="${p.name}">Add as spare</button>
<label for="st-rate-${p.name}">Rebuild MB/s (0 = uncapped)</label><input id="st-rate-${p.name}" type="number" min="0" class="narrow" value="${p.rebuild_rate_mb_s ?? 0}">
<button class="small secondary" data-act="rate" data-pool="${p.name}">Set rate</button></div>` : ''}
</article>`).join('')) : html`<p class="empty">No pools.</p>`);
      const takeBack = (d) => (d.stopped_answering ? html`<button class="small secondary" data-act="reopen" data-name="${d.name}" aria-label="Take back disk ${d.name}">Take back</button>` : '');
      set(el, '#st-disks', table(['Disk', 'Model', 'Size', 'State', 'Errors', 'Read µs', 'Write µs', 'Pool', 'Role', ...(admin() ? ['Actions'] : [])], disks.map((d) => [
        d.name, d.model ?? (d.simulated ? 'simulated' : 'file'), size(d), diskState(d), d.errors ?? '–',
        num(d.read_latency_us), num(d.write_latency_us), d.pool ?? '–', d.role ?? (isFree(d) ? 'free' : 'in use'),
        ...(admin() ? [takeBack(d)] : [])])));
      const fl = el.querySelector('#st-free');
      const names = free.map((d) => d.name).join(',');
      if (fl && names !== freeNames) {
        freeNames = names;
        fl.innerHTML = free.length ? free.map((d) => html`<label class="check"><input type="checkbox" name="disk" value="${d.name}"> ${d.name} <span class="muted">${size(d)}</span></label>`.s).join('') : '<p class="empty">No free disks.</p>';
      }
    };
    return poll(tick, 2000, (e) => notice(`Storage: ${e.message}`, 'error'));
  },
};

// ---------------------------------------------------------------- SAN
export const san = {
  title: 'SAN',
  mount(el) {
    el.innerHTML = html`<h1>SAN</h1>
<section aria-labelledby="sn-t-h"><h2 id="sn-t-h">Targets</h2><div id="sn-targets"></div></section>
<section aria-labelledby="sn-l-h"><h2 id="sn-l-h">LUNs</h2><div id="sn-luns"></div></section>
${admin() ? html`<section aria-labelledby="sn-new-h"><h2 id="sn-new-h">Create a LUN</h2>
<form id="sn-new" class="form">
<label for="sn-new-target">Target</label><select id="sn-new-target" name="target"></select>
<label for="sn-new-id">LUN number</label><input id="sn-new-id" name="id" type="number" min="0" max="16383" required>
<label for="sn-new-pool">Pool</label><select id="sn-new-pool" name="pool"></select>
<p class="muted">A LUN on a pool serves the pool's whole usable space.</p>
<button type="submit">Create LUN</button></form></section>` : ''}
<section aria-labelledby="sn-s-h"><h2 id="sn-s-h">Sessions and paths</h2><div id="sn-sessions"></div></section>`.s;
    const form = el.querySelector('#sn-new');
    let filled = '';
    if (form) {
      form.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        const lun = { id: Number(form.id.value), pool: form.pool.value };
        const body = { target: form.target.value, lun };
        if (await act(`Create LUN ${lun.id}`, '/luns', body)) { form.id.value = ''; tick(); }
      });
    }
    delegate(el, {
      del: async (d) => {
        const name = `${d.target}/${d.lun}`;
        if (!(await confirmByName(`Delete LUN ${name}`, name, 'Delete'))) return;
        await act(`Delete LUN ${name}`, '/luns/delete', { target: d.target, lun: Number(d.lun) });
        tick();
      },
      chap: async (d, b) => {
        const f = b.closest('form');
        const user = f.querySelector('[name=user]').value.trim();
        const secret = f.querySelector('[name=secret]').value;
        await act(`CHAP of ${d.target}`, `/targets/${encodeURIComponent(d.target)}/chap`, user ? { user, secret } : { user: null });
      },
      acl: async (d, b) => {
        const f = b.closest('form');
        const initiators = f.querySelector('[name=acl]').value.split(/[\s,]+/).filter(Boolean);
        await act(`ACL of ${d.target}`, `/targets/${encodeURIComponent(d.target)}/acl`, { initiators });
      },
    });
    const editing = () => el.querySelector('#sn-targets')?.contains(document.activeElement);
    const tick = async () => {
      const [status, luns, targets, pools] = await Promise.all([api('/status'), api('/luns'), optional('/targets'), api('/pools')]);
      const tnames = targets ? targets.map((t) => t.name) : [...new Set([...(status.targets || []).map((t) => t.iqn ?? t.name), ...luns.map((l) => l.target)])];
      if (form) {
        const key = tnames.join() + '|' + pools.map((p) => p.name).join();
        if (key !== filled) {
          filled = key;
          form.target.innerHTML = tnames.map((t) => html`<option>${t}</option>`.s).join('');
          form.pool.innerHTML = pools.map((p) => html`<option>${p.name}</option>`.s).join('');
        }
      }
      if (!editing()) {
        set(el, '#sn-targets', targets ? raw(targets.map((t) => html`<article class="target"><h3 class="mono">${t.name}</h3>
<p>Portals: ${(t.portals || []).join(', ') || '–'} · CHAP: ${t.chap ? `${t.chap.user}${t.chap.mutual ? ' (mutual)' : ''}` : 'off'} · ACL: ${(t.acl || []).join(', ') || 'any initiator'}</p>
${admin() ? html`<form class="form inline" data-target="${t.name}">
<label for="chap-u-${t.name}">CHAP user</label><input id="chap-u-${t.name}" name="user" value="${t.chap?.user ?? ''}" autocomplete="off">
<label for="chap-s-${t.name}">CHAP secret</label><input id="chap-s-${t.name}" name="secret" type="password" autocomplete="new-password">
<button type="button" class="small secondary" data-act="chap" data-target="${t.name}">Set CHAP</button>
<label for="acl-${t.name}">Allowed initiators</label><input id="acl-${t.name}" name="acl" value="${(t.acl || []).join(' ')}" class="wide">
<button type="button" class="small secondary" data-act="acl" data-target="${t.name}">Set ACL</button></form>` : ''}
</article>`).join('')) : html`<p>${tnames.join(', ')}</p><p class="empty">Portals, CHAP and ACLs: not available on this node.</p>`);
      }
      const byLun = new Map();
      for (const t of targets || []) for (const l of t.luns || []) byLun.set(`${t.name}/${l.lun}`, l);
      set(el, '#sn-luns', table(['Target', 'LUN', 'Size', 'Backing', 'Cache', 'Replicated', 'Identity', ...(admin() ? ['Actions'] : [])], luns.map((l) => {
        const id = l.id ?? l.lun;
        const x = byLun.get(`${l.target}/${id}`) || {};
        return [html`<span class="mono">${l.target}</span>`, id, bytes(l.size_bytes ?? x.size_bytes), l.backing ?? x.backing ?? '–',
          l.cache ?? x.cache ?? '–', (l.replicated ?? x.replicated) ? 'yes' : 'no', html`<span class="mono small">${l.naa ?? l.serial ?? l.uuid ?? '–'}</span>`,
          ...(admin() ? [html`<button class="danger small" data-act="del" data-target="${l.target}" data-lun="${id}" aria-label="Delete LUN ${l.target}/${id}">Delete…</button>`] : [])];
      })));
      const sessions = [];
      for (const t of targets || []) for (const s of t.sessions || []) sessions.push([html`<span class="mono">${t.name}</span>`, s.initiator, s.isid, (s.portals || []).join(', '), s.connections]);
      set(el, '#sn-sessions', targets ? table(['Target', 'Initiator', 'ISID', 'Paths (portals)', 'Connections'], sessions, 'No sessions.') : NA('Sessions'));
    };
    return poll(tick, 3000, (e) => notice(`SAN: ${e.message}`, 'error'));
  },
};

// ---------------------------------------------------------------- SSD cache
// The advisor's miss-ratio curve (`advisor_curve`: [{cache_bytes, hit_ratio}])
// in MiB and percent, and the recommended size (`advisor_bytes_for_90_percent`)
// marked as its own point.
function advisorCurve(c) {
  const pts = c.advisor_curve || [];
  if (!pts.length) return null;
  const xs = pts.map((p) => p.cache_bytes / 2 ** 20);
  const ys = pts.map((p) => (p.hit_ratio == null ? null : (1 - p.hit_ratio) * 100));
  const rec = c.advisor_bytes_for_90_percent;
  const mark = xs.map(() => null);
  if (rec != null) {
    let best = 0;
    xs.forEach((x, i) => { if (Math.abs(x - rec / 2 ** 20) < Math.abs(xs[best] - rec / 2 ** 20)) best = i; });
    mark[best] = ys[best];
  }
  return { xs, ys, mark, rec };
}

export const cache = {
  title: 'SSD cache',
  mount(el) {
    el.innerHTML = html`<h1>SSD cache</h1><div id="ca-list"></div>`.s;
    const charts = new Map();
    const local = {};
    delegate(el, {
      detach: async (d) => { if (await confirmByName(`Detach cache ${d.cache}`, d.cache, 'Detach')) await act(`Detach ${d.cache}`, `/caches/${encodeURIComponent(d.cache)}/detach`); },
      attach: (d) => act(`Attach ${d.cache}`, `/caches/${encodeURIComponent(d.cache)}/attach`),
      cfail: async (d) => { if (await confirmByName(`Fail cache device ${d.name}`, d.name, 'Fail')) await act(`Fail ${d.name}`, `/caches/${encodeURIComponent(d.cache)}/fail`, { device: Number(d.device) }); },
      creplace: async (d) => {
        const disk = el.querySelector(`#ca-rep-${CSS.escape(d.cache)}`)?.value.trim();
        if (!disk) { notice('Name a free disk to replace the device with.', 'error'); return; }
        if (await confirmByName(`Replace cache device ${d.name}`, d.name, 'Replace')) await act(`Replace ${d.name}`, `/caches/${encodeURIComponent(d.cache)}/replace`, { device: Number(d.device), disk });
      },
    });
    let shape = '';
    const tick = async () => {
      const [caches, hist] = await Promise.all([api('/caches'), optional('/history?window=600')]);
      const key = caches.map((c) => c.name).join();
      const list = el.querySelector('#ca-list');
      if (key !== shape) {
        shape = key;
        for (const c of charts.values()) c.forEach((x) => x.destroy());
        charts.clear();
        list.innerHTML = caches.length ? caches.map((c, i) => html`<article class="cache" id="ca-${i}">
<h2>${c.name} ${raw('<span class="st"></span>')}</h2><div class="figures"></div><div class="warnings"></div>
<h3>Hit rate over time</h3><div class="chart hits"></div>
<h3>Dirty data and destage</h3><div class="chart dirty"></div>
<h3>Advisor: miss ratio by cache size</h3><p class="advice"></p><div class="chart mrc"></div>
<div class="devices"></div>
${admin() ? html`<div class="actions"><button class="small secondary" data-act="attach" data-cache="${c.name}">Attach</button>
<button class="small danger" data-act="detach" data-cache="${c.name}">Detach…</button>
<label for="ca-rep-${c.name}">Replacement disk</label><input id="ca-rep-${c.name}" class="narrow"></div>` : ''}
</article>`.s).join('') : '<p class="empty">No SSD cache on this node.</p>';
        caches.forEach((c, i) => {
          const a = list.querySelector(`#ca-${i}`);
          charts.set(c.name, [
            new LiveChart(a.querySelector('.hits'), `cache-hits-${c.name}`, [{ label: 'read hit %' }, { label: 'write hit %' }], { yLabel: '%', yRange: [0, 100] }),
            new LiveChart(a.querySelector('.dirty'), `cache-dirty-${c.name}`, [{ label: 'dirty MiB' }, { label: 'destage MB/s' }, { label: 'occupancy %' }], { height: 180 }),
            new LiveChart(a.querySelector('.mrc'), `cache-mrc-${c.name}`, [{ label: 'miss ratio %', points: true }, { label: 'recommended size', points: true }], { x: 'cache size MiB', yLabel: 'miss %', height: 180, yRange: [0, 100] }),
          ]);
        });
      }
      caches.forEach((c, i) => {
        const a = list.querySelector(`#ca-${i}`);
        const [hits, dirty, mrc] = charts.get(c.name);
        const ratio = (r) => (r == null ? null : r * 100);
        const rh = ratio(c.recent_read_hit_ratio ?? c.read_hit_ratio);
        const wh = ratio(c.recent_write_hit_ratio ?? c.write_hit_ratio);
        put(a.querySelector('.st'), stateBadge(c.state ?? (c.attached === false ? 'detached' : 'ok')));
        put(a.querySelector('.figures'), html`<span class="fig">read hits <b class="read-hit">${pct(rh)}</b></span>
<span class="fig">write hits <b>${pct(wh)}</b></span><span class="fig">dirty <b>${bytes(c.dirty_bytes)}</b></span>
<span class="fig">destage <b>${num(c.destage_mb_s, 1)}</b> MB/s</span><span class="fig">occupancy <b>${pct(c.occupancy_percent)}</b></span>
<span class="fig">mode <b>${c.mode ?? '–'}</b></span><span class="fig">size <b>${bytes(c.capacity_bytes)}</b></span>`);
        // dirty data the destage found no cache device could read: the only
        // copy of it is lost unless the host writes it again
        put(a.querySelector('.warnings'), c.unreadable_dirty_bytes > 0
          ? html`<p class="alert sev-critical unreadable">${stateBadge('unreadable')} <strong>${bytes(c.unreadable_dirty_bytes)} of dirty data no cache device can read</strong>: written by hosts and not yet on the pool, it is unreadable on every copy. Reads of it fail and it cannot be destaged until a host writes those blocks again (restore them from a backup), so a drain or detach of this cache cannot finish. Replace a device that keeps meeting unreadable sectors.</p>`
          : '');
        const series = hist?.caches?.[c.name];
        if (series) {
          const [x, ys] = columns(series, ['read_hit_pct', 'write_hit_pct']);
          hits.set(x, ys);
          const [x2, ys2] = columns(series, ['dirty_bytes', 'destage_mbs', 'occupancy_pct']);
          ys2[0] = ys2[0].map((v) => (v == null ? null : v / 2 ** 20));
          dirty.set(x2, ys2);
        } else {
          // no history on this node: what this page sees while it is open
          const mine = (local[c.name] ||= []);
          mine.push({ t: Date.now(), read_hit_pct: rh, write_hit_pct: wh, dirty_bytes: c.dirty_bytes, destage_mbs: c.destage_mb_s, occupancy_pct: c.occupancy_percent });
          if (mine.length > 300) mine.shift();
          if (mine.length > 1) {
            const [x, ys] = columns(mine, ['read_hit_pct', 'write_hit_pct']);
            hits.set(x, ys);
            const [x2, ys2] = columns(mine, ['dirty_bytes', 'destage_mbs', 'occupancy_pct']);
            ys2[0] = ys2[0].map((v) => (v == null ? null : v / 2 ** 20));
            dirty.set(x2, ys2);
          }
        }
        const curve = advisorCurve(c);
        if (curve) {
          mrc.set(curve.xs, [curve.ys, curve.mark]);
          a.querySelector('.advice').innerHTML = curve.rec != null
            ? html`Recommended size: <b class="recommended">${bytes(curve.rec)}</b> (the smallest that would serve 90 % of the recent reads; now ${bytes(c.capacity_bytes)})`.s
            : html`No size the advisor evaluates (up to ${bytes(c.advisor_curve[c.advisor_curve.length - 1].cache_bytes)}) would serve 90 % of the recent reads.`.s;
        } else {
          a.querySelector('.advice').textContent = 'The advisor has no curve yet (it needs some traffic).';
        }
        const devs = c.devices || [];
        // reads it answered with unreadable sectors (it stays in service)
        const unreadable = (d) => (d.media_errors ? html`<span class="badge warn">${d.media_errors}</span>` : '0');
        put(a.querySelector('.devices'), table(['#', 'Device', 'State', 'Unreadable sectors met', ...(admin() ? ['Actions'] : [])], devs.map((d, j) => [j, d.name, stateBadge(d.state), unreadable(d),
          ...(admin() ? [html`<button class="small danger" data-act="cfail" data-cache="${c.name}" data-device="${j}" data-name="${d.name}">Fail…</button>
<button class="small secondary" data-act="creplace" data-cache="${c.name}" data-device="${j}" data-name="${d.name}">Replace…</button>`] : [])])));
      });
    };
    const stop = poll(tick, 2000, (e) => notice(`Cache: ${e.message}`, 'error'));
    return () => { stop(); for (const c of charts.values()) c.forEach((x) => x.destroy()); };
  },
};

// ---------------------------------------------------------------- HA
export const ha = {
  title: 'HA',
  mount(el) {
    el.innerHTML = html`<h1>High availability</h1>
<section aria-labelledby="ha-n-h"><h2 id="ha-n-h">Nodes and links</h2><div id="ha-nodes"></div></section>
<section aria-labelledby="ha-r-h"><h2 id="ha-r-h">Replicated LUNs</h2><div id="ha-reps"></div></section>
<section aria-labelledby="ha-f-h"><h2 id="ha-f-h">Failover history</h2><div id="ha-hist"></div></section>`.s;
    return poll(async () => {
      const [reps, events] = await Promise.all([api('/replicas'), newestEvents(300)]);
      const links = [];
      for (const r of reps) {
        for (const [kind, list] of [['sync', r.sync_links], ['heartbeat (client network)', r.client_links]]) {
          for (const l of list || []) links.push([html`<span class="mono">${r.name}</span>`, kind, `${l.local} → ${l.peer}`, stateBadge(l.up ? 'up' : 'down'), l.rtt_us == null ? '–' : l.up ? `${num(l.rtt_us)} µs` : `last ${num(l.rtt_us)} µs`]);
        }
      }
      const r0 = reps[0];
      set(el, '#ha-nodes', r0 ? html`
<p>This node: <b>node ${r0.node_id}</b> (preferred: node ${r0.preferred_node}, mode ${r0.mode}) · partner: <b>${r0.peer ?? 'not connected'}</b>
 · witness: ${r0.witness ? html`${r0.witness} ${stateBadge(r0.witness_reachable == null ? 'not asked yet' : r0.witness_reachable ? 'reachable' : 'unreachable')}` : 'none'}</p>
${table(['Volume', 'Link', 'Addresses', 'State', 'RTT'], links, 'No link heartbeats reported.')}` : html`<p class="empty">This node is not part of an HA pair.</p>`);
      set(el, '#ha-reps', table(['Volume', 'Role', 'State', 'This copy', 'Paths here / partner', 'Resync', 'Why'], reps.map((r) => {
        const frac = r.state === 'resyncing' && r.resync_regions_total ? r.resync_regions_done / r.resync_regions_total : null;
        // a copy changed in part since it was consistent may lack acknowledged data: never kept
        const copy = r.consistent ? html`<span class="copy">${stateBadge('consistent')}</span>`
          : r.partial ? html`<span class="copy" title="changed by a resync, or failed under a write, since it was last consistent: it cannot be kept">${stateBadge('partial')} <span class="small">cannot be kept</span></span>`
            : html`<span class="copy">${stateBadge('not consistent')}</span>`;
        return [html`<span class="mono">${r.name}</span>`, html`<span class="role" data-volume="${r.name}">${stateBadge(r.role)}</span>`, stateBadge(r.state), copy,
          html`${stateBadge(r.local_paths)} / ${stateBadge(r.peer_paths)}`,
          frac != null ? progressBar('resync', frac, `${r.resync_regions_done} of ${r.resync_regions_total} regions`) : (r.dirty_regions ? `${bytes(r.dirty_regions * r.region_bytes)} to copy` : '–'),
          r.reason];
      }), 'No replicated LUNs.'));
      const fo = events.filter((e) => /^(partner_lost|partner_returned|role_changed|resync_done|split_brain_refused)$/.test(e.kind)).slice(0, 30);
      set(el, '#ha-hist', table(['Time', 'Severity', 'Object', 'What'], fo.map((e) => [when(e.time), stateBadge(e.severity), e.object, e.message]), 'No failovers recorded.'));
    }, 2000, (e) => notice(`HA: ${e.message}`, 'error'));
  },
};

// ---------------------------------------------------------------- Performance
export const performance = {
  title: 'Performance',
  mount(el) {
    el.innerHTML = html`<h1>Performance monitor</h1>
<form class="form inline" id="pf-sel">
<label for="pf-obj">Show</label><select id="pf-obj"><option value="node">the whole node</option></select>
<label for="pf-win">Window</label><select id="pf-win"><option value="60">1 minute</option><option value="300" selected>5 minutes</option><option value="900">15 minutes</option><option value="3600">1 hour</option></select>
</form>
<p class="muted" id="pf-note"></p><div class="figures" id="pf-figs"></div>
<div class="chart" id="pf-iops"></div><div class="chart" id="pf-mbs"></div><div class="chart" id="pf-lat"></div>
${admin() ? html`<section aria-labelledby="pf-b-h" class="bench"><h2 id="pf-b-h">Benchmark</h2>
<p class="warning" role="note"><strong>Load on production:</strong> the benchmark runs inside this node against a real LUN, competing with every client's I/O. Writing patterns overwrite the LUN's data.</p>
<form id="pf-bench" class="form inline">
<label for="pf-b-lun">LUN</label><select id="pf-b-lun"></select>
<label for="pf-b-pat">Pattern</label><select id="pf-b-pat"></select>
<label for="pf-b-secs">Seconds</label><input id="pf-b-secs" type="number" min="1" max="60" value="10" class="narrow">
<button type="submit" class="danger">Run benchmark</button></form></section>` : ''}
<section aria-labelledby="pf-j-h"><h2 id="pf-j-h">Benchmark jobs</h2><div id="pf-jobs"></div></section>`.s;
    const iops = new LiveChart(el.querySelector('#pf-iops'), 'perf-iops', [{ label: 'read IOPS' }, { label: 'write IOPS' }], { yLabel: 'IOPS' });
    const mbs = new LiveChart(el.querySelector('#pf-mbs'), 'perf-mbs', [{ label: 'read MB/s' }, { label: 'write MB/s' }], { yLabel: 'MB/s' });
    const lat = new LiveChart(el.querySelector('#pf-lat'), 'perf-latency', [{ label: 'latency µs' }], { yLabel: 'µs' });
    const obj = el.querySelector('#pf-obj'), win = el.querySelector('#pf-win');
    const bench = el.querySelector('#pf-bench');
    let objs = '', lunsKey = '', patsKey = '';
    el.querySelector('#pf-sel').addEventListener('submit', (e) => e.preventDefault());
    if (bench) {
      bench.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        const [target, lun] = JSON.parse(bench.querySelector('#pf-b-lun').value || '[]');
        const body = { target, lun, pattern: bench.querySelector('#pf-b-pat').value, secs: Number(bench.querySelector('#pf-b-secs').value) };
        if (await act(`Benchmark of ${target}/${lun}`, '/bench', body)) {
          obj.value = `lun:${target}/${lun}`;
          tick();
        }
      });
    }
    const tick = async () => {
      const [hist0, jobs, luns, status] = await Promise.all([optional(`/history?window=${win.value}`), optional('/bench'), api('/luns'), api('/status')]);
      const hist = hist0 || { node: sampleNode(status).filter((p) => p.t > Date.now() - win.value * 1000) };
      el.querySelector('#pf-note').textContent = hist0 ? '' : 'This node keeps no I/O history: only the whole node is shown, sampled by this page while it is open.';
      {
        const names = [...Object.keys(hist.luns || {}).map((k) => `lun:${k}`), ...Object.keys(hist.paths || {}).map((k) => `path:${k}`), ...Object.keys(hist.portals || {}).map((k) => `portal:${k}`)];
        if (names.join() !== objs) {
          objs = names.join();
          const cur = obj.value;
          obj.innerHTML = html`<option value="node">the whole node</option>${names.map((n) => html`<option value="${n}">${n.replace(':', ' ')}</option>`)}`.s;
          if ([...obj.options].some((o) => o.value === cur)) obj.value = cur;
        }
        const [kind, ...rest] = obj.value.split(':');
        const key = rest.join(':');
        const s = kind === 'node' ? hist.node : (hist[`${kind}s`] || {})[key] || [];
        const last = s[s.length - 1] || {};
        set(el, '#pf-figs', html`<span class="fig">${obj.value === 'node' ? 'node' : key}</span>
<span class="fig">read <b id="pf-riops">${num(last.read_iops)}</b> IOPS</span><span class="fig">write <b id="pf-wiops">${num(last.write_iops)}</b> IOPS</span>
<span class="fig"><b>${num(last.read_mbs, 1)}</b> / <b>${num(last.write_mbs, 1)}</b> MB/s</span><span class="fig"><b>${num(last.latency_us)}</b> µs</span>`);
        let [x, ys] = columns(s, ['read_iops', 'write_iops']); iops.set(x, ys);
        [x, ys] = columns(s, ['read_mbs', 'write_mbs']); mbs.set(x, ys);
        [x, ys] = columns(s, ['latency_us']); lat.set(x, ys);
      }
      if (bench) {
        bench.hidden = !jobs;
        const lk = luns.map((l) => `${l.target}/${l.id ?? l.lun}`).join();
        if (lk !== lunsKey) {
          lunsKey = lk;
          bench.querySelector('#pf-b-lun').innerHTML = luns.map((l) => html`<option value="${JSON.stringify([l.target, l.id ?? l.lun])}">${l.target}/${l.id ?? l.lun}</option>`.s).join('');
        }
        const pats = jobs?.patterns || [];
        if (pats.join() !== patsKey) {
          patsKey = pats.join();
          bench.querySelector('#pf-b-pat').innerHTML = pats.map((p) => html`<option>${typeof p === 'string' ? p : p.name}</option>`.s).join('');
        }
        bench.querySelector('button').disabled = !jobs;
      }
      set(el, '#pf-jobs', jobs ? table(['#', 'LUN', 'Pattern', 'Secs', 'State', 'IOPS', 'MB/s', 'Mean µs', 'p99 µs'], (jobs.jobs || []).slice().reverse().map((j) => [
        j.id, `${j.target}/${j.lun}`, j.pattern, j.secs, html`<span class="job-state">${stateBadge(j.state)}</span>${j.error ? ` ${j.error}` : ''}`,
        num(j.result?.iops), num(j.result?.mbs, 1), num(j.result?.latency_us_mean), num(j.result?.latency_us_p99)]), 'No benchmark run yet.') : NA('The benchmark runner'));
    };
    obj.addEventListener('change', () => tick().catch(() => {}));
    win.addEventListener('change', () => tick().catch(() => {}));
    const stop = poll(tick, 1000, (e) => notice(`Performance: ${e.message}`, 'error'));
    return () => { stop(); iops.destroy(); mbs.destroy(); lat.destroy(); };
  },
};

// ---------------------------------------------------------------- Events
export const events = {
  title: 'Events',
  mount(el) {
    el.innerHTML = html`<h1>Events</h1>
<form class="form inline" id="ev-f">
<label for="ev-sev">Severity</label><select id="ev-sev"><option value="">any</option><option>info</option><option>warning</option><option>critical</option></select>
<label for="ev-kind">Kind</label><select id="ev-kind"><option value="">any</option></select>
<label for="ev-q">Contains</label><input id="ev-q" type="search" placeholder="object or text">
</form><p id="ev-count" class="muted" aria-live="polite"></p><div id="ev-list"></div>`.s;
    const f = el.querySelector('#ev-f');
    f.addEventListener('submit', (e) => e.preventDefault());
    let all = [], kinds = '';
    const draw = () => {
      const sev = f.querySelector('#ev-sev').value, kind = f.querySelector('#ev-kind').value, q = f.querySelector('#ev-q').value.toLowerCase();
      const shown = all.filter((e) => (!sev || e.severity === sev) && (!kind || e.kind === kind) && (!q || `${e.object} ${e.message}`.toLowerCase().includes(q)));
      el.querySelector('#ev-count').textContent = `${shown.length} of ${all.length} events`;
      set(el, '#ev-list', table(['#', 'Time', 'Severity', 'Kind', 'Object', 'Message'], shown.slice(0, 500).map((e) => [e.seq, when(e.time), stateBadge(e.severity), e.kind, html`<span class="mono">${e.object}</span>`, e.message]), 'No events match.'));
    };
    f.addEventListener('input', draw);
    return poll(async () => {
      all = await newestEvents(1000);
      const k = [...new Set(all.map((e) => e.kind))].sort();
      if (k.join() !== kinds) {
        kinds = k.join();
        const sel = f.querySelector('#ev-kind'), cur = sel.value;
        sel.innerHTML = html`<option value="">any</option>${k.map((x) => html`<option>${x}</option>`)}`.s;
        sel.value = cur;
      }
      draw();
    }, 3000, (e) => notice(`Events: ${e.message}`, 'error'));
  },
};
