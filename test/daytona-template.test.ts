/**
 * `slipway template create|check|update --provider daytona` (ADR 0019): the prepared Daytona
 * snapshot, through the real CLI against the fake Daytona (the SDK talks to it over HTTP), and
 * the provider creating from it.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DAYTONA_SNAPSHOT_MANIFEST, DaytonaSandboxProvider, type DaytonaSnapshotManifest } from '../activities/sandbox/daytona';
import { slipway } from './helpers/cli';
import { FakeDaytona } from './helpers/fake-daytona';
import { gitIn, makeRepo, sandboxRequest, tempDir } from './sandbox/helpers';

const fake = new FakeDaytona();
let parent: string;
let repo: string;
let home: string;
const setupArgs = ['--setup', 'mkdir -p node_modules && echo built > node_modules/dep.js', '--verify', 'test -f node_modules/dep.js'];
const setup = { commands: ['mkdir -p node_modules && echo built > node_modules/dep.js'], verify: ['test -f node_modules/dep.js'] };
const env = () => ({ ...fake.env(), SLIPWAY_HOME: home, TEMPORAL_ADDRESS: '', SLIPWAY_TEMPORAL_PORT: '1' });
const run = (...args: string[]) => slipway(['template', ...args, '--provider', 'daytona'], env(), repo);
const manifest = async () => JSON.parse(await fs.readFile(path.join(repo, DAYTONA_SNAPSHOT_MANIFEST), 'utf8')) as DaytonaSnapshotManifest;
const provider = () => new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake' });

beforeAll(async () => {
  await fake.start();
  fake.snapshotStepMs = 50;
  parent = tempDir('daytona-template');
  home = path.join(parent, 'home');
  ({ repo } = makeRepo(parent));
  await fs.writeFile(path.join(repo, '.gitignore'), 'node_modules/\n');
  await fs.writeFile(path.join(repo, 'package-lock.json'), '{"v":1}\n');
  gitIn(repo, 'add', '-A');
  gitIn(repo, 'commit', '-q', '-m', 'lockfile');
});
afterAll(async () => {
  await fake.stop();
  if (parent) await fs.rm(parent, { recursive: true, force: true });
});

describe('slipway template --provider daytona', () => {
  it('refuses a provider it does not know, options that do not apply, and a missing key, each naming what is wrong', async () => {
    const bad = await slipway(['template', 'check', '--provider', 'kube'], env(), repo);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--provider must be local, podman, docker or daytona, got "kube"/);
    const conf = await run('create', '--confinement', 'bubblewrap');
    expect(conf.code).toBe(2);
    expect(conf.stderr).toMatch(/--confinement applies to the local template only/);
    const nokey = await slipway(['template', 'create', '--provider', 'daytona', ...setupArgs], { ...env(), DAYTONA_API_KEY: '' }, repo);
    expect(nokey.code).toBe(1);
    expect(nokey.stderr).toMatch(/DAYTONA_API_KEY/);
    expect(fake.sandboxes.size).toBe(0);
    expect(fake.snapshots.size).toBe(0);
  });

  it('check says missing; create builds the snapshot from the setup, named by the fingerprint, and leaves no builder behind', async () => {
    const missing = await run('check');
    expect(missing.code).toBe(1);
    expect(missing.stdout).toContain('missing');
    // One transient failure while taking the snapshot is retried.
    fake.inject({ method: 'POST', path: /^\/api\/sandbox\/[^/]+\/snapshot$/, status: 503 });
    const created = await run('create', ...setupArgs, '--json');
    expect(created.code, created.stderr).toBe(0);
    const out = JSON.parse(created.stdout) as { created: boolean; snapshot: DaytonaSnapshotManifest };
    expect(out.created).toBe(true);
    const m = await manifest();
    expect(out.snapshot.name).toBe(m.name);
    expect(m.name).toMatch(/^slipway-[0-9a-f]{12}-[0-9a-f]{16}$/);
    const snap = fake.snapshots.get(m.name)!;
    expect(snap.state).toBe('active');
    // Only what setup made is in it: no tracked file, no .git, no bundle.
    expect(await fs.readFile(path.join(snap.dir, 'workspace/node_modules/dep.js'), 'utf8')).toBe('built\n');
    await expect(fs.access(path.join(snap.dir, 'workspace/.git'))).rejects.toThrow();
    await expect(fs.access(path.join(snap.dir, 'workspace/package-lock.json'))).rejects.toThrow();
    await expect(fs.access(path.join(snap.dir, '.slipway-in'))).rejects.toThrow();
    expect(fake.sandboxes.size).toBe(0);
    expect(gitIn(repo, 'branch', '--list', 'slipway/daytona-snapshot/*')).toBe('');
    expect((await run('check')).code).toBe(0);
    const again = await run('create', ...setupArgs);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain('a fresh snapshot exists');
  });

  it('a sandbox with that setup is created from the snapshot and only verifies; its workspace is its own base', async () => {
    const m = await manifest();
    const p = provider();
    const handle = await p.create(sandboxRequest(repo, 'from-snapshot', { group: 'snap', setup }));
    expect(handle.origin).toBe('template');
    expect(handle.setup?.commandsRun).toBe(0);
    const daytonaId = (JSON.parse(await fs.readFile(`${handle.root}.json`, 'utf8')) as { daytonaId: string }).daytonaId;
    expect(fake.sandboxes.get(daytonaId)!.snapshot).toBe(m.name);
    const seen = await p.exec(handle, { command: 'cat node_modules/dep.js package-lock.json && git status --porcelain', shell: true });
    expect(seen.stdout).toBe('built\n{"v":1}\n');
    // Another setup finds no snapshot of its own: made cold, setup run.
    const other = await p.create(sandboxRequest(repo, 'other-setup', { group: 'snap', setup: { commands: ['true'], verify: [] } }));
    expect(other.origin).toBe('cold');
    expect(other.setup?.commandsRun).toBe(1);
    await p.destroy({ repository: repo, root: handle.root });
    await p.destroy({ repository: repo, root: other.root });
  });

  it('check reports a snapshot Daytona has not finished (building) as stale, and creates do not use it', async () => {
    const m = await manifest();
    fake.snapshots.get(m.name)!.state = 'building';
    try {
      const check = await run('check');
      expect(check.code).toBe(1);
      expect(check.stdout).toContain(`the snapshot ${m.name} is building`);
      const p = provider();
      const handle = await p.create(sandboxRequest(repo, 'while-building', { group: 'snap', setup }));
      expect(handle.origin).toBe('cold');
      await p.destroy({ repository: repo, root: handle.root });
    } finally {
      fake.snapshots.get(m.name)!.state = 'active';
    }
  });

  it('a lockfile or setup change makes it stale; update rebuilds under the new name and deletes the old snapshot', async () => {
    const before = await manifest();
    const other = await run('check', '--setup', 'echo other');
    expect(other.code).toBe(1);
    expect(other.stdout).toContain('project_setup commands changed');
    await fs.writeFile(path.join(repo, 'package-lock.json'), '{"v":2}\n');
    gitIn(repo, 'commit', '-q', '-am', 'lockfile v2');
    const stale = await run('check');
    expect(stale.code).toBe(1);
    expect(stale.stdout).toContain('lockfile package-lock.json changed');
    const refused = await run('create');
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('stale');
    const updated = await run('update');
    expect(updated.code, updated.stderr).toBe(0);
    const after = await manifest();
    expect(after.name).not.toBe(before.name);
    expect(after.setup).toEqual(before.setup);
    expect(fake.snapshots.has(before.name)).toBe(false);
    expect(fake.snapshots.get(after.name)?.state).toBe('active');
    expect((await run('check')).code).toBe(0);
    expect((await run('update')).stdout).toContain('already fresh');
  });

  it('a snapshot Daytona fails to build fails the update with its reason; the recorded snapshot stays, no builder is left', async () => {
    const before = await manifest();
    fake.failNextSnapshot = 'no space left on the runner';
    const failed = await run('update', '--setup', 'mkdir -p node_modules && echo v3 > node_modules/dep.js');
    expect(failed.code).toBe(1);
    expect(failed.stderr).toContain('no space left on the runner');
    expect(await manifest()).toEqual(before);
    expect(fake.sandboxes.size).toBe(0);
    expect((await run('check')).code).toBe(0);
    // The failed one is replaced by the next build of that setup.
    const retried = await run('update', '--setup', 'mkdir -p node_modules && echo v3 > node_modules/dep.js');
    expect(retried.code, retried.stderr).toBe(0);
    expect(fake.snapshots.get((await manifest()).name)?.state).toBe('active');
  });
});
