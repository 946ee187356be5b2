/**
 * Sandbox service benchmark, on this machine, end to end (real Temporal dev server, real
 * Postgres, real HTTP on loopback):
 *
 *   1. create -> ready latency, warm-pool hit and cold boot            (goal: warm < 150 ms)
 *   2. exec round trip of `true` through REST vs spawning it directly (goal: < 10 ms overhead),
 *      vs the same confined spawn without REST (bubblewrap's share), and through an API host that
 *      is not the sandbox's owner (ADR 0013: a call workflow on the API's queue, the exec activity
 *      on the owner's), side by side; the descriptor-closing step's own cost, and a cgroup-limited
 *      command's host steps (the cgroup joined by a shell of its own vs by the descriptor step,
 *      ADR 0027); streamed exec line
 *      latency (printed -> received) on the owner and through it; a 5 MiB file written and read
 *      back on the owner and through it (ADR 0026)
 *   3. suspend and wake of a sandbox with ~10,000 files               (goal: each < 1 s)
 *   4. idle sandboxes one worker holds within 1 GiB of memory
 *
 * Usage: npx tsx bench/sandbox-service.ts [--quick] [--json] [--only 2]
 * Postgres: DATABASE_URL, else a throwaway cluster like the tests'. Prints medians and ratios.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import pino from 'pino';
import WebSocket from 'ws';
import { openPostgres } from '../activities/billing/db';
import { createAccount, createApiToken, createProfile } from '../activities/billing/records';
import { runProcess } from '../activities/process';
import { suspendLocal, restoreLocal } from '../activities/sandbox/local-snapshot';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import { closeInheritedFds } from '../activities/sandbox/close-fds';
import { HOST_HELPER_ENV } from '../activities/sandbox/exec';
import { limitedCommand } from '../activities/sandbox/limits';
import { findExecutable } from '../activities/sandbox/bubblewrap';
import { SandboxApiClient } from '../api/client';
import { freePort, startDevServer } from '../workers/dev-server';
import { installRuntimeLogging } from '../workers/logging';
import { startSandboxServiceHost } from '../workers/sandbox-service';
import { bundleWorkflows } from '../workers/worker';
import { setup as startPostgres, teardown as stopPostgres } from '../test/postgres-setup';

const quick = process.argv.includes('--quick');
/** `--only 2`: section 2 alone (the others take minutes). */
const only = process.argv.includes('--only') ? process.argv[process.argv.indexOf('--only') + 1] : undefined;
const runs = (section: string) => only === undefined || only === section;
const asJson = process.argv.includes('--json');
const N = {
  create: quick ? 5 : 20,
  exec: quick ? 50 : 300,
  suspend: quick ? 2 : 5,
  idle: quick ? 40 : 200,
};

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const p90 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length * 0.9)]!;
const ms = (x: number) => `${x.toFixed(1)} ms`;
const log = (line: string) => process.stderr.write(`${line}\n`);
const sh = (cwd: string, cmd: string) => execFileSync('/bin/sh', ['-c', cmd], { cwd, stdio: 'ignore' });

function makeRepo(parent: string, name: string, files: number): string {
  const repo = path.join(parent, name);
  execFileSync('git', ['init', '-q', '-b', 'main', repo]);
  writeFileSync(path.join(repo, '.gitignore'), 'node_modules/\n');
  const perDir = 100;
  for (let i = 0; i < files; i++) {
    const dir = path.join(repo, 'src', `d${Math.floor(i / perDir)}`);
    if (i % perDir === 0) mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, `f${i}.ts`), `export const v${i} = ${i};\n`);
  }
  // Packed, as a cloned repository is: a checkout reads objects from one pack, not 10,000 files.
  sh(repo, 'git add -A && git -c user.name=b -c user.email=b@b commit -qm init && git repack -adq && git prune-packed');
  return repo;
}

