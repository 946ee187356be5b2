/**
 * The workspace disk quota (`disk_mb`): a sandbox's worktree is its own loop-mounted ext4 image
 * (activities/sandbox/disk.ts). A disk filler stops at the quota with ENOSPC, the host and other
 * sandboxes are unaffected, and destroy, suspend and restore leave no mount or image behind.
 *
 * Runs as root with loop devices (as CI does); never skips.
 */
import { execFileSync } from 'node:child_process';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { parseProfileResources, limitsFromConfig } from '../../core/limits';
import { BWRAP_MISSING_MESSAGE, findExecutable } from '../../activities/sandbox/bubblewrap';
import { diskImagePath, isMountPoint } from '../../activities/sandbox/disk';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { exists, gitIn, IDENTITY_ENV, makeRepo, sandboxRequest, tempDir } from './helpers';

const MB = 1024 * 1024;
const QUOTA = 24 * MB;

describe('workspace disk quota', () => {
  let parent: string;
  let repo: string;
  let provider: LocalSandboxProvider;
  let limited: SandboxHandle;
  let neighbour: SandboxHandle;
  const confinement = (diskBytes?: number) => ({ kind: 'bubblewrap' as const, network: false, ...(diskBytes ? { limits: { diskBytes } } : {}) });
  const run = (h: SandboxHandle, command: string) => provider.exec(h, { command, shell: true, env: IDENTITY_ENV });
  const image = (h: SandboxHandle) => diskImagePath(repo, 'obj', path.basename(h.root));

  beforeAll(async () => {
    if (!findExecutable('bwrap')) throw new Error(`the disk quota tests need bubblewrap: ${BWRAP_MISSING_MESSAGE}`);
    parent = tempDir('disk');
    ({ repo } = makeRepo(parent));
    provider = new LocalSandboxProvider({ backgroundFill: false });
    limited = await provider.create(sandboxRequest(repo, 'limited', { confinement: confinement(QUOTA), warmPool: 2 }));
    neighbour = await provider.create(sandboxRequest(repo, 'neighbour', { confinement: confinement() }));
  });

  afterAll(async () => {
    for (const h of [limited, neighbour]) if (h) await provider.destroy({ repository: repo, root: h.root }).catch(() => undefined);
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('reads disk_mb from objective limits and profile resources, naming the field when wrong', () => {
    expect(limitsFromConfig({ disk_mb: 512 })).toEqual({ diskBytes: 512 * MB });
    expect(() => parseProfileResources({ disk_mb: 4 })).toThrow(/^resources\.disk_mb: /);
    expect(() => parseProfileResources({ disk_mb: 1.5 })).toThrow(/^resources\.disk_mb: /);
  });

  it('refuses a disk limit where it cannot be enforced (not root), naming the field, with nothing made', async () => {
    // A worker that is not root, as far as Slipway can tell (process.getuid is Node's, not ours:
    // running a whole child as nobody needs a checkout nobody can read, which a clone in a 0700
    // temporary folder is not).
    const dir = tempDir('disk-nobody');
    const { repo: own } = makeRepo(dir);
    const getuid = vi.spyOn(process, 'getuid').mockReturnValue(65534);
    try {
      const refused = await new LocalSandboxProvider({ backgroundFill: false })
        .create({ sandboxId: 't.x', repository: own, group: 'obj', name: 'x', branch: 'slipway/obj/x', base: 'main', confinement: { kind: 'bubblewrap', network: false, limits: { diskBytes: QUOTA } } })
        .catch((e: Error) => e);
      expect(refused).toBeInstanceOf(Error);
      expect((refused as Error).message).toMatch(/^disk_mb: .*Slipway does not run as root/);
    } finally {
      getuid.mockRestore();
    }
    expect(await exists(path.join(own, '.slipway', 'worktrees'))).toBe(false);
    expect(await exists(path.join(own, '.slipway', 'sandboxes'))).toBe(false);
    expect(gitIn(own, 'branch', '--list', 'slipway/obj/x')).toBe('');
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('mounts the workspace as its own filesystem, the checkout and git working inside', async () => {
    expect(await isMountPoint(limited.root)).toBe(true);
    expect(await exists(image(limited))).toBe(true);
    expect(await isMountPoint(neighbour.root)).toBe(false);
    const r = await run(limited, 'cat README.md && echo x > new.txt && git add new.txt && git commit -qm inside && git log -1 --format=%s && grep " /workspace " /proc/self/mountinfo');
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toContain('hello\ninside\n');
    // Its own filesystem: the sandbox's mount table names `/`, not the host path.
    expect(r.stdout).toMatch(/ \/ \/workspace /);
    expect(r.stdout).not.toContain(repo);
  });

  it('stops a disk filler at the quota with ENOSPC; the host and another sandbox keep writing', async () => {
    const filler = await run(limited, 'dd if=/dev/zero of=fill bs=1M count=100 2>&1; yes filler > fill2 2>&1; echo "exit $?"; stat -c %s fill fill2');
    expect(filler.stdout).toMatch(/No space left on device/);
    const [fill, fill2] = filler.stdout.trim().split('\n').slice(-2).map(Number);
    expect(fill! + fill2!).toBeLessThanOrEqual(QUOTA);
    expect(fill! + fill2!).toBeGreaterThan(QUOTA / 2);
    const other = await run(neighbour, 'dd if=/dev/zero of=big bs=1M count=40 2>&1 && stat -c %s big && rm big');
    expect(other.exitCode, other.stdout).toBe(0);
    expect(other.stdout.trim().split('\n').pop()).toBe(String(40 * MB));
    await fs.writeFile(path.join(parent, 'host-file'), Buffer.alloc(4 * MB));
    // Freed, it is writable again.
    const again = await run(limited, 'rm fill fill2 && echo ok > after.txt && cat after.txt');
    expect(again.stdout.trim()).toBe('ok');
  });

  it('keeps its files through suspend and restore, on a fresh disk of the same size', async () => {
    await run(limited, 'echo kept > kept.txt');
    await provider.suspend(limited, { templateIgnored: false });
    expect(await isMountPoint(limited.root)).toBe(false);
    expect(await exists(image(limited))).toBe(false);
    await provider.restore(limited, { templateIgnored: false });
    expect(await isMountPoint(limited.root)).toBe(true);
    const r = await run(limited, 'cat kept.txt && dd if=/dev/zero of=fill bs=1M count=100 2>&1; rm -f fill');
    expect(r.stdout).toContain('kept\n');
    expect(r.stdout).toMatch(/No space left on device/);
  });

  it('mounts the disk again when it is found unmounted (a reboot)', async () => {
    execFileSync('umount', [limited.root]);
    expect(await fs.readdir(limited.root)).toEqual([]);
    const r = await run(limited, 'cat kept.txt');
    expect(r.stdout).toBe('kept\n');
    expect(await isMountPoint(limited.root)).toBe(true);
  });

  it('destroy leaves no mount, loop device or image behind', async () => {
    const img = image(limited);
    await provider.destroy({ repository: repo, root: limited.root });
    expect(await isMountPoint(limited.root)).toBe(false);
    expect(await exists(img)).toBe(false);
    expect(await exists(limited.root)).toBe(false);
    expect(execFileSync('losetup', ['-a'], { encoding: 'utf8' })).not.toContain(img);
    expect(gitIn(repo, 'worktree', 'list')).not.toContain(limited.root);
  });
});
