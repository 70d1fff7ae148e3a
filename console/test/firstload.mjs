// First load of the web console in Debian's Chromium, cold cache: prints the
// time until the sign-in form is there and the bytes that crossed the wire
// (bench/console-load runs it over a shaped link). A figure, not a test.
import { chromium } from 'playwright-core';

const url = process.argv[2];
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
const ctx = await browser.newContext();
const page = await ctx.newPage();
const cdp = await ctx.newCDPSession(page);
await cdp.send('Network.enable');
await cdp.send('Network.setCacheDisabled', { cacheDisabled: true });
let bytes = 0;
let requests = 0;
cdp.on('Network.loadingFinished', (e) => { bytes += e.encodedDataLength; requests += 1; });
const t0 = performance.now();
await page.goto(url);
await page.waitForSelector('#token');
const ms = performance.now() - t0;
console.log(JSON.stringify({ first_load_ms: Math.round(ms), bytes_on_wire: bytes, requests }));
await browser.close();
