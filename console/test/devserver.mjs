// Development only: serves console/dist from disk and forwards /api/ to a
// node's console listener, so pages can be tried without rebuilding freesan.
//   node console/test/devserver.mjs 127.0.0.1:NODE_CONSOLE_PORT [PORT]
import http from 'node:http';
import { readFileSync, existsSync } from 'node:fs';
import { join, extname } from 'node:path';

const [upstream, port = '8300'] = process.argv.slice(2);
const dist = new URL('../dist/', import.meta.url).pathname;
const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml' };
const [uh, up] = upstream.split(':');
http.createServer((req, res) => {
  if (req.url.startsWith('/api/')) {
    const headers = { ...req.headers, host: upstream };
    delete headers.origin;
    const p = http.request({ host: uh, port: up, path: req.url, method: req.method, headers }, (r) => { res.writeHead(r.statusCode, r.headers); r.pipe(res); });
    req.pipe(p);
    return;
  }
  const f = join(dist, req.url === '/' ? 'index.html' : req.url.slice(1).split('?')[0]);
  if (!f.startsWith(dist) || !existsSync(f)) { res.writeHead(404); res.end(); return; }
  res.writeHead(200, { 'Content-Type': types[extname(f)] || 'application/octet-stream', 'Content-Security-Policy': "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:" });
  res.end(readFileSync(f));
}).listen(Number(port), '127.0.0.1');
