/**
 * Create to ready, an exec round trip and a 1 MiB file read (openFile: stat, then the streamed
 * download), side by side in one run: the local provider, podman,
 * and Daytona through the real SDK against the local fake (test/helpers/fake-daytona.ts), which
 * measures the SDK's and the provider's own overhead (HTTP, sessions, polling), not Daytona's.
 * Reference for a live run (DAYTONA_API_KEY set: `-- --live`): Daytona publishes a median
 * create of about 110 ms; Tack measured about 30 s for its full sandbox setup.
 *   npx tsx bench/daytona.ts [--quick] [--live]
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ContainerSandboxProvider } from '../activities/sandbox/container';
import { DaytonaSandboxProvider } from '../activities/sandbox/daytona';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import type { SandboxProvider } from '../activities/sandbox/provider';
import { FakeDaytona } from '../test/helpers/fake-daytona';

const quick = process.argv.includes('--quick');
const live = process.argv.includes('--live');
const creates = quick ? 3 : 8;
const execs = quick ? 10 : 30;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

(async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-bench-daytona-'));
  const repo = path.join(dir, 'r');
  execFileSync('sh', ['-c', `git init -q -b main ${repo} && cd ${repo} && echo a > a && git add a && git -c user.name=t -c user.email=t@t commit -qm a`]);
  const fake = await new FakeDaytona().start();
  const kinds: Array<[string, SandboxProvider]> = [
    ['local', new LocalSandboxProvider({ backgroundFill: false })],
    ['podman', new ContainerSandboxProvider({ engine: 'podman' })],
    ['daytona (SDK -> fake on 127.0.0.1)', new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake' })],
  ];
  if (live) kinds.push(['daytona (live)', new DaytonaSandboxProvider({ snapshot: process.env.DAYTONA_SNAPSHOT, autoStopMinutes: 15, autoDeleteMinutes: 60 })]);
  for (const [k, [name, p]] of kinds.entries()) {
    try {
      const createMs: number[] = [];
      const roots: string[] = [];
      for (let i = 0; i < creates; i++) {
        const t0 = performance.now();
        const h = await p.create({ sandboxId: `b${k}.${i}`, repository: repo, group: 'bench', name: `p${k}-${i}`, branch: `slipway/bench/p${k}-${i}`, base: 'main' });
        createMs.push(performance.now() - t0);
        roots.push(h.root);
      }
      const h = { root: roots[0] };
      await p.exec(h, { command: 'true' });
      const execMs: number[] = [];
      for (let i = 0; i < execs; i++) {
        const t0 = performance.now();
        await p.exec(h, { command: 'true' });
        execMs.push(performance.now() - t0);
      }
      await p.writeFile(h, 'bench.bin', Buffer.alloc(1024 * 1024, 7));
      const readMs: number[] = [];
      for (let i = 0; i < execs; i++) {
        const t0 = performance.now();
        const opened = await p.openFile(h, 'bench.bin', { maxBytes: 2 * 1024 * 1024 });
        for await (const chunk of opened.stream) void chunk;
        readMs.push(performance.now() - t0);
      }
      console.log(`${name}: create to ready median ${median(createMs).toFixed(0)} ms (n=${creates}), exec round trip median ${median(execMs).toFixed(1)} ms (n=${execs}), 1 MiB file read median ${median(readMs).toFixed(1)} ms (n=${execs})`);
      for (const root of roots) await p.destroy({ repository: repo, root });
    } catch (e) {
      console.log(`${name}: not measured: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  await fake.stop();
  rmSync(dir, { recursive: true, force: true });
  // The SDK's HTTP agents keep sockets open: end here rather than wait for them.
  process.exit(0);
})();
