/**
 * Git locks left by a killed git (a worker SIGKILLed mid-commit) are removed when provably stale,
 * never while a live process holds them or when they could be another path; and Slipway's git
 * activities heartbeat while they work, so a slow one is not retried while it still runs.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { promises as fs, writeFileSync } from 'node:fs';
import path from 'node:path';
import { MockActivityEnvironment } from '@temporalio/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createActivities } from '../activities';
import type { GateRunResult } from '../activities';
import { createAgentActivities, type AgentRunResult } from '../activities/agents/run-agent';
import { clearStaleGitLocks } from '../activities/git-locks';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import type { SandboxHandle, SandboxProvider } from '../activities/sandbox/provider';
import { ContainerSandboxProvider } from '../activities/sandbox/container';
import { locateWorktree, sandboxGitDir } from '../activities/sandbox/sandbox-git';
import { scriptAgentInput } from './helpers/agent-run';
import { gitIn, makeRepo, tempDir, waitFor } from './sandbox/helpers';

const old = async (file: string) => {
  const past = new Date(Date.now() - 60_000);
  await fs.utimes(file, past, past);
};

describe('clearStaleGitLocks', () => {
  let dir: string;
  let holder: ChildProcess | undefined;
  beforeAll(() => {
    dir = tempDir('locks');
  });
  afterAll(async () => {
    holder?.kill('SIGKILL');
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('removes old unheld locks, keeps held, young, linked and unrelated files', async () => {
    const git = path.join(dir, 'git');
    await fs.mkdir(path.join(git, 'refs', 'heads', 'slipway', 'o'), { recursive: true });
    const stale = path.join(git, 'index.lock');
    const staleRef = path.join(git, 'refs', 'heads', 'slipway', 'o', 'one.lock');
    const held = path.join(git, 'HEAD.lock');
    const young = path.join(git, 'config.lock');
    const outsideTarget = path.join(dir, 'precious.lock');
    const linked = path.join(git, 'packed-refs.lock');
    const unrelated = path.join(git, 'index');
    for (const f of [stale, staleRef, held, young, outsideTarget, unrelated]) writeFileSync(f, 'x');
    await fs.symlink(outsideTarget, linked);
    for (const f of [stale, staleRef, held, outsideTarget, unrelated]) await old(f);
    // A live process holds HEAD.lock open, as git does while it works.
    holder = spawn('sh', ['-c', 'exec 3<"$0"; echo ready; exec sleep 1000', held], { stdio: ['ignore', 'pipe', 'ignore'] });
    await new Promise<void>((resolve) => holder!.stdout!.once('data', () => resolve()));

    const removed = await clearStaleGitLocks({ top: [git], tree: [path.join(git, 'refs')] });
    expect(removed.sort()).toEqual([stale, staleRef].sort());
    const present = async (f: string) => fs.lstat(f).then(() => true, () => false);
    expect(await present(held)).toBe(true);
    expect(await present(young)).toBe(true);
    expect(await present(linked)).toBe(true);
    expect(await present(outsideTarget)).toBe(true);
    expect(await present(unrelated)).toBe(true);

    // Once nobody holds it, the same lock goes.
    holder.kill('SIGKILL');
    await new Promise((r) => holder!.once('exit', r));
    expect(await clearStaleGitLocks({ top: [git] })).toEqual([held]);
  });

  it('finds nothing to do in folders that do not exist', async () => {
    expect(await clearStaleGitLocks({ top: [path.join(dir, 'none')], tree: [path.join(dir, 'none2')] })).toEqual([]);
  });
});

describe('git activities after a worker died holding git locks', () => {
  let parent: string;
  let repo: string;
  let merger: SandboxHandle;
  let stream: SandboxHandle;
  const sandboxes = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false });
  const activities = createActivities({ sandboxes });

  beforeAll(async () => {
    parent = tempDir('stale-locks');
    ({ repo } = makeRepo(parent));
    merger = await sandboxes.create({ sandboxId: 'm', repository: repo, group: 'obj', name: '_merge', branch: 'slipway/obj/integration', base: 'main' });
    stream = await sandboxes.create({ sandboxId: 's', repository: repo, group: 'obj', name: 'one', branch: 'slipway/obj/one', base: 'main' });
  });
  afterAll(async () => {
    await fs.rm(parent, { recursive: true, force: true });
  });

  it('commits in a confined sandbox whose private index.lock and branch lock were left behind', async () => {
    // The private git folder exists once something ran in the sandbox.
    expect((await sandboxes.exec(stream, { command: 'git', args: ['status', '--short'] })).exitCode).toBe(0);
    const loc = await locateWorktree(repo, stream.root);
    const own = sandboxGitDir(repo, loc.worktree);
    const records = await fs.readdir(path.join(own, 'worktrees'));
    expect(records).toHaveLength(1);
    const indexLock = path.join(own, 'worktrees', records[0]!, 'index.lock');
    const refLock = path.join(own, 'refs', 'heads', 'slipway', 'obj', 'one.lock');
    await fs.mkdir(path.dirname(refLock), { recursive: true });
    for (const f of [indexLock, refLock]) {
      writeFileSync(f, '');
      await old(f);
    }
    await fs.writeFile(path.join(stream.root, 'one.txt'), 'one\n');
    const { head, committed } = await activities.commitWork({ path: stream.root, message: 'one' });
    expect(committed).toBe(true);
    expect(gitIn(repo, 'rev-parse', 'slipway/obj/one')).toBe(head);
  });

  it('merges in a merger worktree whose index.lock and integration ref lock were left behind', async () => {
    const head = gitIn(repo, 'rev-parse', 'slipway/obj/one');
    const loc = await locateWorktree(repo, merger.root);
    const indexLock = path.join(loc.adminDir, 'index.lock');
    const refLock = path.join(loc.commonDir, 'refs', 'heads', 'slipway', 'obj', 'integration.lock');
    for (const f of [indexLock, refLock]) {
      writeFileSync(f, '');
      await old(f);
    }
    // The user's own index.lock is theirs: never touched.
    const userLock = path.join(loc.commonDir, 'index.lock');
    writeFileSync(userLock, '');
    await old(userLock);
    const merged = await activities.mergeStream({ mergerPath: merger.root, branch: stream.branch, headCommit: head, message: 'merge one', expectedTip: merger.headCommit });
    expect(merged.status).toBe('merged');
    expect(gitIn(repo, 'rev-parse', 'slipway/obj/integration')).toBe(merged.status === 'merged' ? merged.commit : '');
    expect(await fs.stat(userLock).then(() => true, () => false)).toBe(true);
    await fs.rm(userLock);
  });

  it('heartbeats while a git activity works (a slow one is not retried under a heartbeat timeout)', async () => {
    // The provider's collect waits until the activity has heartbeated twice: the activity only
    // finishes if it heartbeats on its own while it works.
    let beats = 0;
    class SlowCollect extends LocalSandboxProvider {
      override async collect(...args: Parameters<LocalSandboxProvider['collect']>) {
        await waitFor(async () => beats >= 2, 60_000);
        return super.collect(...args);
      }
    }
    const slow = createActivities({ sandboxes: new SlowCollect({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false }) });
    const env = new MockActivityEnvironment();
    env.on('heartbeat', () => {
      beats += 1;
    });
    await fs.writeFile(path.join(stream.root, 'two.txt'), 'two\n');
    const { committed } = (await env.run(slow.commitWork, { path: stream.root, message: 'two' })) as { committed: boolean };
    expect(committed).toBe(true);
    expect(beats).toBeGreaterThanOrEqual(2);
  });
});

// The restart test's CI failure: a worker killed while the script agent ran `git commit` left
// index.lock, and each of the six retries of the agent failed on it ("File exists"). A local
// sandbox is cleared from the host before every run; a container, whose git is inside it, from
// inside in a retried attempt (the one a dead run precedes).
describe.each([
  ['unconfined', () => new LocalSandboxProvider({ backgroundFill: false }), 1],
  ['bubblewrap', () => new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false }), 1],
  ['podman', () => new ContainerSandboxProvider({ engine: 'podman' }), 2],
] as const)('an agent run after a worker died while the agent committed (%s sandbox)', (_kind, make, attempt) => {
  let parent: string;
  let repo: string;
  let box: SandboxHandle;
  const sandboxes: SandboxProvider = make();
  const agents = createAgentActivities({ sandboxes });
  /** Where the sandbox's git keeps its index lock, as the sandbox sees it, left as a killed git leaves it. */
  const plantDeadIndexLock = async () => {
    const lock = await sandboxes.exec(box, { command: '/bin/sh', args: ['-c', 'f=$(git rev-parse --git-path index.lock) && touch -d "@$(( $(date +%s) - 60 ))" "$f" && echo "$f"'] });
    expect(lock.exitCode, lock.stderr).toBe(0);
    return lock;
  };

  beforeAll(async () => {
    parent = tempDir('agent-locks');
    ({ repo } = makeRepo(parent));
    box = await sandboxes.create({ sandboxId: 's', repository: repo, group: 'obj', name: 'one', branch: 'slipway/obj/one', base: 'main' });
  });
  afterAll(async () => {
    await sandboxes.destroy({ repository: repo, root: box.root });
    await fs.rm(parent, { recursive: true, force: true });
  });

  it(`removes the dead git's index.lock (attempt ${attempt}), so the agent's own commit succeeds`, async () => {
    const lock = await plantDeadIndexLock();
    // Without the removal this is exactly the failure: git refuses while the lock exists.
    const blocked = await sandboxes.exec(box, { command: '/bin/sh', args: ['-c', 'echo x > x.txt && git add x.txt'] });
    expect(blocked.exitCode).not.toBe(0);
    expect(blocked.stderr).toContain('index.lock');

    const command = 'cat > /dev/null; echo one > one.txt; git add -A && git -c user.name=a -c user.email=a@a commit -qm "agent commit"';
    const input = scriptAgentInput({ command, sandboxPath: box.root, repository: repo, objectiveDir: parent, branch: box.branch }, { commit: { message: 'unused' } });
    const run = (await new MockActivityEnvironment({ attempt }).run(agents.runAgent, input)) as AgentRunResult;
    expect(run.commit?.committed).toBe(false);
    expect(gitIn(repo, 'log', '-1', '--format=%s', box.branch)).toBe('agent commit');
    expect(gitIn(repo, 'show', `${box.branch}:one.txt`)).toBe('one');
    const left = await sandboxes.exec(box, { command: '/bin/sh', args: ['-c', '[ ! -e "$1" ]', '_', lock.stdout.trim()] });
    expect(left.exitCode).toBe(0);
  });

  it(`and before the gates (attempt ${attempt}): a gate's git killed with its worker does not fail the gate's retry`, async () => {
    await plantDeadIndexLock();
    const gates = [{ name: 'stage', command: 'echo y > y.txt && git add y.txt && git diff --cached --name-only', timeout_seconds: 60 }];
    const result = (await new MockActivityEnvironment({ attempt }).run(createActivities({ sandboxes }).runGates, { path: box.root, gates })) as GateRunResult;
    expect(result.failureReport).toBe('');
    expect(result.passed).toBe(true);
    expect(result.results[0]!.output).toContain('y.txt');
  });
});
