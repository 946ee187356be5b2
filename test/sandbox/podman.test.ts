/**
 * Container sandboxes on podman (ADR 0012): the provider contract, run for real on this machine
 * (scripts/setup.sh installs podman, writes its containers.conf and builds the image). Fails,
 * never skips, when podman cannot run here.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, promises as fs } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkPodman, containerName, ContainerSandboxProvider, engineEnv } from '../../activities/sandbox/container';
import { BundleRefusedError } from '../../activities/sandbox/git-transport';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { PortUnreachableError } from '../../activities/sandbox/port-relay';
import { SandboxProviders } from '../../activities/sandbox/router';
import { createActivities } from '../../activities';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { describeSandboxContract } from './contract';
import { gitIn, hostileLibrary, makeRepo, OOM_KILL_CONTAINER_SCRIPT, podman, processesHolding, processName, sandboxRequest, tempDir, waitFor } from './helpers';

/** Processes whose command line holds `marker`, looked for inside every Slipway container. */
export async function podmanProcessRunning(marker: string): Promise<boolean> {
  const names = execFileSync('podman', ['ps', '--filter', 'label=slipway.sandbox', '--format', '{{.Names}}'], { env: engineEnv(), encoding: 'utf8' }).split('\n').filter(Boolean);
  for (const name of names) {
    let out = '';
    try {
      out = execFileSync('podman', ['exec', name, '/bin/sh', '-c', 'for d in /proc/[0-9]*; do tr "\\000" " " < $d/cmdline 2>/dev/null; echo; done'], { env: engineEnv(), encoding: 'utf8' });
    } catch {
      continue;
    }
    if (out.includes(marker)) return true;
  }
  return false;
}

describe('podman on this machine', () => {
  it('runs containers from the sandbox image (else: bash scripts/setup.sh)', async () => {
    const check = await checkPodman();
    expect(check.ok, `${check.detail}${check.install ? ` (install: ${check.install})` : ''}`).toBe(true);
  });
});

describeSandboxContract('podman', () => new ContainerSandboxProvider({ engine: 'podman' }), { processRunning: podmanProcessRunning });


/** Containers whose workspace is gone (a suite's temp folder was removed): this file's leftovers. */
function removeOrphanContainers(): void {
  const rows = podman('ps', '-a', '--filter', 'label=slipway.sandbox', '--format', '{{.Names}} {{index .Labels "slipway.root"}}').split('\n').filter(Boolean);
  for (const row of rows) {
    const [name, root] = row.split(' ');
    if (root && !existsSync(root)) podman('rm', '-f', '-t', '0', name);
  }
}
afterAll(removeOrphanContainers);

/** Every file under the repository's git directory with its bytes. */
async function gitDirBytes(repo: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const walk = async (dir: string): Promise<void> => {
    for (const e of await fs.readdir(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) await walk(p);
      else out[path.relative(repo, p)] = (await fs.readFile(p)).toString('base64');
    }
  };
  await walk(path.join(repo, '.git'));
  return out;
}

