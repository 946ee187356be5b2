/**
 * Cost of one exec per confinement (unconfined, bubblewrap with the network off, egress through
 * pasta, cgroup limits), side by side in one run:   npx tsx bench/exec.ts
 */
import { LocalSandboxProvider } from '../activities/sandbox/local';
import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
const dir = mkdtempSync(path.join(os.tmpdir(), 'xb-'));
const repo = path.join(dir, 'r');
execFileSync('sh', ['-c', `git init -q -b main ${repo} && cd ${repo} && echo a > a && git add a && git -c user.name=t -c user.email=t@t commit -qm a`]);
const kinds: Array<[string, LocalSandboxProvider]> = [
  ['unconfined', new LocalSandboxProvider({ backgroundFill: false })],
  ['bwrap, network off', new LocalSandboxProvider({ backgroundFill: false, confinement: { kind: 'bubblewrap', network: false } })],
  ['bwrap, egress (pasta)', new LocalSandboxProvider({ backgroundFill: false, confinement: { kind: 'bubblewrap', network: true } })],
  ['bwrap, limits (cgroup)', new LocalSandboxProvider({ backgroundFill: false, confinement: { kind: 'bubblewrap', network: false, limits: { pids: 256, memoryBytes: 512 * 2 ** 20 } } })],
  ['bwrap, disk_mb 1024 (loop ext4)', new LocalSandboxProvider({ backgroundFill: false, confinement: { kind: 'bubblewrap', network: false, limits: { diskBytes: 1024 * 2 ** 20 } } })],
];
(async () => {
for (const [i, [name, p]] of kinds.entries()) {
  const c0 = performance.now();
  const h = await p.create({ sandboxId: `b${i}`, repository: repo, group: 'g', name: `n${i}`, branch: `slipway/g/n${i}`, base: 'main' });
  const created = performance.now() - c0;
  await p.exec(h, { command: 'true' });
  const n = 30; const t0 = performance.now();
  for (let k = 0; k < n; k++) await p.exec(h, { command: 'true' });
  console.log(`${name}: ${((performance.now() - t0) / n).toFixed(1)} ms per exec of true (create ${created.toFixed(0)} ms)`);
  const d0 = performance.now();
  await p.destroy({ repository: repo, root: h.root });
  console.log(`  destroy ${(performance.now() - d0).toFixed(0)} ms`);
}
})();
