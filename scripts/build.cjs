#!/usr/bin/env node
// Builds the published package into dist/ (ADR 0016): tsc (incremental, so an unchanged tree
// costs seconds), the non-TypeScript files the code reads beside itself, and the workflow bundle
// that workers load instead of bundling on every start. `npm run build`; scripts/setup.sh runs it;
// `npm pack`/`publish` run it with --clean (prepack).
'use strict';
const { spawnSync } = require('node:child_process');
const { createHash } = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');
const dist = path.join(root, 'dist');
const quiet = process.argv.includes('--quiet');
const say = (line) => quiet || process.stderr.write(`build: ${line}\n`);

// --clean (prepack): start from nothing, so no output of a deleted source file is published.
if (process.argv.includes('--clean')) fs.rmSync(dist, { recursive: true, force: true });

const tsc = spawnSync(process.execPath, [require.resolve('typescript/bin/tsc'), '-p', path.join(root, 'tsconfig.build.json')], { stdio: 'inherit' });
if (tsc.status !== 0) process.exit(tsc.status ?? 1);

// Files read at run time relative to the module that reads them.
const ASSETS = [
  ['blueprints', (f) => f.endsWith('.yaml') || f.endsWith('.json')],
  [path.join('activities', 'billing', 'migrations'), (f) => f.endsWith('.sql')],
];
for (const [dir, keep] of ASSETS) {
  fs.mkdirSync(path.join(dist, dir), { recursive: true });
  for (const f of fs.readdirSync(path.join(root, dir)).filter(keep)) fs.copyFileSync(path.join(root, dir, f), path.join(dist, dir, f));
}

// The bundle is rebuilt only when the compiled code changed: its key hashes every emitted .js file.
function jsFiles(dir) {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return jsFiles(p);
    return e.name.endsWith('.js') && p !== bundleFile ? [p] : [];
  });
}
const bundleFile = path.join(dist, 'workflow-bundle.js');
const keyFile = `${bundleFile}.key`;
const hash = createHash('sha256');
hash.update(require('@temporalio/worker/package.json').version);
for (const f of jsFiles(dist).sort()) hash.update(f).update(fs.readFileSync(f));
const key = hash.digest('hex');
const current = fs.existsSync(bundleFile) && fs.existsSync(keyFile) && fs.readFileSync(keyFile, 'utf8') === key;
if (current) {
  say('workflow bundle up to date');
} else {
  const { bundleWorkflows } = require(path.join(dist, 'workers', 'worker.js'));
  bundleWorkflows().then(
    (bundle) => {
      fs.writeFileSync(bundleFile, bundle.code);
      fs.writeFileSync(keyFile, key);
      say(`wrote ${path.relative(root, bundleFile)}`);
    },
    (e) => {
      process.stderr.write(`build: bundling the workflows failed: ${e.stack ?? e}\n`);
      process.exit(1);
    },
  );
}
