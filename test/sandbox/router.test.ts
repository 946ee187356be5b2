/**
 * The router sends every call on a container sandbox to the engine its record names (router.ts
 * `owner`), whatever engine this worker happened to make first. No docker engine here: a fake
 * `docker` on PATH answers `inspect` and logs its arguments, which is all routing needs; the
 * podman side is the real podman.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { containerName, containerSandboxRoot } from '../../activities/sandbox/container';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { SandboxProviders } from '../../activities/sandbox/router';
import { makeRepo, tempDir } from './helpers';

describe('router: the container record names the engine', () => {
  let parent: string;
  let repo: string;
  let log: string;
  const savedPath = process.env.PATH;

  const record = async (name: string, engine?: 'docker' | 'podman') => {
    const root = containerSandboxRoot(repo, 'routed', name);
    await fs.mkdir(root, { recursive: true });
    await fs.writeFile(`${root}.json`, JSON.stringify({ version: 1, ...(engine ? { engine } : {}), sandboxId: name, group: 'routed', name, branch: `b-${name}`, baseCommit: 'x', startCommit: 'x', container: containerName(root), state: 'ready', createdAt: '' }));
    return root;
  };
  const dockerCalls = async () => (await fs.readFile(log, 'utf8').catch(() => '')).split('\n').filter(Boolean);

  beforeAll(async () => {
    parent = tempDir('router');
    ({ repo } = makeRepo(parent));
    const bin = path.join(parent, 'bin');
    log = path.join(parent, 'docker.log');
    await fs.mkdir(bin);
    // Answers any inspect with an exited container (exit 3), so a probe routed here says so.
    await fs.writeFile(
      path.join(bin, 'docker'),
      `#!/bin/sh\necho "$*" >> '${log}'\ncase "$1" in inspect) echo '{"Id":"0123456789ab","State":{"Status":"exited","OOMKilled":false,"ExitCode":3}}' ;; esac\n`,
      { mode: 0o755 },
    );
    process.env.PATH = `${bin}:${savedPath}`;
  });

  afterAll(async () => {
    process.env.PATH = savedPath;
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('a docker-recorded sandbox goes to docker, even after podman was made first', async () => {
    const router = new SandboxProviders(new LocalSandboxProvider());
    router.provider('podman');
    const root = await record('on-docker', 'docker');
    const seen = await router.probe({ root });
    expect(seen).toMatchObject({ alive: false, reason: 'container_exited' });
    expect(seen.alive === false && seen.detail).toContain('exit 3');
    expect(await dockerCalls()).toEqual([`inspect --type container --format {"Id":{{json .ID}},"State":{{json .State}}} ${containerName(root)}`]);
  });

  it('podman-recorded sandboxes, and records from before the engine was kept, go to podman, even after docker was made first', async () => {
    const router = new SandboxProviders(new LocalSandboxProvider());
    router.provider('docker');
    const before = (await dockerCalls()).length;
    for (const root of [await record('on-podman', 'podman'), await record('old-record')]) {
      // The real podman has no such container: it says so, and docker was never asked.
      expect(await router.probe({ root })).toMatchObject({ alive: false, reason: 'container_removed' });
    }
    expect((await dockerCalls()).length).toBe(before);
  });
});
