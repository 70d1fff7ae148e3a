// Drives the console in Debian's Chromium (playwright-core, DevTools protocol)
// against a running freesan node; crates/freesan/tests/console.rs starts the
// node and runs this. Input: the environment variable FREESAN_CONSOLE_TEST, a
// JSON object {url, token, ro_token, shots, target, scenario, [urls]} (the
// scenarios `ha` and `page` take more, see them). Prints
// what it sees and `RESULT {...}` as its last line; exits 1 on the first
// failed expectation (its message says what was expected and what was seen).
import { chromium } from 'playwright-core';
import { readFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';

const cfg = JSON.parse(process.env.FREESAN_CONSOLE_TEST || '{}');
const require = createRequire(import.meta.url);
const AXE = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const PAGES = ['overview', 'storage', 'san', 'cache', 'ha', 'performance', 'events'];
const result = { pages: {}, axe: {}, checks: [] };
const log = (...a) => console.log(...a);
const check = (ok, what, seen = '') => {
  if (!ok) throw new Error(`expected ${what}${seen !== '' ? `; saw ${typeof seen === 'string' ? seen : JSON.stringify(seen)}` : ''}`);
  result.checks.push(what);
  log(`ok: ${what}`);
};

// Polls `f` (in node) until it returns a truthy value, at most `secs`.
async function until(what, secs, f) {
  const end = Date.now() + secs * 1000;
  let last;
  for (;;) {
    try { last = await f(); } catch (e) { last = `error: ${e.message}`; }
    if (last && !(typeof last === 'string' && last.startsWith('error:'))) return last;
    if (Date.now() > end) throw new Error(`timed out after ${secs} s waiting for ${what} (last: ${JSON.stringify(last)})`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function launch() {
  return chromium.launch({
    executablePath: cfg.chromium || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
}

async function newPage(browser, problems) {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    const t = m.text();
    if (m.type() === 'error' && /Content Security Policy|Refused to/i.test(t)) problems.push(`CSP: ${t}`);
    if (t.startsWith('freesan:')) log(`  (console) ${t}`);
  });
  return page;
}

async function signIn(page, url, token, shots) {
  await page.goto(url);
  await page.waitForSelector('#token');
  if (shots) await page.screenshot({ path: `${shots}/login.png` });
  await page.fill('#token', token);
  await page.click('button[type=submit]');
  await page.waitForSelector('#who-role');
  return (await page.textContent('#who-role')).trim();
}

async function go(page, name) {
  await page.evaluate((n) => { location.hash = `#/${n}`; }, name);
  await page.waitForSelector(`main[data-page=${name}]`);
}

// axe-core in the page (evaluated through DevTools, so the page's CSP needs no
// exception); serious and critical violations fail.
async function axe(page, name) {
  await page.evaluate(AXE);
  const r = await page.evaluate(async () => {
    const out = await window.axe.run(document, { resultTypes: ['violations'] });
    return out.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' ')) }));
  });
  result.axe[name] = r.map((v) => `${v.impact}:${v.id}`);
  const bad = r.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  check(bad.length === 0, `no serious or critical accessibility violation on ${name}`, bad);
}

// Every visible control in the page is reached by Tab (bounded walk).
async function keyboard(page, name) {
  const ids = await page.evaluate(() => {
    let n = 0;
    for (const e of document.querySelectorAll('a[href], button, input, select, textarea')) {
      const r = e.getBoundingClientRect();
      if (r.width && r.height && !e.disabled) e.dataset.kb = String(n++);
    }
    return n;
  });
  const seen = new Set();
  await page.evaluate(() => document.activeElement?.blur());
  for (let i = 0; i < ids * 2 + 10 && seen.size < ids; i++) {
    await page.keyboard.press('Tab');
    const k = await page.evaluate(() => document.activeElement?.dataset?.kb ?? null);
    if (k != null) seen.add(k);
  }
  check(seen.size === ids, `every one of the ${ids} controls of ${name} is reachable with Tab`, `${seen.size} reached`);
}

