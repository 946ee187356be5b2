/**
 * A stream's agent run and its passing gates commit the sandbox's work and collect its head at
 * their end (docs/adr/0034-fewer-round-trips-per-stream.md), instead of a `commitWork` activity
 * after them. Real git, a real confined sandbox and the script agent: what lands on the stream's
 * branch, and that a retried attempt (its worker died after the commit, before reporting) finds
 * the commit it made instead of committing the same work twice.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { MockActivityEnvironment } from '@temporalio/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createActivities } from '../../activities';
import { createAgentActivities, type AgentRunInput, type AgentRunResult } from '../../activities/agents/run-agent';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { scriptAgentInput } from '../helpers/agent-run';
import { gitIn, makeRepo, tempDir } from './helpers';

describe('the commit at the end of a stream step', () => {
  let parent: string;
  let repo: string;
  let box: SandboxHandle;
  const sandboxes = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false });
  const activities = createActivities({ sandboxes });
  const agents = createAgentActivities({ sandboxes });
  const runAgent = async (command: string, extra: Partial<AgentRunInput> = {}): Promise<AgentRunResult> => {
    const input = scriptAgentInput({ command, sandboxPath: box.root, repository: repo, objectiveDir: parent, branch: box.branch }, extra);
    return (await new MockActivityEnvironment().run(agents.runAgent, input)) as AgentRunResult;
  };
  const commits = () => gitIn(repo, 'rev-list', '--count', `main..${box.branch}`);
  /** The sandbox's own view (confined: its private git state, not the repository's record of the worktree). */
  const status = async () => (await sandboxes.exec(box, { command: 'git', args: ['status', '--porcelain', '--untracked-files=all'] })).stdout.trim();

  beforeAll(async () => {
    parent = tempDir('commit-in-step');
    ({ repo } = makeRepo(parent));
    box = await sandboxes.create({ sandboxId: 's', repository: repo, group: 'obj', name: 'one', branch: 'slipway/obj/one', base: 'main' });
  });
  afterAll(async () => {
    await fs.rm(parent, { recursive: true, force: true });
  });

  it("an agent run with `commit` commits what the agent left, and the stream's branch in the repository is its head", async () => {
    const run = await runAgent('cat > /dev/null; echo one > one.txt', { commit: { message: 'slipway(one): iteration 1\n\ntask' } });
    expect(run.commit?.committed).toBe(true);
    expect(gitIn(repo, 'rev-parse', box.branch)).toBe(run.commit!.head);
    expect(gitIn(repo, 'log', '-1', '--format=%B', box.branch)).toBe('slipway(one): iteration 1\n\ntask');
    expect(gitIn(repo, 'show', `${run.commit!.head}:one.txt`)).toBe('one');
    expect(commits()).toBe('1');
    expect(await status()).toBe('');
  });

  it('a retried attempt of that run (its worker died after the commit) finds the commit: the same head, no second commit', async () => {
    const before = gitIn(repo, 'rev-parse', box.branch);
    const again = await runAgent('cat > /dev/null; echo one > one.txt', { commit: { message: 'slipway(one): iteration 1\n\ntask' } });
    expect(again.commit).toEqual({ head: before, committed: false });
    expect(commits()).toBe('1');
  });

  it('an agent that commits its own work: nothing left to commit, its commit is collected as the head', async () => {
    const run = await runAgent('cat > /dev/null; echo two > two.txt; git add -A; git -c user.name=a -c user.email=a@a commit -qm "agent made this"', { commit: { message: 'unused' } });
    expect(run.commit?.committed).toBe(false);
    expect(gitIn(repo, 'rev-parse', box.branch)).toBe(run.commit!.head);
    expect(gitIn(repo, 'log', '-1', '--format=%s', box.branch)).toBe('agent made this');
  });

  it('without `commit` (the planner, a stream before this change) the run commits nothing and reports no head', async () => {
    const tip = gitIn(repo, 'rev-parse', box.branch);
    const run = await runAgent('cat > /dev/null; echo three > three.txt');
    expect(run.commit).toBeUndefined();
    expect(gitIn(repo, 'rev-parse', box.branch)).toBe(tip);
    expect(await status()).toBe('?? three.txt');
  });

  it('a failed agent run commits nothing: the step fails and the next run or commit takes the tree as it is', async () => {
    const tip = gitIn(repo, 'rev-parse', box.branch);
    await expect(runAgent('cat > /dev/null; echo four > four.txt; exit 3', { commit: { message: 'never' } })).rejects.toThrow(/exited with 3/);
    expect(gitIn(repo, 'rev-parse', box.branch)).toBe(tip);
    expect(await status()).toContain('?? four.txt');
  });

  it('a commit that fails at the end of a run or of passing gates does not fail them (no retry runs the agent or the gates again): no head is reported, the stream commits', async () => {
    const tip = gitIn(repo, 'rev-parse', box.branch);
    // An embedded repository without a commit: `git add -A` refuses it.
    try {
      const run = await runAgent('cat > /dev/null; mkdir -p nest && git -C nest init -q && echo y > nest/f', { commit: { message: 'never' } });
      expect(run.exitCode).toBe(0);
      expect(run.commit).toBeUndefined();
      const gates = (await new MockActivityEnvironment().run(activities.runGates, { path: box.root, gates: [{ name: 'yes', command: 'true', timeout_seconds: 60 }], commit: { message: 'never' } })) as Awaited<ReturnType<typeof activities.runGates>>;
      expect(gates.passed).toBe(true);
      expect(gates.commit).toBeUndefined();
      expect(gitIn(repo, 'rev-parse', box.branch)).toBe(tip);
    } finally {
      await sandboxes.exec(box, { command: 'rm', args: ['-rf', 'nest'] });
    }
  });

  it('gates with `commit` commit the leftovers only when they all pass; without it (post-merge gates) they touch nothing', async () => {
    const tip = gitIn(repo, 'rev-parse', box.branch);
    const failing = await activities.runGates({ path: box.root, gates: [{ name: 'no', command: 'false', timeout_seconds: 60 }], commit: { message: 'never' } });
    expect(failing.passed).toBe(false);
    expect(failing.commit).toBeUndefined();
    expect(gitIn(repo, 'rev-parse', box.branch)).toBe(tip);

    const plain = await activities.runGates({ path: box.root, gates: [{ name: 'yes', command: 'true', timeout_seconds: 60 }] });
    expect(plain.passed).toBe(true);
    expect(plain.commit).toBeUndefined();
    expect(await status()).not.toBe('');

    const passing = await activities.runGates({ path: box.root, gates: [{ name: 'yes', command: 'echo built > built.txt', timeout_seconds: 60 }], commit: { message: 'slipway(one): left after the gates (iteration 1)' } });
    expect(passing.passed).toBe(true);
    expect(passing.commit?.committed).toBe(true);
    expect(gitIn(repo, 'rev-parse', box.branch)).toBe(passing.commit!.head);
    expect(gitIn(repo, 'show', '--format=%s', '--name-only', passing.commit!.head).split('\n').filter(Boolean).sort()).toEqual(
      ['built.txt', 'four.txt', 'slipway(one): left after the gates (iteration 1)', 'three.txt'].sort(),
    );
    expect(await status()).toBe('');
  });
});