async function main() {
  installRuntimeLogging();
  // Calls through a remote owner run only with encrypted payloads (ADR 0013); both hosts share this key.
  process.env.SLIPWAY_PAYLOAD_KEY ??= randomBytes(32).toString('base64');
  const work = realpathSync(mkdtempSync(path.join(os.tmpdir(), 'slipway-bench-')));
  const results: Record<string, unknown> = { machine: `${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB`, node: process.version };

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
  const db = openPostgres(url.toString(), { max: 20 });

  const bundle = await bundleWorkflows();
  const host = await startSandboxServiceHost({
    db,
    temporalAddress: temporal.address,
    taskQueue: 'bench',
    workflowBundle: bundle,
    api: { host: '127.0.0.1', port: 0 },
    logger: pino({ level: 'warn' }, pino.destination(2)),
    watchIntervalMs: 2_000,
    reaper: false,
    maxCachedWorkflows: 2_000,
    workerId: 'bench-owner',
  });
  // An API host that owns nothing (as on another machine): its execs go through the owner.
  const remoteHost = await startSandboxServiceHost({
    db,
    temporalAddress: temporal.address,
    taskQueue: 'bench',
    workflowBundle: bundle,
    api: { host: '127.0.0.1', port: 0 },
    logger: pino({ level: 'warn' }, pino.destination(2)),
    worker: false,
    watchIntervalMs: 0,
    reaper: false,
    workerId: 'bench-api',
    requestsPerSecond: 0,
  });
  const small = makeRepo(work, 'small', 50);
  await createAccount(db, { id: 'bench', concurrentLimit: 10_000 });
  const { token } = await createApiToken(db, 'bench');
  const api = new SandboxApiClient(host.url!, token);
  const remoteApi = new SandboxApiClient(remoteHost.url!, token);
  await createProfile(db, 'bench', { name: 'cold', repository: small, baseRef: 'main', idleTimeoutSeconds: 3_600 });
  await createProfile(db, 'bench', { name: 'warm', repository: small, baseRef: 'main', idleTimeoutSeconds: 3_600, warmReplicas: 2 });

  try {
    // --- 1. create -> ready ------------------------------------------------------------------
    const createReady = async (profile: string) => {
      const t0 = performance.now();
      let s = await api.create({ profile });
      while (s.status === 'pending') s = await api.get(s.id, 10);
      const t = performance.now() - t0;
      if (s.status !== 'ready') throw new Error(`sandbox ${s.id} ended ${s.status}: ${s.error}`);
      return { id: s.id, ms: t, kind: s.provisioning_kind };
    };
    // --- 4. (measured first) idle sandboxes per GiB ------------------------------------------------------------
    if (runs('4')) {
    log(`4. memory: ${N.idle} idle ready sandboxes held by this worker ...`);
    // First, on a process that has done little else, so the RSS delta is the sandboxes'.
    for (let i = 0; i < 3; i++) await api.destroy((await createReady('cold')).id);
    await new Promise((r) => setTimeout(r, 2_000));
    const gc = (globalThis as { gc?: () => void }).gc;
    gc?.();
    gc?.();
    const before = process.memoryUsage();
    const idle: string[] = [];
    for (let i = 0; i < N.idle; i += 10) {
      const batch = await Promise.all(Array.from({ length: Math.min(10, N.idle - i) }, () => createReady('cold')));
      idle.push(...batch.map((b) => b.id));
    }
    await new Promise((r) => setTimeout(r, 3_000));
    gc?.();
    gc?.();
    const after = process.memoryUsage();
    const perSandboxBytes = (after.rss - before.rss) / idle.length;
    results.memory = {
      idleSandboxes: idle.length,
      rssBeforeMiB: before.rss / 2 ** 20,
      rssAfterMiB: after.rss / 2 ** 20,
      heapDeltaMiB: (after.heapUsed - before.heapUsed) / 2 ** 20,
      heapPerSandboxKiB: (after.heapUsed + after.external - before.heapUsed - before.external) / idle.length / 1024,
      perSandboxKiB: perSandboxBytes / 1024,
      sandboxesPerGiB: Math.floor(2 ** 30 / Math.max(perSandboxBytes, 1)),
      gcExposed: Boolean(gc),
    };
    log(`   RSS ${(before.rss / 2 ** 20).toFixed(0)} -> ${(after.rss / 2 ** 20).toFixed(0)} MiB for ${idle.length}: ${(perSandboxBytes / 1024).toFixed(0)} KiB each, ~${Math.floor(2 ** 30 / Math.max(perSandboxBytes, 1))} per GiB`);
    await Promise.all(idle.map((id) => api.destroy(id)));
    }
    if (runs('1')) {
    const cold: number[] = [];
    const warm: number[] = [];
    const doomed: string[] = [];
    log(`1. create -> ready: ${N.create} cold, ${N.create} warm ...`);
    for (let i = 0; i < 2; i++) doomed.push((await createReady('cold')).id); // warm-up (JIT, connections)
    for (let i = 0; i < N.create; i++) {
      const r = await createReady('cold');
      cold.push(r.ms);
      doomed.push(r.id);
    }
    let misses = 0;
    for (let i = 0; i < N.create; i++) {
      await host.replenishWarmPools();
      const r = await createReady('warm');
      if (r.kind === 'warm_hit') warm.push(r.ms);
      else misses++;
      doomed.push(r.id);
    }
    results.createReady = { coldMedianMs: median(cold), coldP90Ms: p90(cold), warmMedianMs: median(warm), warmP90Ms: p90(warm), warmMisses: misses };
    log(`   cold ${ms(median(cold))} (p90 ${ms(p90(cold))}), warm hit ${ms(median(warm))} (p90 ${ms(p90(warm))})`);
    await Promise.all(doomed.map((id) => api.destroy(id)));
    }

    // --- 2. exec round trip -------------------------------------------------------------------
    if (runs('2')) {
    log(`2. exec \`true\`: ${N.exec} through REST, ${N.exec} direct spawns ...`);
    const { id: execBox } = await createReady('cold');
    const root = (await db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [execBox])).rows[0]!.root;
    const rest: number[] = [];
    const remote: number[] = [];
    const direct: number[] = [];
    const confinedSpawn: number[] = [];
    const closer: number[] = [];
    const bare: number[] = [];
    const limitsOwnShell: number[] = [];
    const limitsFolded: number[] = [];
    let limitsBy = '';
    // The service's own provider settings for a default profile: bubblewrap, no network.
    const confinedProvider = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false });
    const trueBin = findExecutable('true')!;
    const closing = closeInheritedFds([0, 1, 2], trueBin, []);
    for (let i = 0; i < 20; i++) {
      await api.exec(execBox, { command: 'true' });
      await remoteApi.exec(execBox, { command: 'true' });
      await runProcess({ command: 'true', cwd: root });
      await confinedProvider.exec({ root }, { command: 'true' });
    }
    for (let i = 0; i < N.exec; i++) {
      // Interleaved, so machine load affects both alike.
      let t0 = performance.now();
      const r = await api.exec(execBox, { command: 'true' });
      rest.push(performance.now() - t0);
      if (r.exit_code !== 0) throw new Error('exec failed');
      t0 = performance.now();
      if ((await remoteApi.exec(execBox, { command: 'true' })).exit_code !== 0) throw new Error('exec through the owner failed');
      remote.push(performance.now() - t0);
      t0 = performance.now();
      await runProcess({ command: 'true', cwd: root });
      direct.push(performance.now() - t0);
      t0 = performance.now();
      await confinedProvider.exec({ root }, { command: 'true' });
      confinedSpawn.push(performance.now() - t0);
      // The descriptor-closing step alone (close-fds.ts): `true` behind it vs `true` bare.
      t0 = performance.now();
      await runProcess({ command: closing.command, args: closing.args, cwd: root, env: { ...HOST_HELPER_ENV } });
      closer.push(performance.now() - t0);
      t0 = performance.now();
      await runProcess({ command: trueBin, cwd: root, env: { ...HOST_HELPER_ENV } });
      bare.push(performance.now() - t0);
      // A limited command's host steps: the cgroup joined by /bin/sh after the descriptor step (before) vs by the step itself.
      // A fresh cgroup for each (the first process to join one pays more), in alternating order.
      for (const folded of i % 2 === 0 ? [false, true] : [true, false]) {
        const limited = await limitedCommand({ pids: 64 }, `bench-${process.pid}-${i}-${folded ? 'step' : 'sh'}`, trueBin, []);
        limitsBy = limited.enforcedBy;
        try {
          const c = folded ? closeInheritedFds([0, 1, 2], limited.direct.command, limited.direct.args, limited.join) : closeInheritedFds([0, 1, 2], limited.command, limited.args);
          t0 = performance.now();
          await runProcess({ command: c.command, args: c.args, cwd: root, env: { ...HOST_HELPER_ENV } });
          (folded ? limitsFolded : limitsOwnShell).push(performance.now() - t0);
        } finally {
          await limited.cleanup();
        }
      }
    }
    results.exec = {
      restMedianMs: median(rest),
      restP90Ms: p90(rest),
      directMedianMs: median(direct),
      overheadMedianMs: median(rest) - median(direct),
      ratio: median(rest) / median(direct),
      remoteOwnerMedianMs: median(remote),
      remoteOwnerP90Ms: p90(remote),
      remoteOwnerOverheadMedianMs: median(remote) - median(direct),
      confinedSpawnMedianMs: median(confinedSpawn),
      restOverConfinedSpawnMedianMs: median(rest) - median(confinedSpawn),
      closeFdsStepMedianMs: median(closer) - median(bare),
      limitsEnforcedBy: limitsBy,
      limitsJoinOwnShellMedianMs: median(limitsOwnShell),
      limitsJoinInStepMedianMs: median(limitsFolded),
    };
    log(`   REST ${ms(median(rest))} (p90 ${ms(p90(rest))}), direct ${ms(median(direct))}: overhead ${ms(median(rest) - median(direct))}, ratio ${(median(rest) / median(direct)).toFixed(2)}x`);
    log(`   through the owner (API host not the owner) ${ms(median(remote))} (p90 ${ms(p90(remote))}): overhead ${ms(median(remote) - median(direct))}`);
    log(`   confined spawn without REST ${ms(median(confinedSpawn))}: REST adds ${ms(median(rest) - median(confinedSpawn))}; the descriptor-closing step ${ms(median(closer) - median(bare))}`);
    log(`   \`true\` with a pids limit (${limitsBy}), host steps only: cgroup joined by its own shell ${ms(median(limitsOwnShell))}, by the descriptor step ${ms(median(limitsFolded))}`);

    // Streamed exec: each line carries the time it was printed; latency = received - printed.
    const lineLatency = async (client: SandboxApiClient, rounds: number) => {
      const lat: number[] = [];
      for (let round = 0; round < rounds; round++) {
        let buffered = '';
        await client.execStream(execBox, { command: 'sh', args: ['-c', 'for i in 1 2 3 4 5; do date +%s%N; sleep 0.1; done'] }, (stream, data) => {
          const now = performance.timeOrigin + performance.now();
          if (stream !== 'stdout') return;
          buffered += data;
          const lines = buffered.split('\n');
          buffered = lines.pop()!;
          for (const line of lines) lat.push(now - Number(line) / 1e6);
        });
      }
      return lat;
    };
    const rounds = quick ? 4 : 20;
    await lineLatency(api, 1);
    await lineLatency(remoteApi, 1);
    const streamLocal: number[] = [];
    const streamRemote: number[] = [];
    for (let i = 0; i < rounds; i++) {
      streamLocal.push(...(await lineLatency(api, 1)));
      streamRemote.push(...(await lineLatency(remoteApi, 1)));
    }
    // A 5 MiB file written and read back, on the owner and through it.
    const body = randomBytes(5 * 1024 * 1024);
    const fileRound = async (client: SandboxApiClient) => {
      const t0 = performance.now();
      await client.writeFile(execBox, 'bench.bin', body);
      const back = await client.readFile(execBox, 'bench.bin');
      if (!back.equals(body)) throw new Error('file round trip changed the bytes');
      return performance.now() - t0;
    };
    const fileLocal: number[] = [];
    const fileRemote: number[] = [];
    for (let i = 0; i < (quick ? 2 : 5); i++) {
      fileLocal.push(await fileRound(api));
      fileRemote.push(await fileRound(remoteApi));
    }
    results.streamAndFiles = {
      lineLatencyLocalMedianMs: median(streamLocal),
      lineLatencyLocalP90Ms: p90(streamLocal),
      lineLatencyRemoteMedianMs: median(streamRemote),
      lineLatencyRemoteP90Ms: p90(streamRemote),
      file5MiBLocalMedianMs: median(fileLocal),
      file5MiBRemoteMedianMs: median(fileRemote),
    };
    log(`   streamed line latency: on the owner ${ms(median(streamLocal))} (p90 ${ms(p90(streamLocal))}), through it ${ms(median(streamRemote))} (p90 ${ms(p90(streamRemote))})`);
    log(`   5 MiB write + read: on the owner ${ms(median(fileLocal))}, through it ${ms(median(fileRemote))}`);

    // Interactive session (WebSocket): open -> first output, and a typed line -> its echo, on
    // the owner and through the owner's tunnel (ADR 0028).
    const sessionRound = async (baseUrl: string, lines: number) => {
      const ws = new WebSocket(`${baseUrl.replace(/^http/, 'ws')}/api/v1/sandboxes/${execBox}/exec/ws`, { headers: { authorization: `Bearer ${token}` } });
      let text = '';
      let wake: (() => void) | undefined;
      ws.on('message', (d) => {
        const f = JSON.parse(d.toString()) as { type: string; data?: string };
        if (f.type === 'stdout') text += f.data;
        wake?.();
      });
      const until = (check: () => boolean) => new Promise<void>((resolve) => (check() ? resolve() : (wake = () => check() && resolve())));
      await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
      const t0 = performance.now();
      ws.send(JSON.stringify({ type: 'start', command: 'sh', args: ['-c', 'echo ready; exec cat'] }));
      await until(() => text.includes('ready'));
      const open = performance.now() - t0;
      const echo: number[] = [];
      for (let i = 0; i < lines; i++) {
        const mark = `k${i}x`;
        const t1 = performance.now();
        ws.send(Buffer.from(`${mark}\n`));
        await until(() => text.includes(mark));
        echo.push(performance.now() - t1);
      }
      ws.close();
      return { open, echo };
    };
    await sessionRound(host.url!, 5);
    await sessionRound(remoteHost.url!, 5);
    const openLocal: number[] = [];
    const openRemote: number[] = [];
    const echoLocal: number[] = [];
    const echoRemote: number[] = [];
    for (let i = 0; i < (quick ? 4 : 10); i++) {
      const l = await sessionRound(host.url!, 20);
      openLocal.push(l.open);
      echoLocal.push(...l.echo);
      const r = await sessionRound(remoteHost.url!, 20);
      openRemote.push(r.open);
      echoRemote.push(...r.echo);
    }
    results.sessions = {
      openLocalMedianMs: median(openLocal),
      openRemoteMedianMs: median(openRemote),
      echoLocalMedianMs: median(echoLocal),
      echoLocalP90Ms: p90(echoLocal),
      echoRemoteMedianMs: median(echoRemote),
      echoRemoteP90Ms: p90(echoRemote),
    };
    log(`   session open -> first output: on the owner ${ms(median(openLocal))}, through its tunnel ${ms(median(openRemote))}`);
    log(`   typed line -> echo: on the owner ${ms(median(echoLocal))} (p90 ${ms(p90(echoLocal))}), through its tunnel ${ms(median(echoRemote))} (p90 ${ms(p90(echoRemote))})`);
    await api.destroy(execBox);
    }

    // --- 3. suspend and wake, ~10,000 files ---------------------------------------------------
    if (runs('3')) {
    log(`3. suspend/wake with 10,000 files: ${N.suspend} rounds at the provider, ${N.suspend} end to end ...`);
    const big = makeRepo(work, 'big', 10_000);
    const provider = new LocalSandboxProvider({ copyIgnored: false });
    const bigBox = await provider.create({ sandboxId: 'bench.big', repository: big, group: 'bench', name: 'big', branch: 'slipway/bench/big', base: 'main' });
    sh(bigBox.root, 'for i in 1 2 3 4 5 6 7 8 9 10; do echo change >> src/d$i/f$((i*100)).ts; echo new > src/d$i/untracked$i.txt; done; git add src/d1');
    const suspendMs: number[] = [];
    const restoreMs: number[] = [];
    for (let i = 0; i < N.suspend; i++) {
      let t0 = performance.now();
      await suspendLocal(bigBox.root, { templateIgnored: false });
      suspendMs.push(performance.now() - t0);
      t0 = performance.now();
      await restoreLocal(bigBox.root, { templateIgnored: false });
      restoreMs.push(performance.now() - t0);
    }
    await createProfile(db, 'bench', { name: 'big-idle', repository: big, baseRef: 'main', idleTimeoutSeconds: 1, copyIgnored: false });
    const e2eWake: number[] = [];
    const e2eSuspend: number[] = [];
    const { id: idleBox } = await createReady('big-idle');
    await api.exec(idleBox, { command: 'sh', args: ['-c', 'echo x >> src/d3/f300.ts; echo y > notes.txt'] });
    for (let i = 0; i < N.suspend; i++) {
      let s = await api.get(idleBox);
      while (s.status !== 'suspended') {
        await new Promise((r) => setTimeout(r, 20));
        s = await api.get(idleBox);
      }
      const t0 = performance.now();
      const r = await api.exec(idleBox, { command: 'cat', args: ['notes.txt'] });
      e2eWake.push(performance.now() - t0);
      if (r.stdout !== 'y\n') throw new Error('state lost across suspend');
    }
    const suspendMetric = await host.metrics.registry.getSingleMetric('slipway_sandbox_suspend_seconds')?.get();
    const named = (suffix: string) => suspendMetric?.values.find((v) => (v as { metricName?: string }).metricName === `slipway_sandbox_suspend_seconds_${suffix}`)?.value ?? 0;
    const sum = named('sum');
    const count = named('count');
    if (count) e2eSuspend.push((sum / count) * 1000);
    results.suspendWake = {
      files: 10_000,
      providerSuspendMedianMs: median(suspendMs),
      providerRestoreMedianMs: median(restoreMs),
      e2eSuspendActivityMeanMs: e2eSuspend[0] ?? null,
      e2eWakeExecMedianMs: median(e2eWake),
    };
    log(`   provider: suspend ${ms(median(suspendMs))}, restore ${ms(median(restoreMs))}; through the service: suspend activity ${ms(e2eSuspend[0] ?? NaN)} (mean), exec on a suspended sandbox ${ms(median(e2eWake))}`);
    await api.destroy(idleBox);
    }

  } finally {
    await remoteHost.close();
    await host.close();
    await db.close();
    await temporal.stop();
    if (!process.env.DATABASE_URL) await stopPostgres();
    rmSync(work, { recursive: true, force: true });
  }

  const r = results as {
    createReady: { coldMedianMs: number; warmMedianMs: number };
    exec: { overheadMedianMs: number; ratio: number; restMedianMs: number; directMedianMs: number; remoteOwnerMedianMs: number; remoteOwnerOverheadMedianMs: number; confinedSpawnMedianMs: number; restOverConfinedSpawnMedianMs: number; closeFdsStepMedianMs: number; limitsEnforcedBy: string; limitsJoinOwnShellMedianMs: number; limitsJoinInStepMedianMs: number };
    sessions: { openLocalMedianMs: number; openRemoteMedianMs: number; echoLocalMedianMs: number; echoLocalP90Ms: number; echoRemoteMedianMs: number; echoRemoteP90Ms: number };
    streamAndFiles: { lineLatencyLocalMedianMs: number; lineLatencyRemoteMedianMs: number; lineLatencyRemoteP90Ms: number; lineLatencyLocalP90Ms: number; file5MiBLocalMedianMs: number; file5MiBRemoteMedianMs: number };
    suspendWake: { providerSuspendMedianMs: number; providerRestoreMedianMs: number; e2eWakeExecMedianMs: number };
    memory: { sandboxesPerGiB: number; perSandboxKiB: number; heapPerSandboxKiB: number };
  };
  if (asJson) {
    process.stdout.write(`${JSON.stringify(results, null, 2)}\n`);
    return;
  }
  const goal = (ok: boolean) => (ok ? 'met' : 'NOT met');
  process.stdout.write(
    [
      `Slipway sandbox service benchmark (${results.machine}, node ${results.node}${quick ? ', --quick' : ''}${only ? `, section ${only} only` : ''})`,
      ...(r.createReady
        ? [
            `  create -> ready, cold boot     median ${ms(r.createReady.coldMedianMs)}`,
            `  create -> ready, warm hit      median ${ms(r.createReady.warmMedianMs)}   goal < 150 ms: ${goal(r.createReady.warmMedianMs < 150)}`,
          ]
        : []),
      ...(r.exec
        ? [
            `  exec \`true\` via REST           median ${ms(r.exec.restMedianMs)} vs direct spawn ${ms(r.exec.directMedianMs)}: +${ms(r.exec.overheadMedianMs)}, ${r.exec.ratio.toFixed(2)}x   goal < 10 ms: ${goal(r.exec.overheadMedianMs < 10)}`,
            `    of which bubblewrap           confined spawn without REST ${ms(r.exec.confinedSpawnMedianMs)}: REST adds ${ms(r.exec.restOverConfinedSpawnMedianMs)}; closing inherited descriptors ${ms(r.exec.closeFdsStepMedianMs)}`,
            `    limits' host step (${r.exec.limitsEnforcedBy})  cgroup joined by its own shell ${ms(r.exec.limitsJoinOwnShellMedianMs)} vs in the descriptor step ${ms(r.exec.limitsJoinInStepMedianMs)} (${(r.exec.limitsJoinOwnShellMedianMs / r.exec.limitsJoinInStepMedianMs).toFixed(2)}x)`,
            `  exec \`true\` through the owner  median ${ms(r.exec.remoteOwnerMedianMs)}: +${ms(r.exec.remoteOwnerOverheadMedianMs)} over direct spawn, ${(r.exec.remoteOwnerMedianMs / r.exec.restMedianMs).toFixed(1)}x REST on the owner (a call workflow + an activity on the owner's queue; no goal)`,
            `  streamed line latency          on the owner median ${ms(r.streamAndFiles.lineLatencyLocalMedianMs)} (p90 ${ms(r.streamAndFiles.lineLatencyLocalP90Ms)}), through the owner ${ms(r.streamAndFiles.lineLatencyRemoteMedianMs)} (p90 ${ms(r.streamAndFiles.lineLatencyRemoteP90Ms)})`,
            `  5 MiB file write + read        on the owner median ${ms(r.streamAndFiles.file5MiBLocalMedianMs)}, through the owner ${ms(r.streamAndFiles.file5MiBRemoteMedianMs)} (${(r.streamAndFiles.file5MiBRemoteMedianMs / r.streamAndFiles.file5MiBLocalMedianMs).toFixed(0)}x: one call per 256 KiB chunk)`,
            ...(r.sessions
              ? [
                  `  session open -> first output   on the owner median ${ms(r.sessions.openLocalMedianMs)}, through its tunnel ${ms(r.sessions.openRemoteMedianMs)} (${(r.sessions.openRemoteMedianMs / r.sessions.openLocalMedianMs).toFixed(1)}x)`,
                  `  typed line -> echo (session)   on the owner median ${ms(r.sessions.echoLocalMedianMs)} (p90 ${ms(r.sessions.echoLocalP90Ms)}), through its tunnel ${ms(r.sessions.echoRemoteMedianMs)} (p90 ${ms(r.sessions.echoRemoteP90Ms)}) (${(r.sessions.echoRemoteMedianMs / r.sessions.echoLocalMedianMs).toFixed(1)}x)`,
                ]
              : []),
          ]
        : []),
      ...(r.suspendWake
        ? [
            `  suspend, 10,000 files          median ${ms(r.suspendWake.providerSuspendMedianMs)}   goal < 1 s: ${goal(r.suspendWake.providerSuspendMedianMs < 1000)}`,
            `  wake (restore), 10,000 files   median ${ms(r.suspendWake.providerRestoreMedianMs)}   goal < 1 s: ${goal(r.suspendWake.providerRestoreMedianMs < 1000)}`,
            `  exec on a suspended sandbox    median ${ms(r.suspendWake.e2eWakeExecMedianMs)} (wake + exec through REST and the workflow)`,
          ]
        : []),
      ...(r.memory ? [`  idle sandboxes per GiB         ~${r.memory.sandboxesPerGiB} (${r.memory.perSandboxKiB.toFixed(0)} KiB RSS each, ${r.memory.heapPerSandboxKiB.toFixed(0)} KiB V8 heap each; worker + API process)`] : []),
      '',
    ].join('\n'),
  );
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`benchmark failed: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  },
);