async function shot(page, shots, name) {
  if (!shots) return;
  mkdirSync(shots, { recursive: true });
  // the Tab walk leaves a focus ring on the last control: not part of the page
  await page.evaluate(() => document.activeElement?.blur?.());
  await page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });
}

const chart = (page, id) => page.evaluate((i) => window.freesanCharts?.[i] ?? null, id);
const maxOf = (a) => Math.max(0, ...(a || []).filter((v) => v != null));

async function main() {
  const browser = await launch();
  const problems = [];
  const page = await newPage(browser, problems);
  const { url, token, shots } = cfg;
  check((await signIn(page, url, token, shots)) === 'admin', 'the admin token signs in as admin');

  // Storage: a pool from free disks, a spare
  await go(page, 'storage');
  await until('the free disks d0, d1 and d2', 20, () => page.evaluate(() => ['d0', 'd1', 'd2'].every((d) => document.querySelector(`#st-free input[value=${d}]`))));
  await page.fill('#st-new-name', 'web');
  await page.selectOption('#st-new-level', 'raid1');
  await page.check('#st-free input[value=d0]');
  await page.check('#st-free input[value=d1]');
  await page.click('#st-new button[type=submit]');
  await until('pool web on the Storage page', 30, () => page.$('article[data-pool=web]'));
  check(true, 'a raid1 pool "web" was created from free disks d0 and d1');
  await until('d2 offered as a free disk for web', 20, () => page.$('#st-rep-web option:text-is("d2")'));
  await page.selectOption('#st-rep-web', 'd2');
  await page.click('button[data-act=spare][data-pool=web]');
  await until('d2 as spare of web', 20, () => page.evaluate(() => /Spares: d2/.test(document.querySelector('article[data-pool=web]')?.textContent || '')));
  check(true, 'd2 was added to web as a spare');

  // SAN: a LUN on the pool
  await go(page, 'san');
  await until('the LUN form filled with targets and pools', 20, () => page.evaluate(() => document.querySelector('#sn-new-pool option[value=web], #sn-new-pool option:not([value])') && [...document.querySelectorAll('#sn-new-pool option')].some((o) => o.textContent === 'web')));
  await page.selectOption('#sn-new-target', cfg.target);
  await page.fill('#sn-new-id', '1');
  await page.selectOption('#sn-new-pool', 'web');
  await page.click('#sn-new button[type=submit]');
  await until('LUN 1 listed', 30, () => page.$(`button[data-act=del][data-lun="1"]`));
  check(true, 'LUN 1 was created on pool web');
  await shot(page, shots, 'san');

  // Performance: a short benchmark against LUN 1 raises its IOPS on the chart
  await go(page, 'performance');
  const benchAvailable = await until('the benchmark form', 20, () => page.evaluate(() => {
    const b = document.querySelector('#pf-bench button'); const j = document.querySelector('#pf-jobs');
    if (j && /not available/.test(j.textContent)) return 'absent';
    return b && !b.disabled && document.querySelector('#pf-b-pat option') ? 'present' : null;
  }));
  if (benchAvailable === 'present') {
    const lunKey = `${cfg.target}/1`;
    await page.selectOption('#pf-b-lun', JSON.stringify([cfg.target, 1]));
    const pats = await page.$$eval('#pf-b-pat option', (o) => o.map((x) => x.value));
    const pat = pats.find((p) => /rand.*read|read/i.test(p)) || pats[0];
    await page.selectOption('#pf-b-pat', pat);
    await page.fill('#pf-b-secs', '8');
    await page.click('#pf-bench button[type=submit]');
    await until(`LUN ${lunKey} selectable on the chart`, 20, () => page.$(`#pf-obj option[value="lun:${lunKey}"]`));
    await page.selectOption('#pf-obj', `lun:${lunKey}`);
    const peak = await until(`IOPS of ${lunKey} above 0 on the chart`, 40, async () => {
      const c = await chart(page, 'perf-iops');
      const m = Math.max(maxOf(c?.series['read IOPS']), maxOf(c?.series['write IOPS']));
      return m > 0 ? m : null;
    });
    result.bench_peak_iops = peak;
    check(peak > 0, `the chart of LUN ${lunKey} shows its IOPS rise during the benchmark (peak ${Math.round(peak)})`);
    await until('the benchmark job done', 60, () => page.evaluate(() => /done|failed/.test(document.querySelector('#pf-jobs .job-state')?.textContent || '')));
    const st = await page.textContent('#pf-jobs .job-state');
    check(/done/.test(st), 'the benchmark job finished', st);
  } else {
    result.missing = (result.missing || []).concat('bench: the node has no POST /api/v1/bench');
    log('MISSING: the node has no benchmark runner (GET /api/v1/bench: 404); the IOPS check is not done');
  }
  await shot(page, shots, 'performance');

  // Storage: fail a member (typing its name), the alert, the rebuild to done
  await go(page, 'storage');
  const poolState = () => page.evaluate(() => {
    const a = document.querySelector('article[data-pool=web]');
    if (!a) return null;
    const members = [...a.querySelectorAll('tbody tr')].map((r) => [r.cells[1].textContent, r.cells[2].textContent]);
    return { state: a.querySelector('h3 .badge')?.textContent, members, bar: a.querySelector('.activity progress')?.value ?? null, activity: a.querySelector('.activity').textContent };
  });
  await until('pool web optimal (its initial resync done)', 120, async () => ((await poolState())?.state === 'optimal' ? true : null));
  // a slow rebuild, so that its progress is seen moving
  await page.fill('#st-rate-web', '8');
  await page.click('button[data-act=rate][data-pool=web]');
  await until('the rebuild rate shown as 8 MB/s', 20, () => page.evaluate(() => /rebuild rate 8 MB\/s/.test(document.querySelector('article[data-pool=web]')?.textContent || '')));
  check(true, 'the rebuild rate of web was set to 8 MB/s');
  await page.click('button[data-act=fail][data-name=d0]');
  await page.waitForSelector('dialog.confirm[open]');
  const okBtn = 'dialog.confirm button[value=ok]';
  check(await page.isDisabled(okBtn), 'the fail button stays disabled until the name is typed');
  await page.fill('#confirm-name', 'd');
  check(await page.isDisabled(okBtn), 'a partial name does not enable it');
  await page.fill('#confirm-name', 'd0');
  await page.click(okBtn);
  const seen = { bars: new Set(), states: [] };
  const done = await until('pool web optimal again with d2 rebuilt in place of d0', 120, async () => {
    const s = await poolState();
    if (!s) return null;
    if (s.bar != null) seen.bars.add(Math.round(Number(s.bar)));
    if (seen.states[seen.states.length - 1] !== s.state) seen.states.push(s.state);
    if (s.bar != null && !result.rebuild_shot) { result.rebuild_shot = true; await shot(page, shots, 'storage-rebuilding'); }
    const names = s.members.map((m) => m[0]);
    return s.state === 'optimal' && names.includes('d2') && !names.includes('d0') ? s : null;
  });
  result.rebuild_progress_seen = [...seen.bars];
  result.pool_states = seen.states;
  check(seen.states.some((x) => x !== 'optimal'), `the pool's state went ${seen.states.join(' → ')}`);
  check(seen.bars.size >= 2, `the rebuild progress bar moved (${[...seen.bars].join('%, ')}%) to done`, [...seen.bars]);
  check(done.members.every((m) => m[1] === 'active'), 'every member active after the rebuild', done.members);
  await shot(page, shots, 'storage');
  await go(page, 'overview');
  await until('an alert naming the failed member', 20, () => page.evaluate(() => /d0|web/.test(document.querySelector('#ov-alerts')?.textContent || '') && document.querySelector('#ov-alerts .alert')));
  check(true, 'the Overview shows an alert about the failed member');
  await go(page, 'events');
  await until('a rebuild event', 20, () => page.evaluate(() => /rebuil/i.test(document.querySelector('#ev-list')?.textContent || '')));
  await page.fill('#ev-q', 'web');
  const filtered = await page.evaluate(() => [...document.querySelectorAll('#ev-list tbody tr')].map((r) => r.textContent));
  check(filtered.length > 0 && filtered.every((t) => /web/.test(t)), 'the Events filter keeps only matching events', filtered.length);
  await page.fill('#ev-q', '');

  // SSD cache: hit rate and the advisor's curve
  await go(page, 'cache');
  const hit = await until('a read hit rate', 30, () => page.evaluate(() => { const t = document.querySelector('.read-hit')?.textContent; return t && t !== '–' ? t : null; }));
  check(true, `the cache page shows the read hit rate (${hit})`);
  const mrc = await until('the advisor curve', 60, async () => {
    const c = await page.evaluate(() => Object.entries(window.freesanCharts).find(([k]) => k.startsWith('cache-mrc-'))?.[1] ?? null);
    return c && c.x.length > 1 ? c : null;
  });
  check(mrc.x.length > 1, `the advisor's miss-ratio curve is drawn (${mrc.x.length} sizes)`);
  result.advisor_points = mrc.x.length;
  result.recommended = await page.evaluate(() => document.querySelector('.recommended')?.textContent ?? null);

  // every page: screenshot, axe, keyboard
  for (const p of PAGES) {
    await go(page, p);
    await page.waitForTimeout(1500); // let one poll fill the page before the picture (not an assertion)
    await shot(page, shots, p);
    await axe(page, p);
    await keyboard(page, p);
  }
  await rareStates(page, shots);

  // the confirm dialog too
  await go(page, 'san');
  await page.click('button[data-act=del][data-lun="1"]');
  await page.waitForSelector('dialog.confirm[open]');
  await shot(page, shots, 'confirm-dialog');
  await axe(page, 'confirm-dialog');
  await page.click('dialog.confirm button[value=cancel]');
  check(problems.length === 0, 'no page error and no CSP violation', problems);

  // a read-only session: no action buttons; the API refuses its changes
  const ro = await newPage(browser, problems);
  check((await signIn(ro, url, cfg.ro_token)) === 'read-only', 'the read-only token signs in as read-only');
  for (const p of PAGES) {
    await go(ro, p);
    await ro.waitForTimeout(1000); // one poll (not an assertion)
    const buttons = await ro.$$eval('main button, main form', (b) => b.filter((x) => !x.closest('#pf-sel, #ev-f')).map((x) => x.textContent.trim() || x.id));
    check(buttons.length === 0, `the read-only session sees no action on ${p}`, buttons);
  }
  await go(ro, 'storage');
  await ro.waitForSelector('article[data-pool=web]');
  await shot(ro, shots, 'read-only-storage');
  const code = await ro.evaluate(async (t) => (await fetch('/api/v1/pools', { method: 'POST', headers: { Authorization: `Bearer ${t}`, 'Content-Type': 'application/json' }, body: '{"name":"x","level":"raid1","members":["d1","d2"]}' })).status, cfg.ro_token);
  check(code === 403, 'a POST with the read-only token is refused with 403', code);

  await slowLink(browser);
  await browser.close();
}

