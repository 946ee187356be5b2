/**
 * Process starts, direct (execFile) against the spawner (lib/spawner.ts, ADR 0036), in a process
 * grown to a worker's resident size: CPU of this process and the longest/total event-loop block
 * per call, side by side as ratios. `npx tsx bench/spawner.ts [--mb 300] [--calls 200]`
 */
import { execFile } from 'node:child_process';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { readFileSync } from 'node:fs';
import { spawnFile, spawnerPid, startSpawner } from '../lib/spawner';

/** CPU ms a process has used so far (utime + stime from /proc, in clock ticks of 10 ms). */
function cpuOf(pid: number | undefined): number {
  if (!pid) return 0;
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) * 10;
}

const arg = (name: string, dflt: number): number => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const mb = arg('mb', 300);
const calls = arg('calls', 200);
// Touch `mb` MB of heap, as the worker's modules and caches do.
const ballast: Buffer[] = [];
for (let i = 0; i < mb; i++) ballast.push(Buffer.alloc(1024 * 1024, i & 0xff));

const env = { PATH: process.env.PATH ?? '/usr/bin:/bin' };
const viaDirect = (): Promise<void> => new Promise((r, j) => execFile('git', ['--version'], { env, maxBuffer: 1 << 20 }, (e) => (e ? j(e) : r())));
const viaSpawner = (): Promise<void> => new Promise((r, j) => spawnFile('git', ['--version'], { env, maxBuffer: 1 << 20 }, (e) => (e ? j(e) : r())));

async function measure(run: () => Promise<void>): Promise<{ cpuMs: number; totalCpuMs: number; wallMs: number; blockMs: number; maxBlockMs: number }> {
  for (let i = 0; i < 5; i++) await run();
  const h = monitorEventLoopDelay({ resolution: 1 });
  h.enable();
  const cpu0 = process.cpuUsage();
  const helper0 = cpuOf(spawnerPid());
  const t0 = performance.now();
  // Four at a time, as the worker's activity slots run them.
  let next = 0;
  await Promise.all(Array.from({ length: 4 }, async () => {
    while (next++ < calls) await run();
  }));
  const wallMs = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const helperMs = cpuOf(spawnerPid()) - helper0;
  h.disable();
  return { cpuMs: (cpu.user + cpu.system) / 1000 / calls, totalCpuMs: ((cpu.user + cpu.system) / 1000 + helperMs) / calls, wallMs: wallMs / calls, blockMs: (h.mean / 1e6) , maxBlockMs: h.max / 1e6 };
}

async function main(): Promise<void> {
  const rss = Math.round(process.memoryUsage().rss / 1e6);
  const direct = await measure(viaDirect);
  const release = startSpawner();
  const spawner = await measure(viaSpawner);
  release();
  const f = (n: number): string => n.toFixed(2);
  console.log(`process starts of git --version, ${calls} calls, 4 at a time, this process at ${rss} MB resident (ballast ${ballast.length} MB)`);
  console.log('                       direct  spawner  spawner/direct');
  for (const k of ['cpuMs', 'totalCpuMs', 'wallMs', 'blockMs', 'maxBlockMs'] as const) {
    console.log(`${(k === 'cpuMs' ? 'CPU ms per call' : k === 'totalCpuMs' ? '+ spawner CPU ms' : k === 'wallMs' ? 'wall ms per call' : k === 'blockMs' ? 'loop delay mean ms' : 'loop delay max ms').padEnd(22)} ${f(direct[k]).padStart(6)}  ${f(spawner[k]).padStart(7)}  ${f(spawner[k] / direct[k]).padStart(6)}`);
  }
}

void main();
