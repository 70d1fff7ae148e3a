// Bundles the console: src/app.js (and the CSS it imports) into dist/ with
// content-hashed names, minified; writes dist/index.html pointing at them and a
// gzip copy of every file (the server sends it to clients that accept gzip).
import * as esbuild from 'esbuild';
import { readFileSync, writeFileSync, rmSync, mkdirSync, readdirSync } from 'node:fs';
import { gzipSync, constants } from 'node:zlib';
import { join, basename } from 'node:path';

const here = new URL('.', import.meta.url).pathname;
const dist = join(here, 'dist');
rmSync(dist, { recursive: true, force: true });
mkdirSync(dist, { recursive: true });

const r = await esbuild.build({
  entryPoints: [join(here, 'src/app.js')],
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['es2020'],
  outdir: dist,
  entryNames: '[name]-[hash]',
  metafile: true,
  legalComments: 'none',
  logLevel: 'warning',
});
const outs = Object.keys(r.metafile.outputs).map((p) => basename(p));
const js = outs.find((f) => f.endsWith('.js'));
const css = outs.find((f) => f.endsWith('.css'));
const html = readFileSync(join(here, 'src/index.html'), 'utf8')
  .replace('%CSS%', css)
  .replace('%JS%', js);
writeFileSync(join(dist, 'index.html'), html);
writeFileSync(join(dist, 'favicon.svg'), readFileSync(join(here, 'src/favicon.svg')));

let raw = 0, gz = 0;
for (const f of readdirSync(dist)) {
  const body = readFileSync(join(dist, f));
  const z = gzipSync(body, { level: constants.Z_BEST_COMPRESSION });
  writeFileSync(join(dist, f + '.gz'), z);
  raw += body.length; gz += z.length;
}
console.log(`console: ${outs.join(', ')}, index.html; ${raw} bytes, ${gz} gzipped`);