// States a node reaches only after rare faults, drawn from the node's own
// answers with fields changed by request interception (a rendering check: the
// states themselves are tested where they arise, crates/raid's
// a_sector_a_rebuild_cannot_recover... and a_rebuild_that_would_lose_more...,
// and crates/replica's partial copies): a rebuild held at a stripe, blocks a
// rebuild gave up, and HA copies consistent, not consistent, and changed in
// part since they were consistent.
async function rareStates(page, shots) {
  const stall = { stripe: 1234, error: 'unreadable sectors at position(s) [1], member block 5678 (disk d1)', attempts: 9 };
  await page.route('**/api/v1/pools', async (route) => {
    const response = await route.fetch();
    const pools = await response.json();
    for (const p of pools) {
      if (p.name === 'web') Object.assign(p, { rebuild_stalled: stall, lost_blocks: 3, lost_ranges: [[4096, 2], [9000, 1]] });
    }
    await route.fulfill({ response, json: pools });
  });
  await go(page, 'storage');
  const text = await until('the stalled rebuild of web', 20, () => page.evaluate(() => document.querySelector('article[data-pool=web] .stalled')?.textContent ?? null));
  check(/stripe 1234/.test(text) && /9 attempts/.test(text) && /disk d1/.test(text), 'the Storage page says where a rebuild is stalled, how often it was tried and why', text);
  const lost = await page.evaluate(() => document.querySelector('article[data-pool=web] .lost')?.textContent ?? null);
  check(/3 blocks lost/.test(lost ?? '') && /4096–4097, 9000/.test(lost ?? ''), 'the Storage page says how many blocks a rebuild gave up and where', lost);
  await shot(page, shots, 'storage-rebuild-stalled');
  await axe(page, 'storage with a stalled rebuild');
  await go(page, 'overview');
  const card = await until('the pools card naming the lost blocks', 20, () => page.evaluate(() => {
    const t = document.querySelector('#ov-cards')?.textContent || '';
    return /blocks lost/.test(t) ? t : null;
  }));
  check(/web [a-z]+, 3 blocks lost/.test(card), 'the Overview counts a pool with lost blocks as needing attention', card);
  await shot(page, shots, 'overview-lost-blocks');
  await page.unroute('**/api/v1/pools');

  const copy = (name, consistent, partial) => ({
    name, node_id: 2, preferred_node: 1, mode: 'active-active', role: 'down', state: 'down', peer: null,
    reason: consistent ? 'partner unreachable and this is not the preferred node (no witness)' : 'neither copy is consistent (both were interrupted resync targets)',
    resync_regions_total: 0, resync_regions_done: 0, resynced_bytes: 0, dirty_regions: 0, region_bytes: 1 << 20, size_bytes: 1 << 30,
    generation: '0000000000000009/0000000000000009', consistent, partial, witness: null, witness_reachable: null,
    partner_copies_open: 0, local_paths: 'unavailable', peer_paths: 'unavailable', sync_links: [], client_links: [],
  });
  const copies = [copy('db', false, true), copy('mail', false, false), copy('www', true, false)];
  await page.route('**/api/v1/replicas', (route) => route.fulfill({ json: copies }));
  await go(page, 'ha');
  const shown = await until('three copies on the HA page', 20, () => page.evaluate(() => {
    const rows = [...document.querySelectorAll('#ha-reps tbody tr')].map((r) => [r.cells[0].textContent.trim(), r.querySelector('.copy')?.textContent.trim()]);
    return rows.length === 3 ? rows : null;
  }));
  check(JSON.stringify(shown) === JSON.stringify([['db', 'partial cannot be kept'], ['mail', 'not consistent'], ['www', 'consistent']]),
    'the HA page tells a copy changed in part (which cannot be kept) from one merely not consistent and one consistent', shown);
  await shot(page, shots, 'ha-copies');
  await axe(page, 'ha with copies not consistent');
  await page.unroute('**/api/v1/replicas');

  // a cache with dirty data no device can read (crates/cache's
  // the_destage_goes_around_dirty_data_no_copy_can_read), its devices having
  // met unreadable sectors
  await page.route('**/api/v1/caches', async (route) => {
    const response = await route.fetch();
    const caches = await response.json();
    for (const c of caches) {
      c.unreadable_dirty_bytes = 3 * 4096;
      c.dirty_bytes = Math.max(c.dirty_bytes ?? 0, 3 * 4096);
      (c.devices || []).forEach((d, i) => { d.media_errors = 7 + i; });
    }
    await route.fulfill({ response, json: caches });
  });
  await go(page, 'cache');
  const warned = await until('the unreadable dirty data warning', 20, () => page.evaluate(() => document.querySelector('.cache .unreadable')?.textContent ?? null));
  check(/12 KiB of dirty data no cache device can read/.test(warned) && /cannot be destaged/.test(warned),
    'the cache page says how much dirty data no cache device can read, and what it costs', warned);
  const met = await page.evaluate(() => [...document.querySelectorAll('.cache .devices tbody tr')].map((r) => r.cells[3].textContent.trim()));
  check(met.length > 0 && met.every((t, i) => t === String(7 + i)), 'the cache page counts the unreadable sectors each device met', met);
  await shot(page, shots, 'cache-unreadable');
  await axe(page, 'cache with unreadable dirty data');
  await page.unroute('**/api/v1/caches');
}

