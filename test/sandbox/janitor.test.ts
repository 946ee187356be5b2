/**
 * The janitor on the real Temporal test server: a running objective's unmerged work is never
 * touched; an ended objective's worktrees and stream branches go (unmerged ones after the grace
 * period); the integration branch stays. And `slipway schedules install` (idempotent) runs it.
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { diskImagePath, isMountPoint, mountNewDisk } from '../../activities/sandbox/disk';
import { readRegistry, registerObjective, registryPath, updateRegistry } from '../../activities/sandbox/registry';
import { temporalHomeOf } from '../../activities/sandbox/janitor';
import { loadObjectiveFile } from '../../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../../core/ids';
import { janitorScheduleId } from '../../cli/commands/schedules';
import { janitorWorkflow } from '../../workflows/janitor';
import { objectiveWorkflow } from '../../workflows/objective';
import { streamStatusQuery } from '../../workflows/stream';
import { slipway, waitFor } from '../helpers/cli';
import { PLAN_BUILDER, helperFiles, writeObjective, type Plan } from '../helpers/objective';
import { gitIn, makeDemoRepo, pictureCheckout, tempDir } from '../helpers/repo';
import { startTestWorker, type TestWorker } from '../helpers/temporal';

let worker: TestWorker;
let home: string;
beforeAll(async () => {
  home = tempDir('slipway-home-');
  process.env.SLIPWAY_HOME = home;
  worker = await startTestWorker();
});
afterAll(async () => {
  await worker?.stop();
  await fs.rm(home, { recursive: true, force: true });
});

const builder = { provider: 'script', command: `node ${PLAN_BUILDER}` };
const branches = (repo: string, id: string) => gitIn(repo, 'branch', '--list', '--format=%(refname:short)', `slipway/${id}/*`).split('\n').filter(Boolean).sort();
const worktrees = (repo: string) => gitIn(repo, 'worktree', 'list', '--porcelain').split('\n').filter((l) => l.startsWith('worktree ')).map((l) => l.slice(9));

async function start(repo: string, id: string, spec: Record<string, unknown>, plan: Plan) {
  const file = writeObjective({ repository: repo, agents: { builder }, ...spec }, plan);
  const input = await loadObjectiveFile(file, { id });
  return worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
}

const sweep = (repo: string, keepUnmergedForMs?: number) =>
  worker.client.workflow.execute(janitorWorkflow, {
    taskQueue: worker.taskQueue,
    workflowId: `janitor-test-${Date.now()}`,
    args: [{ repositories: [repo], ...(keepUnmergedForMs !== undefined ? { keepUnmergedForMs } : {}) }],
  });

describe('janitor', () => {
  it("keeps a running objective's unmerged work, removes an ended objective's leftovers, keeps its result", async () => {
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);

    // A running objective: its stream committed work, failed its gate and waits for a human.
    const live = await start(
      repo,
      'live-obj',
      { objective: 'blocks for guidance', max_fix_iterations: 0, on_exhausted: 'ask_human', gates: [{ name: 'test', command: 'node --test' }], streams: [{ id: 'stuck', task: 'x' }] },
      { stuck: [{ files: helperFiles('stuck', '(x) => x', 'assert.strictEqual(1, 2)') }] },
    );
    await waitFor(async () => (await worker.client.workflow.getHandle(streamWorkflowId('live-obj', 'stuck')).query(streamStatusQuery)).phase === 'blocked', 'the live stream to block');
    const liveHead = gitIn(repo, 'rev-parse', 'slipway/live-obj/stuck');
    const liveWorktree = path.join(repo, '.slipway/worktrees/live-obj/stuck');
    expect(existsSync(liveWorktree)).toBe(true);

    // An ended objective: one stream merged, one failed with unmerged commits; plus a worktree a crash left behind.
    const ended = await start(
      repo,
      'ended-obj',
      { objective: 'partial', max_fix_iterations: 0, on_exhausted: 'fail', gates: [{ name: 'test', command: 'node --test' }], streams: [{ id: 'good', task: 'x' }, { id: 'bad', task: 'y' }] },
      { good: [{ files: helperFiles('good') }], bad: [{ files: helperFiles('bad', '(x) => x', 'assert.strictEqual(1, 2)') }] },
    );
    expect((await ended.result()).outcome).toBe('partial');
    const ghost = path.join(repo, '.slipway/worktrees/ended-obj/ghost');
    // On a disk of its own (disk_mb), and beside it the image of a sandbox whose folder is gone.
    const ghostDisk = diskImagePath(repo, 'ended-obj', 'ghost');
    await mountNewDisk(ghostDisk, ghost, 16 * 1024 * 1024);
    const orphanDisk = diskImagePath(repo, 'ended-obj', 'orphan');
    await fs.writeFile(orphanDisk, '');
    // A builder session the stream carried (activities/agents/session-carry.ts), and one of the live objective.
    const endedSession = path.join(repo, '.slipway/agent-sessions/ended-obj/good/claude-code/s1/-w/s1.jsonl');
    const liveSession = path.join(repo, '.slipway/agent-sessions/live-obj/a/claude-code/s2/-w/s2.jsonl');
    for (const f of [endedSession, liveSession]) {
      await fs.mkdir(path.dirname(f), { recursive: true });
      await fs.writeFile(f, '{}\n');
    }
    gitIn(repo, 'worktree', 'add', '-q', '-b', 'slipway/ended-obj/ghost', ghost, 'main');
    await fs.writeFile(path.join(ghost, 'ghost.txt'), 'left behind\n');
    gitIn(ghost, 'add', 'ghost.txt');
    gitIn(ghost, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q', '-m', 'ghost work');
    expect(branches(repo, 'ended-obj')).toEqual(['slipway/ended-obj/bad', 'slipway/ended-obj/ghost', 'slipway/ended-obj/good', 'slipway/ended-obj/integration']);
    const registered = await readRegistry(registryPath());
    expect(Object.keys(registered.repositories[repo].objectives).sort()).toEqual(['ended-obj', 'live-obj']);

    // First sweep, default grace: merged leftovers go, unmerged ones wait.
    const first = await sweep(repo);
    expect(first.errors).toEqual([]);
    const byId = Object.fromEntries(first.repositories[0].objectives.map((o) => [o.id, o]));
    expect(byId['live-obj'].liveness).toEqual({ state: 'running' });
    expect(byId['ended-obj'].liveness).toMatchObject({ state: 'ended', status: 'completed' });
    expect(byId['ended-obj'].removedWorktrees).toEqual([ghost]);
    expect(byId['ended-obj'].removedBranches).toEqual(['slipway/ended-obj/good']);
    expect(byId['ended-obj'].keptBranches.map((k) => k.branch)).toEqual(['slipway/ended-obj/bad', 'slipway/ended-obj/ghost']);
    expect(existsSync(ghost)).toBe(false);
    expect(existsSync(path.join(repo, '.slipway/agent-sessions/ended-obj'))).toBe(false);
    expect(existsSync(liveSession)).toBe(true);
    expect(await isMountPoint(ghost)).toBe(false);
    expect(existsSync(ghostDisk) || existsSync(orphanDisk)).toBe(false);
    expect(branches(repo, 'ended-obj')).toEqual(['slipway/ended-obj/bad', 'slipway/ended-obj/ghost', 'slipway/ended-obj/integration']);

    // Second sweep without grace: the ended objective's stream branches go; its integration branch (the result) stays.
    const second = await sweep(repo, 0);
    const ended2 = second.repositories[0].objectives.find((o) => o.id === 'ended-obj')!;
    expect(ended2.removedBranches.sort()).toEqual(['slipway/ended-obj/bad', 'slipway/ended-obj/ghost']);
    expect(ended2.forgotten).toBe(true);
    expect(branches(repo, 'ended-obj')).toEqual(['slipway/ended-obj/integration']);
    expect(gitIn(repo, 'cat-file', '-t', `${integrationBranch('ended-obj')}:src/good.js`)).toBe('blob');
    expect(existsSync(path.join(repo, '.slipway/worktrees/ended-obj'))).toBe(false);
    expect(existsSync(path.join(repo, '.slipway/sandboxes/ended-obj'))).toBe(false);

    // The running objective was never touched, even without grace.
    expect(gitIn(repo, 'rev-parse', 'slipway/live-obj/stuck')).toBe(liveHead);
    expect(gitIn(repo, 'cat-file', '-t', `${liveHead}:src/stuck.js`)).toBe('blob');
    expect(worktrees(repo)).toContain(liveWorktree);
    expect(worktrees(repo)).toContain(path.join(repo, '.slipway/worktrees/live-obj/_merge'));
    expect(branches(repo, 'live-obj')).toEqual(['slipway/live-obj/integration', 'slipway/live-obj/stuck']);
    expect(Object.keys((await readRegistry(registryPath())).repositories[repo].objectives)).toEqual(['live-obj']);

    // Once it has ended (cancelled here: it cleans up its own worktrees), its leftover branches go too.
    await live.cancel();
    expect((await live.result()).outcome).toBe('cancelled');
    expect(existsSync(liveWorktree)).toBe(false);
    const third = await sweep(repo, 0);
    const live3 = third.repositories[0].objectives.find((o) => o.id === 'live-obj')!;
    expect(live3.liveness).toMatchObject({ state: 'ended', status: 'completed' });
    expect(live3.removedWorktrees).toEqual([]);
    expect(live3.removedBranches).toEqual(['slipway/live-obj/stuck']);
    expect(branches(repo, 'live-obj')).toEqual(['slipway/live-obj/integration']);
    expect(worktrees(repo)).toEqual([repo]);
    expect(pictureCheckout(repo)).toEqual(before);
  });

  it("sweeps only its own cluster's objectives; a vanished one keeps unmerged work for the grace period from registration; removals go to the trash", async () => {
    const repo = makeDemoRepo();
    const unmerged = (id: string) => {
      gitIn(repo, 'branch', `slipway/${id}/s1`, 'main');
      const tree = gitIn(repo, 'rev-parse', 'main^{tree}');
      const commit = gitIn(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit-tree', tree, '-p', 'main', '-m', `${id} work`);
      gitIn(repo, 'update-ref', `refs/heads/slipway/${id}/s1`, commit);
      return commit;
    };
    const mine = await temporalHomeOf(worker.client)();
    expect(mine.cluster).not.toBe('');
    const twoHoursAgo = new Date(Date.now() - 2 * 3600_000).toISOString();
    const commits = { gone: unmerged('gone-obj'), foreign: unmerged('foreign-obj'), legacy: unmerged('legacy-obj') };
    // Registered two hours ago; none of them has a workflow on this server.
    await registerObjective(repo, 'gone-obj', undefined, registryPath(), mine);
    await registerObjective(repo, 'foreign-obj', undefined, registryPath(), { cluster: 'another-cluster', namespace: mine.namespace });
    await registerObjective(repo, 'legacy-obj', undefined, registryPath());
    await updateRegistry((r) => {
      for (const o of Object.values(r.repositories[repo].objectives)) o.addedAt = twoHoursAgo;
    });

    // Default grace (a day): the vanished objective's unmerged work stays (counted from its registration, not from 1970).
    const first = await sweep(repo);
    const byId = Object.fromEntries(first.repositories[0].objectives.map((o) => [o.id, o]));
    expect(byId['gone-obj'].liveness).toMatchObject({ state: 'ended', status: 'not_found' });
    expect(byId['gone-obj'].removedBranches).toEqual([]);
    expect(byId['gone-obj'].keptBranches.map((k) => k.branch)).toEqual(['slipway/gone-obj/s1']);
    expect(byId['foreign-obj'].liveness).toMatchObject({ state: 'unknown', reason: expect.stringContaining('another-cluster') });
    expect(byId['legacy-obj'].liveness).toMatchObject({ state: 'unknown', reason: expect.stringContaining('without its Temporal cluster') });

    // A grace of one hour has passed since registration: the work goes, into the trash refs.
    const second = await sweep(repo, 3600_000);
    const gone = second.repositories[0].objectives.find((o) => o.id === 'gone-obj')!;
    expect(gone.removedBranches).toEqual(['slipway/gone-obj/s1']);
    expect(branches(repo, 'gone-obj')).toEqual([]);
    const trash = gitIn(repo, 'for-each-ref', '--format=%(refname) %(objectname)', 'refs/slipway-trash/').split('\n').filter(Boolean);
    expect(trash).toHaveLength(1);
    expect(trash[0]).toMatch(new RegExp(`^refs/slipway-trash/slipway/gone-obj/s1/\\d+ ${commits.gone}$`));
    // Other servers' objectives and unkeyed ones are never swept, whatever the grace.
    expect(gitIn(repo, 'rev-parse', 'slipway/foreign-obj/s1')).toBe(commits.foreign);
    expect(gitIn(repo, 'rev-parse', 'slipway/legacy-obj/s1')).toBe(commits.legacy);

    // Trash refs expire after their keep time.
    const third = await worker.client.workflow.execute(janitorWorkflow, {
      taskQueue: worker.taskQueue,
      workflowId: `janitor-test-${Date.now()}`,
      args: [{ repositories: [repo], keepTrashForMs: 0 }],
    });
    expect(third.repositories[0].trashRefsExpired).toBe(1);
    expect(gitIn(repo, 'for-each-ref', 'refs/slipway-trash/')).toBe('');
  });

  it("removes the sandbox of a running objective's stream terminated by hand, and only that one (ADR 0032)", async () => {
    const repo = makeDemoRepo();
    const id = 'half-obj';
    // Two streams that fail their gate and wait for a human: the objective keeps running.
    const live = await start(
      repo,
      id,
      { objective: 'blocks for guidance', max_fix_iterations: 0, on_exhausted: 'ask_human', gates: [{ name: 'test', command: 'node --test' }], streams: [{ id: 'kept', task: 'x' }, { id: 'gone', task: 'y' }] },
      { kept: [{ files: helperFiles('kept', '(x) => x', 'assert.strictEqual(1, 2)') }], gone: [{ files: helperFiles('gone', '(x) => x', 'assert.strictEqual(1, 2)') }] },
    );
    for (const s of ['kept', 'gone']) {
      await waitFor(async () => (await worker.client.workflow.getHandle(streamWorkflowId(id, s)).query(streamStatusQuery)).phase === 'blocked', `stream ${s} to block`);
    }
    const kept = path.join(repo, '.slipway/worktrees', id, 'kept');
    const gone = path.join(repo, '.slipway/worktrees', id, 'gone');
    const goneHead = gitIn(repo, 'rev-parse', `slipway/${id}/gone`);
    // Terminated, its cleanup never runs: the stream owns its sandbox, nothing else removes it.
    await worker.client.workflow.getHandle(streamWorkflowId(id, 'gone')).terminate('test: terminated by hand');
    expect(existsSync(gone)).toBe(true);

    const swept = await sweep(repo);
    expect(swept.errors).toEqual([]);
    const half = swept.repositories[0].objectives.find((o) => o.id === id)!;
    expect(half.liveness).toEqual({ state: 'running' });
    expect(half.removedWorktrees).toEqual([gone]);
    expect(existsSync(gone)).toBe(false);
    expect(worktrees(repo)).not.toContain(gone);
    // The live stream, the merger and every branch (the work of the terminated one too) stay.
    expect(worktrees(repo)).toContain(kept);
    expect(worktrees(repo)).toContain(path.join(repo, '.slipway/worktrees', id, '_merge'));
    expect(gitIn(repo, 'rev-parse', `slipway/${id}/gone`)).toBe(goneHead);
    expect((await worker.client.workflow.getHandle(streamWorkflowId(id, 'kept')).query(streamStatusQuery)).phase).toBe('blocked');

    await live.cancel();
    expect((await live.result()).outcome).toBe('cancelled');
    expect(existsSync(kept)).toBe(false);
  });

  it('`slipway schedules install` installs the janitor schedule once (idempotent), and its runs sweep', async () => {
    const env = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue, SLIPWAY_HOME: home };
    const scheduleId = janitorScheduleId(worker.taskQueue);
    try {
      const first = await slipway(['schedules', 'install'], env);
      expect(first.code, first.stderr).toBe(0);
      expect(first.stdout).toContain(`installed schedule ${scheduleId}`);
      const again = await slipway(['schedules', 'install'], env);
      expect(again.code, again.stderr).toBe(0);
      expect(again.stdout).toContain(`updated schedule ${scheduleId}`);
      const listed = await slipway(['schedules', 'list', '--json'], env);
      expect(JSON.parse(listed.stdout).filter((s: { scheduleId: string }) => s.scheduleId === scheduleId)).toHaveLength(1);

      const handle = worker.client.schedule.getHandle(scheduleId);
      const description = await handle.describe();
      expect(description.spec.intervals?.map((i) => Number(i.every))).toEqual([5 * 60_000]);
      expect(description.action).toMatchObject({ type: 'startWorkflow', workflowType: 'janitorWorkflow', taskQueue: worker.taskQueue });
      // A run now, as the schedule would start it every 5 minutes.
      await handle.trigger();
      const run = await waitFor(async () => (await handle.describe()).info.recentActions[0]?.action, 'the schedule to start the janitor', 30_000);
      const result = await worker.client.workflow.getHandle(run.workflow.workflowId, run.workflow.firstExecutionRunId).result();
      expect(result.errors).toEqual([]);
    } finally {
      await slipway(['schedules', 'remove'], env);
    }
    await expect(worker.client.schedule.getHandle(scheduleId).describe()).rejects.toThrow();
  });
});
