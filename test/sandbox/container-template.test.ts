/**
 * `slipway template create|check|update --provider podman` (ADR 0025) through the real CLI, with
 * real podman: an image with the project's setup done, which container sandboxes start from
 * (verify only, `origin: 'template'`) while it is current.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContainerSandboxProvider } from '../../activities/sandbox/container';
import { readContainerTemplate } from '../../activities/sandbox/container-template';
import type { ProjectSetup } from '../../activities/sandbox/provider';
import { slipway } from '../helpers/cli';
import { gitIn, makeRepo, podman, podmanOk, sandboxRequest, tempDir } from './helpers';

describe('slipway template --provider podman', () => {
  let parent: string;
  let repo: string;
  const images: string[] = [];
  const provider = new ContainerSandboxProvider({ engine: 'podman' });
  // The setup leaves a file no checkout has, stamped with when it ran: a sandbox from the template has the template's stamp.
  const setup: ProjectSetup = { commands: ['mkdir -p node_modules && date +%s%N > node_modules/stamp'], verify: ['test -s node_modules/stamp'] };
  const setupArgs = ['--setup', setup.commands[0], '--verify', setup.verify[0]];
  const cli = (...args: string[]) => slipway(['template', ...args, '--provider', 'podman', '--repo', repo], {}, repo);

  beforeAll(async () => {
    parent = tempDir('ctemplate');
    ({ repo } = makeRepo(parent));
    await fs.writeFile(path.join(repo, '.gitignore'), 'node_modules/\n');
    await fs.writeFile(path.join(repo, 'package-lock.json'), '{"v":1}\n');
    gitIn(repo, 'add', '-A');
    gitIn(repo, 'commit', '-q', '-m', 'lockfile');
  });

  afterAll(async () => {
    for (const image of images) podmanOk('rmi', '-f', image);
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('refuses an unknown provider, naming the option, and builds nothing', async () => {
    const bad = await slipway(['template', 'create', '--provider', 'lxc', '--repo', repo], {}, repo);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain('--provider must be local, podman, docker or daytona, got "lxc"');
    expect(await readContainerTemplate(repo, 'podman')).toBeUndefined();
  });

  it('creates an image with setup done, sandboxes start from it and only verify; a lockfile change makes it stale; update rebuilds and drops the old image', async () => {
    const missing = await cli('check');
    expect(missing.code).toBe(1);
    expect(missing.stdout).toContain('missing');

    const created = await cli('create', ...setupArgs, '--json');
    expect(created.code, created.stderr).toBe(0);
    const manifest = (await readContainerTemplate(repo, 'podman'))!;
    images.push(manifest.image);
    expect(JSON.parse(created.stdout)).toMatchObject({ state: 'fresh', created: true, template: { image: manifest.image } });
    expect(manifest.image).toMatch(/^localhost\/slipway-template-[0-9a-f]{12}:[0-9a-f]{16}$/);
    expect(podmanOk('image', 'exists', manifest.image)).toBe(true);
    // No build container is left behind.
    expect(podman('ps', '-a', '--filter', `label=slipway.template=${repo}`, '--format', '{{.Names}}')).toBe('');
    expect((await cli('check')).code).toBe(0);
    const again = await cli('create', ...setupArgs);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain('a fresh template exists');

    const stampIn = async (root: string) => (await provider.exec({ root }, { command: 'cat', args: ['node_modules/stamp'] })).stdout.trim();
    const fromTemplate = await provider.create({ ...sandboxRequest(repo, 'one', { group: 'ct' }), setup });
    try {
      expect(fromTemplate.origin).toBe('template');
      expect(fromTemplate.setup?.commandsRun).toBe(0);
      const stamp = await stampIn(fromTemplate.root);
      expect(stamp).toMatch(/^\d+$/);
      // The sandbox is on its own branch at the base, its files tracked as in the repository.
      const status = await provider.exec(fromTemplate, { command: 'git', args: ['status', '--porcelain'] });
      expect(status.stdout).toBe('');
      expect((await provider.exec(fromTemplate, { command: 'cat', args: ['README.md'] })).stdout).toBe('hello\n');
      // Another sandbox gets the same files: the template's, not a second setup run.
      const second = await provider.create({ ...sandboxRequest(repo, 'two', { group: 'ct' }), setup });
      expect(second.origin).toBe('template');
      expect(await stampIn(second.root)).toBe(stamp);
      await provider.destroy({ repository: repo, root: second.root });
    } finally {
      await provider.destroy({ repository: repo, root: fromTemplate.root });
    }

    // Other setup commands: not this template's.
    const otherSetup = await cli('check', '--setup', 'npm ci', '--json');
    expect(otherSetup.code).toBe(1);
    expect(JSON.parse(otherSetup.stdout)).toMatchObject({ state: 'stale', reasons: ['project_setup commands changed'] });

    await fs.writeFile(path.join(repo, 'package-lock.json'), '{"v":2}\n');
    gitIn(repo, 'commit', '-qam', 'bump deps');
    const stale = await cli('check');
    expect(stale.code).toBe(1);
    expect(stale.stdout).toContain('lockfile package-lock.json changed');
    const refused = await cli('create', ...setupArgs);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('slipway template update --provider podman');
    // A create at the new base does not use the stale image: setup runs.
    const cold = await provider.create({ ...sandboxRequest(repo, 'three', { group: 'ct' }), setup });
    expect(cold.origin).toBe('cold');
    expect(cold.setup?.commandsRun).toBe(1);
    await provider.destroy({ repository: repo, root: cold.root });

    const updated = await cli('update');
    expect(updated.code, updated.stderr).toBe(0);
    expect(updated.stdout).toContain('lockfile package-lock.json changed');
    const now = (await readContainerTemplate(repo, 'podman'))!;
    images.push(now.image);
    expect(now.image).not.toBe(manifest.image);
    expect(now.setup).toMatchObject({ commands: setup.commands }); // the recorded setup
    expect(podmanOk('image', 'exists', manifest.image)).toBe(false);
    expect((await cli('update')).stdout).toContain('already fresh');
    const after = await provider.create({ ...sandboxRequest(repo, 'four', { group: 'ct' }), setup });
    expect(after.origin).toBe('template');
    await provider.destroy({ repository: repo, root: after.root });
    expect(gitIn(repo, 'status', '--porcelain')).toBe('');
  });
});
