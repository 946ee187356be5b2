/**
 * A profile's resources are enforced, not recorded: a tenant's fork bomb, memory hog and disk
 * filler fail inside its sandbox, and another tenant keeps being served meanwhile.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createProfile } from '../../activities/billing/records';
import { startServiceHarness, type ServiceHarness } from './harness';

let h: ServiceHarness;
let a: Awaited<ReturnType<ServiceHarness['account']>>;
let b: Awaited<ReturnType<ServiceHarness['account']>>;
let sa: string;
let sb: string;
const sh = (script: string) => ({ command: 'sh', args: ['-c', script] });

beforeAll(async () => {
  h = await startServiceHarness();
  a = await h.account({ limit: 2 });
  b = await h.account({ limit: 2 });
  await a.profile({ name: 'small', resources: { processes: 48, memory_mb: 128, file_size_mb: 4, cpu: 0.5, disk_mb: 16 } });
  await b.profile({ name: 'small', resources: { processes: 48 } });
  [sa, sb] = await Promise.all([a.api.create({ profile: 'small' }).then((s) => s.id), b.api.create({ profile: 'small' }).then((s) => s.id)]);
  await Promise.all([h.waitFor(a.api, sa, ['ready']), h.waitFor(b.api, sb, ['ready'])]);
});
afterAll(async () => {
  await h?.stop();
});

describe('profile resources', () => {
  it('refuses resources it cannot enforce or understand, naming the field', async () => {
    await expect(createProfile(h.database.db, a.id, { name: 'bad', repository: h.repo, resources: { memory_mb: -1 } })).rejects.toThrow(/resources\.memory_mb/);
    await expect(createProfile(h.database.db, a.id, { name: 'bad2', repository: h.repo, resources: { gpus: 1 } })).rejects.toThrow(/resources/);
  });

  it('holds a fork bomb, a memory hog and a disk filler, while another tenant is served', async () => {
    const marker = `95${process.pid}17`;
    const bomb = a.api.exec(sa, sh(`n=0; while [ $n -lt 400 ]; do sleep ${marker} </dev/null >/dev/null 2>&1 & n=$((n+1)); done; wait`));
    // The other tenant is served during the attack.
    const other = await b.api.exec(sb, sh('echo served'));
    expect(other.stdout).toBe('served\n');
    const bombed = await bomb;
    expect(bombed.stderr).toMatch(/fork|Resource temporarily unavailable/i);

    const hog = await a.api.exec(sa, { command: 'node', args: ['-e', 'const a = []; for (;;) a.push(Buffer.alloc(16 * 1024 * 1024, 1));'] });
    expect(hog.exit_code).not.toBe(0);

    const filler = await a.api.exec(sa, sh('head -c 50000000 /dev/zero > big.bin; echo $?; wc -c < big.bin'));
    const [code, size] = filler.stdout.trim().split('\n');
    expect(code).not.toBe('0');
    expect(Number(size)).toBeLessThanOrEqual(4 * 1024 * 1024);

    // Files under the size cap, many of them: the workspace's disk (disk_mb: 16) ends it.
    const disk = await a.api.exec(sa, sh('i=0; while [ $i -lt 20 ] && head -c 3000000 /dev/zero > f$i; do i=$((i+1)); done; cat f* | wc -c; rm -f f* big.bin'));
    expect(disk.stderr).toMatch(/No space left on device/);
    expect(Number(disk.stdout.trim())).toBeLessThanOrEqual(16 * 1024 * 1024);
    expect((await b.api.exec(sb, sh('head -c 20000000 /dev/zero > big && wc -c < big && rm big'))).stdout.trim()).toBe('20000000');
    const disks = path.join(h.repo, '.slipway', 'disks');
    expect(await fs.readdir(disks, { recursive: true })).toEqual(expect.arrayContaining([expect.stringMatching(/\.img$/)]));

    // Destroyed, it leaves no mount and no image behind.
    await a.api.destroy(sa);
    await h.waitFor(a.api, sa, ['terminated']);
    expect(await fs.readFile('/proc/self/mountinfo', 'utf8')).not.toContain(h.repo);
    expect((await fs.readdir(disks, { recursive: true })).filter((f) => f.endsWith('.img'))).toEqual([]);
  });
});