describe('podman sandboxes: isolation and lifecycle', () => {
  let parent: string;
  let repo: string;
  let second: string;
  const provider = new ContainerSandboxProvider({ engine: 'podman', defaults: { network: false, limits: { pids: 64, memoryBytes: 256 * 1024 ** 2, cpus: 1 } } });
  let handle: SandboxHandle;
  const sh = (command: string, timeoutMs = 60_000) => provider.exec(handle, { command, shell: true, timeoutMs });

  beforeAll(async () => {
    parent = tempDir('podman');
    ({ repo, second } = makeRepo(parent));
    handle = await provider.create(sandboxRequest(repo, 'iso', { group: 'podman' }));
  });

  afterAll(async () => {
    if (handle) await provider.destroy({ repository: repo, root: handle.root });
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('runs with no capabilities, no new privileges, no network and not as a worktree of the repository', async () => {
    const status = await sh('grep -E "^(CapEff|CapPrm|NoNewPrivs)" /proc/self/status');
    expect(status.stdout).toMatch(/CapEff:\s+0000000000000000/);
    expect(status.stdout).toMatch(/CapPrm:\s+0000000000000000/);
    expect(status.stdout).toMatch(/NoNewPrivs:\s+1/);
    const net = await sh('tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " "');
    expect(net.stdout.trim().split('\n')).toEqual(['lo']);
    // The user's repository is nowhere in the container: its own .git is a repository of its own.
    const repoSeen = await sh(`ls '${repo}/.git' 2>&1; git rev-parse --absolute-git-dir`);
    expect(repoSeen.stdout).toContain('No such file');
    expect(repoSeen.stdout.trim().split('\n').pop()).toBe('/workspace/.git');
    expect(gitIn(repo, 'worktree', 'list', '--porcelain')).not.toContain(handle.root);
  });

  // ADR 0027: the engine's client runs on the host, unconfined; the command's environment must not reach it.
  it('the command\'s environment reaches the command only: not podman\'s environment (LD_PRELOAD runs nothing on the host), not any argv', async () => {
    const marker = path.join(parent, 'ran-in-podman');
    const lib = hostileLibrary(parent, marker);
    const secret = `TENANT-SECRET-${process.pid}-${Date.now()}`;
    const value = "multi\nline 'quoted' $HOME `x`";
    const r = await provider.exec(handle, {
      command: 'printf "%s|%s|%s|" "$LD_PRELOAD" "$API_TOKEN" "$ODD"; cat',
      shell: true,
      env: { LD_PRELOAD: lib, LD_AUDIT: lib, API_TOKEN: secret, ODD: value },
      stdin: 'the command\'s own input',
      timeoutMs: 60_000,
    });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toBe(`${lib}|${secret}|${value}|the command's own input`);
    expect(existsSync(marker)).toBe(false);
    // While a command runs: the secret is in no process's argv on the host, nor in the environment of podman or its helpers.
    const stop = new AbortController();
    const running = provider.exec(handle, { command: 'sleep 600; true', shell: true, env: { API_TOKEN: secret }, signal: stop.signal });
    try {
      expect(await waitFor(() => podmanProcessRunning('sleep 600'), 60_000)).toBe(true);
      expect(await processesHolding(secret, 'cmdline')).toEqual([]);
      const holders = await Promise.all((await processesHolding(secret, 'environ')).map(processName));
      expect(holders.filter((n) => /podman|conmon|runc|slirp|setsid/.test(n))).toEqual([]);
    } finally {
      stop.abort();
      await running;
    }
  }, 180_000);

  it('a preview reaches a server inside the container, never the host\'s loopback', async () => {
    // The host listens on the same port number on its loopback: a relay that reached the host
    // would be answered by it.
    let hostConnections = 0;
    const hostServer = net.createServer((c) => {
      hostConnections++;
      c.end('HTTP/1.0 200 OK\r\n\r\nhost');
    });
    await new Promise<void>((resolve) => hostServer.listen(0, '127.0.0.1', resolve));
    const port = (hostServer.address() as net.AddressInfo).port;
    // Nothing listens inside yet: refused, although the host's loopback has that port open.
    await expect(provider.connectPort(handle, port)).rejects.toBeInstanceOf(PortUnreachableError);
    const session = await provider.openSession(handle, {
      command: 'node',
      args: ['-e', `require('http').createServer((q, r) => r.end('inside-' + q.url)).listen(${port}, '127.0.0.1', () => console.log('listening'))`],
    });
    try {
      let out = '';
      session.stdout.on('data', (d: Buffer) => (out += d.toString()));
      expect(await waitFor(async () => out.includes('listening'), 30_000)).toBe(true);
      const stream = await provider.connectPort(handle, port);
      let body = '';
      stream.on('data', (d: Buffer) => (body += d.toString()));
      const closed = new Promise((resolve) => stream.once('close', resolve));
      stream.end('GET /preview HTTP/1.0\r\n\r\n');
      await closed;
      expect(body).toMatch(/^HTTP\/1\.[01] 200/);
      expect(body).toContain('inside-/preview');
      expect(hostConnections).toBe(0);
      await expect(provider.connectPort(handle, 0)).rejects.toThrow(/port must be an integer/);
    } finally {
      session.kill();
      await session.exit;
      await new Promise((resolve) => hostServer.close(resolve));
    }
  });

  it('a sandbox with the network gets a user-mode interface (slirp4netns), not the host\'s', async () => {
    const online = new ContainerSandboxProvider({ engine: 'podman', defaults: { network: true } });
    const box = await online.create(sandboxRequest(repo, 'online', { group: 'podman' }));
    try {
      const net = await online.exec(box, { command: 'tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " "', shell: true });
      expect(net.stdout.trim().split('\n').sort()).toEqual(['lo', 'tap0']);
    } finally {
      await online.destroy({ repository: repo, root: box.root });
    }
  });

  it('holds the pids and memory limits', async () => {
    // 200 short sleeps against a limit of 64 processes: the shell cannot fork them all.
    const fork = await sh('i=0; while [ $i -lt 200 ]; do sleep 2 & i=$((i+1)); done; echo "made $i"');
    expect(fork.stdout).not.toContain('made 200');
    expect(fork.stderr).toMatch(/fork/i);
    // Once the sleeps end (and init reaps them), the sandbox runs commands again.
    const fewProcesses = async () => {
      const r = await sh('ls /proc | grep -c "^[0-9]"');
      return r.exitCode === 0 && Number(r.stdout.trim()) < 10;
    };
    expect(await waitFor(fewProcesses, 30_000)).toBe(true);
    // tail keeps a line with no end in memory: past 256 MiB the kernel kills it.
    const hog = await sh('head -c 600000000 /dev/zero | tail -n 1 >/dev/null; echo "status $?"');
    expect(hog.stdout.trim()).toBe('status 137');
    expect(await waitFor(async () => (await sh('true')).exitCode === 0, 30_000)).toBe(true);
  });

  it('refuses work the agent rewrote so it no longer descends from the base; the repository is untouched', async () => {
    const rewrite = await sh('git checkout -q --orphan other && git -c user.name=a -c user.email=a@a commit -q --allow-empty -m evil && git branch -f ' + handle.branch + ' HEAD && git checkout -q ' + handle.branch);
    expect(rewrite.exitCode, rewrite.stderr).toBe(0);
    const before = await gitDirBytes(repo);
    await expect(provider.collect(handle)).rejects.toBeInstanceOf(BundleRefusedError);
    expect(await gitDirBytes(repo)).toEqual(before);
    expect(gitIn(repo, 'rev-parse', `refs/heads/${handle.branch}`)).toBe(second);
    // A commit the repository has, but behind the sandbox's start, is refused too.
    const first = gitIn(repo, 'rev-parse', 'main~1');
    expect((await sh(`git reset -q --hard ${first}`)).exitCode).toBe(0);
    await expect(provider.collect(handle)).rejects.toThrow(/does not descend/);
    expect(gitIn(repo, 'rev-parse', `refs/heads/${handle.branch}`)).toBe(second);
    // Back on the start, collect works again.
    const back = await sh(`git checkout -q -f ${second} && git checkout -q -B ${handle.branch}`);
    expect(back.exitCode, back.stderr).toBe(0);
    expect((await provider.collect(handle)).head).toBe(second);
  });

  it('a rebuild resets the sandbox onto an integration tip it never had, brought in by bundle, and collects it', async () => {
    // The integration branch moved on in the repository after the sandbox started.
    gitIn(repo, 'checkout', '-q', '-b', 'slipway/podman/integration', 'main');
    await fs.writeFile(path.join(repo, 'merged.txt'), 'merged elsewhere\n');
    gitIn(repo, 'add', 'merged.txt');
    gitIn(repo, 'commit', '-q', '-m', 'another stream merged');
    gitIn(repo, 'checkout', '-q', 'main');
    const tip = gitIn(repo, 'rev-parse', 'slipway/podman/integration');
    expect((await sh(`git cat-file -e ${tip}`)).exitCode).not.toBe(0);
    await provider.writeFile(handle, 'own-work.txt', 'mine');
    expect((await sh('git add -A && git -c user.name=a -c user.email=a@a commit -q -m own')).exitCode).toBe(0);
    const activities = createActivities({ sandboxes: new SandboxProviders(new LocalSandboxProvider(), () => provider) });
    const reset = await activities.resetOntoIntegration({ path: handle.root, onto: 'slipway/podman/integration' });
    expect(reset.head).toBe(tip);
    expect(reset.previousDiff).toContain('own-work.txt');
    expect((await sh('git rev-parse HEAD && git symbolic-ref --short HEAD')).stdout.trim().split('\n')).toEqual([tip, handle.branch]);
    expect(gitIn(repo, 'rev-parse', `refs/heads/${handle.branch}`)).toBe(tip);
    // The sandbox's own branch was never overwritten by the fetched copies.
    expect((await sh('git for-each-ref --format="%(refname)" refs/slipway/upstream/heads')).stdout).toContain('refs/slipway/upstream/heads/main');
  });

  it('suspends (container stopped, workspace kept) and restores', async () => {
    await provider.writeFile(handle, 'kept.txt', 'kept');
    const { snapshotRef } = await provider.suspend!(handle, { templateIgnored: false });
    expect(snapshotRef).toBe(`podman:${containerName(handle.root)}`);
    expect(podman('inspect', '--format', '{{.State.Status}}', containerName(handle.root))).toBe('exited');
    expect(await provider.probe!(handle)).toEqual({ alive: true });
    const head = gitIn(repo, 'rev-parse', `refs/heads/${handle.branch}`);
    expect((await provider.list(repo)).find((s) => s.root === handle.root)?.head).toBe(head);
    const restored = await provider.restore!(handle, { templateIgnored: false });
    expect(restored.head).toBe(head);
    expect((await sh('cat kept.txt')).stdout).toBe('kept');
  });

  it('probe: a container stopped or removed outside Slipway is reported dead with its reason', async () => {
    const other = await provider.create(sandboxRequest(repo, 'probed', { group: 'podman' }));
    expect(await provider.probe!(other)).toEqual({ alive: true });
    podman('kill', containerName(other.root));
    expect(await waitFor(async () => (await provider.probe!(other)).alive === false)).toBe(true);
    expect(await provider.probe!(other)).toMatchObject({ alive: false, reason: 'container_exited' });
    podman('rm', '-f', '-t', '0', containerName(other.root));
    expect(await provider.probe!(other)).toMatchObject({ alive: false, reason: 'container_removed' });
    await provider.destroy({ repository: repo, root: other.root });
  });

  it('probe: a container the kernel\'s OOM killer ended is reported oom_killed, with the kernel\'s line', async () => {
    const small = new ContainerSandboxProvider({ engine: 'podman', defaults: { network: false, limits: { memoryBytes: 32 * 1024 ** 2 } } });
    const box = await small.create(sandboxRequest(repo, 'oom', { group: 'podman' }));
    try {
      expect(await small.probe!(box)).toEqual({ alive: true });
      await small.exec(box, { command: OOM_KILL_CONTAINER_SCRIPT, shell: true, timeoutMs: 60_000 });
      expect(await waitFor(async () => (await small.probe!(box)).alive === false, 30_000)).toBe(true);
      const seen = await small.probe!(box);
      expect(seen).toMatchObject({ alive: false, reason: 'oom_killed' });
      expect(seen.alive === false && seen.detail).toMatch(/oom-kill:.*oom_memcg=/);
      // The engine's monitor drops OOM marker files into its working folder: never the worker's
      // own (a user's checkout) nor the workspace, only the engine folder under SLIPWAY_HOME.
      for (const dir of [process.cwd(), box.root]) for (const marker of ['oom', 'oomKilled']) expect(existsSync(path.join(dir, marker)), path.join(dir, marker)).toBe(false);
    } finally {
      await small.destroy({ repository: repo, root: box.root });
    }
  });
});