// First load over a 1 Mbit/s link, shaped by Chromium's network throttling
// (DevTools Network.emulateNetworkConditions; the cache is cold). A figure, not
// an assertion.
async function slowLink(browser) {
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  const cdp = await ctx.newCDPSession(page);
  await cdp.send('Network.enable');
  await cdp.send('Network.setCacheDisabled', { cacheDisabled: true });
  await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 40, downloadThroughput: 125000, uploadThroughput: 125000 });
  let bytes = 0;
  cdp.on('Network.loadingFinished', (e) => { bytes += e.encodedDataLength; });
  const t0 = Date.now();
  await page.goto(cfg.url);
  await page.waitForSelector('#token');
  result.first_load_ms_1mbit = Date.now() - t0;
  result.first_load_bytes = bytes;
  log(`first load over 1 Mbit/s (Chromium throttling, 40 ms latency): ${result.first_load_ms_1mbit} ms, ${bytes} bytes on the wire`);
  await ctx.close();
}

// HA: the HA page of each node in `urls` (signed in with `tokens`), until the
// roles it shows match `expect` (one regular expression per page), then a
// screenshot named after `names`. tests/ha.rs runs it in each node's network
// namespace after cutting the sync link: one node serving alone, the other
// standing down.
async function ha() {
  const browser = await launch();
  const problems = [];
  for (const [i, u] of cfg.urls.entries()) {
    const page = await newPage(browser, problems);
    await signIn(page, u, cfg.tokens[i]);
    await go(page, 'ha');
    const want = new RegExp(cfg.expect[i]);
    const seen = await until(`the HA page to show a role matching ${want}`, 60, async () => {
      const r = await page.evaluate(() => [...document.querySelectorAll('#ha-reps .role')].map((e) => e.textContent.trim()).join(','));
      return want.test(r) ? r : null;
    });
    check(true, `the HA page of ${u} shows ${seen}`);
    await shot(page, cfg.shots, cfg.names[i]);
  }
  check(problems.length === 0, 'no page error and no CSP violation', problems);
  await browser.close();
}

