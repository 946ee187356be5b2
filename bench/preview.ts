/**
 * Preview proxy benchmark (ADR 0015), on this machine, end to end (real Temporal dev server,
 * real Postgres, bubblewrap, real HTTP on loopback): a GET of a small page served inside a
 * confined sandbox through its preview origin, side by side with a GET of the API's /healthz on
 * the same listener. The difference is the proxy's cost per request: authentication, admission,
 * and the connection through the relay in the sandbox's network namespace (one relay per namespace and port, reused).
 *
 * Usage: npx tsx bench/preview.ts [--quick] [--json]
 */
import http from 'node:http';
import { mkdtempSync, realpathSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import pino from 'pino';
import { openPostgres } from '../activities/billing/db';
import { createAccount, createApiToken, createProfile } from '../activities/billing/records';
import { SandboxApiClient } from '../api/client';
import { freePort, startDevServer } from '../workers/dev-server';
import { installRuntimeLogging } from '../workers/logging';
import { startSandboxServiceHost } from '../workers/sandbox-service';
import { bundleWorkflows } from '../workers/worker';
import { setup as startPostgres, teardown as stopPostgres } from '../test/postgres-setup';

const quick = process.argv.includes('--quick');
const asJson = process.argv.includes('--json');
const N = quick ? 30 : 200;
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const log = (line: string) => process.stderr.write(`${line}\n`);

function get(port: number, host: string, token: string): Promise<{ status: number; ms: number }> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: '/', headers: { host, authorization: `Bearer ${token}` } }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode!, ms: performance.now() - t0 }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function main() {
  installRuntimeLogging();
  const work = realpathSync(mkdtempSync(path.join(os.tmpdir(), 'slipway-bench-preview-')));
  log('starting Temporal dev server and Postgres ...');
  const temporal = await startDevServer({ dataDir: path.join(work, 'temporal'), port: await freePort(), headless: true, startTimeoutMs: 120_000 });
  let pgUrl = process.env.DATABASE_URL ?? '';
  let pgError = '';
  if (!pgUrl) {
    await startPostgres({ provide: (k: string, v: string) => (k === 'postgresUrl' ? (pgUrl = v) : (pgError = v)) });
    if (!pgUrl) throw new Error(pgError);
  }
  const dbName = `slipway_bench_${randomBytes(4).toString('hex')}`;
  const admin = openPostgres(pgUrl, { max: 1 });
  await admin.exec(`CREATE DATABASE ${dbName}`);
  await admin.close();
  const url = new URL(pgUrl);
  url.pathname = `/${dbName}`;
  const db = openPostgres(url.toString(), { max: 10 });
  const host = await startSandboxServiceHost({
    db,
    temporalAddress: temporal.address,
    taskQueue: 'bench-preview',
    workflowBundle: await bundleWorkflows(),
    api: { host: '127.0.0.1', port: 0 },
    logger: pino({ level: 'warn' }, pino.destination(2)),
    reaper: false,
    requestsPerSecond: 0,
    preview: { key: randomBytes(32), domain: 'localhost' },
  });
  const repo = path.join(work, 'repo');
  execFileSync('git', ['init', '-q', '-b', 'main', repo]);
  execFileSync('/bin/sh', ['-c', 'echo x > f && git add f && git -c user.name=b -c user.email=b@b commit -qm init'], { cwd: repo });
  await createAccount(db, { id: 'bench' });
  const { token } = await createApiToken(db, 'bench');
  await createProfile(db, 'bench', { name: 'confined', repository: repo, baseRef: 'main', idleTimeoutSeconds: 3_600 });
  const api = new SandboxApiClient(host.url!, token);
  const server = new AbortController();
  let results: Record<string, unknown> = {};
  try {
    let s = await api.create({ profile: 'confined' });
    while (s.status === 'pending') s = await api.get(s.id, 10);
    await api.writeFile(s.id, 'app.js', Buffer.from(`require('http').createServer((q, r) => r.end('<h1>hello</h1>')).listen(3000, '127.0.0.1')`));
    void fetch(new URL(`/api/v1/sandboxes/${s.id}/exec`, host.url), {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ command: 'node', args: ['app.js'], timeout_seconds: 3600 }),
      signal: server.signal,
    }).catch(() => undefined);
    const preview = await api.openPort(s.id, { port: 3000 });
    const apiPort = Number(new URL(host.url!).port);
    const previewHost = new URL(preview.url).host;
    for (let i = 0; (await get(apiPort, previewHost, token)).status !== 200; i++) {
      if (i > 600) throw new Error('the app in the sandbox never answered');
      await new Promise((r) => setTimeout(r, 100));
    }
    log(`${N} GETs each, alternating: preview page vs API /healthz ...`);
    const viaPreview: number[] = [];
    const viaApi: number[] = [];
    for (let i = 0; i < N; i++) {
      const p = await get(apiPort, previewHost, token);
      if (p.status !== 200) throw new Error(`preview answered ${p.status}`);
      viaPreview.push(p.ms);
      viaApi.push((await get(apiPort, new URL(host.url!).host, token).then((r) => r)).ms);
    }
    results = {
      machine: `${os.cpus().length} cores`,
      requests: N,
      previewMedianMs: median(viaPreview),
      apiHealthzMedianMs: median(viaApi),
      overheadMedianMs: median(viaPreview) - median(viaApi),
      ratio: median(viaPreview) / median(viaApi),
    };
  } finally {
    server.abort();
    await host.close();
    await db.close();
    await temporal.stop();
    if (!process.env.DATABASE_URL) await stopPostgres();
    rmSync(work, { recursive: true, force: true });
  }
  const r = results as { previewMedianMs: number; apiHealthzMedianMs: number; overheadMedianMs: number; ratio: number };
  if (asJson) return void process.stdout.write(`${JSON.stringify(results, null, 2)}\n`);
  process.stdout.write(
    `Slipway preview proxy benchmark (${results.machine}${quick ? ', --quick' : ''})\n` +
      `  GET through a preview origin   median ${r.previewMedianMs.toFixed(1)} ms vs API /healthz ${r.apiHealthzMedianMs.toFixed(1)} ms: +${r.overheadMedianMs.toFixed(1)} ms, ${r.ratio.toFixed(1)}x (auth, admission, relay per namespace and port, reused)\n`,
  );
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`benchmark failed: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  },
);
