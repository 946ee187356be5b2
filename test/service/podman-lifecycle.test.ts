/**
 * The sandbox service on podman (`provider: podman` profiles, ADR 0012): the lifecycle every
 * provider passes (provider-suites.ts; idle suspend stops the container and keeps its
 * workspace), and a container the kernel's OOM killer ends (ADR 0025). Real Postgres, real
 * Temporal, real HTTP, real podman.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { expect, it } from 'vitest';
import { containerName, engineEnv } from '../../activities/sandbox/container';
import { defaultProviderFor } from '../../activities/service/providers';
import { OOM_KILL_CONTAINER_SCRIPT } from '../sandbox/helpers';
import { describeProviderLifecycle } from '../sandbox/provider-suites';

const containerState = (name: string) => {
  try {
    return execFileSync('podman', ['inspect', '--format', '{{.State.Status}}', name], { env: engineEnv(), encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return 'gone';
  }
};

describeProviderLifecycle('podman', {
  provider: 'podman',
  providerFor: () => defaultProviderFor(),
  resources: { memory_mb: 256, processes: 128 },
  // Stopped: the container exited with its workspace kept; gone: both removed.
  state: async (root) => {
    const s = containerState(containerName(root));
    if (s === 'running') return 'running';
    if (s === 'exited' && existsSync(root)) return 'stopped';
    if (s === 'gone' && !existsSync(root)) return 'gone';
    throw new Error(`container ${containerName(root)} is ${s}, workspace ${existsSync(root) ? 'present' : 'absent'}`);
  },
  firstExec: { script: 'pwd; grep CapEff /proc/self/status', expected: '/workspace\nCapEff:\t0000000000000000\n' },
  more: (h, root) => {
    it("a container the kernel's OOM killer ends is seen by the watcher: the sandbox terminates with reason oom_killed", async () => {
      const a = await h().account({ limit: 2 });
      await a.profile({ name: 'podman-tiny', provider: 'podman', resources: { memory_mb: 32 } });
      const { id } = await a.api.create({ profile: 'podman-tiny' });
      await a.api.get(id, 60);
      const name = containerName(await root(id));
      expect(containerState(name)).toBe('running');
      // The exec dies with its container; its answer does not matter, what the watcher sees does.
      await a.api.exec(id, { command: 'sh', args: ['-c', OOM_KILL_CONTAINER_SCRIPT] }).catch(() => undefined);
      const done = await h().waitFor(a.api, id, ['terminated'], 60_000);
      expect(done.end_reason).toBe('oom_killed');
      expect((await h().sessions(id)).map((s) => [s.kind, s.end_reason])).toEqual([['compute', 'oom_killed']]);
      expect(containerState(name)).toBe('gone');
    });
  },
});