// Waits until the text of `selector` matches the regular expression `re`
// (60 s at most); returns the match.
async function shows(page, selector, re, where) {
  const want = new RegExp(re);
  const seen = await until(`${selector} on ${where} to match ${want}`, 60, async () => {
    const t = await page.evaluate((sel) => document.querySelector(sel)?.textContent ?? '', selector);
    return want.test(t) ? t.match(want)[0] || '(matched)' : null;
  });
  check(true, `${where} shows ${JSON.stringify(seen)}`);
  return seen;
}

// One page (`page`) until the text of `selector` in it matches `expect` (a
// regular expression), then a screenshot named `name`: a state another test
// brought about (tests/stops_answering.rs: a disk that stopped answering).
// With `click` (a button's selector), the button is then pressed, the
// notices must match `notice` and, with `after`, `selector` must match it;
// then a screenshot named `click_name`.
async function onePage() {
  const browser = await launch();
  const problems = [];
  const page = await newPage(browser, problems);
  await signIn(page, cfg.url, cfg.token);
  await go(page, cfg.page);
  await shows(page, cfg.selector, cfg.expect, cfg.page);
  await shot(page, cfg.shots, cfg.name);
  if (cfg.click) {
    await page.click(cfg.click);
    await shows(page, '#notices', cfg.notice, `the notices after ${cfg.click}`);
    if (cfg.after) await shows(page, cfg.selector, cfg.after, `${cfg.page} after ${cfg.click}`);
    await shot(page, cfg.shots, cfg.click_name);
  }
  check(problems.length === 0, 'no page error and no CSP violation', problems);
  await browser.close();
}

try {
  if (cfg.scenario === 'ha') await ha(); else if (cfg.scenario === 'page') await onePage(); else await main();
  log(`RESULT ${JSON.stringify(result)}`);
} catch (e) {
  log(`FAILED: ${e.message}`);
  log(`RESULT ${JSON.stringify(result)}`);
  process.exit(1);
}
