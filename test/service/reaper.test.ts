/**
 * The reaper: a workflow on a Temporal Schedule, the safety net behind the timers. It ends
 * sandboxes past their deadline within one tick, and closes the books of sandboxes whose
 * workflow is gone.
 */
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { existsSync } from 'node:fs';
import { newSandboxId, recordTransition } from '../../activities/billing/records';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { randomBytes } from 'node:crypto';
import { LEGACY_REAPER_SCHEDULE_ID, reaperScheduleId, sandboxServiceTaskQueue, serviceSandboxBranch, serviceSandboxGroup } from '../../core/sandbox-service';
import { startSandboxServiceHost } from '../../workers/sandbox-service';
import { startServiceHarness, type ServiceHarness } from './harness';

const TICK_MS = 1_000;
let h: ServiceHarness;
beforeAll(async () => {
  h = await startServiceHarness({ reaper: { intervalMs: TICK_MS, orphanGraceMs: 500 } });
});
afterAll(async () => {
  await h?.stop();
});

describe('sandbox reaper on a schedule', () => {
  it("ends a disabled account's sandboxes within a tick, closing their billing", async () => {
    const a = await h.account({ limit: 2 });
    await a.profile({ name: 'p' });
    const { id } = await a.api.create({ profile: 'p' });
    await a.api.get(id, 30);
    await h.database.db.query('UPDATE accounts SET sandboxes_enabled = false WHERE id = $1', [a.id]);
    const until = Date.now() + 15_000;
    let status = '';
    while (Date.now() < until && status !== 'terminated') {
      status = (await h.database.db.query<{ status: string }>('SELECT status FROM sandboxes WHERE id = $1', [id])).rows[0]!.status;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(status).toBe('terminated');
    const sessions = await h.sessions(id);
    expect(sessions.map((s) => [s.kind, s.end_reason])).toEqual([['compute', 'account_disabled']]);
    expect(sessions[0]!.ended_at).not.toBeNull();
  });

  it('is a Temporal Schedule that starts the reaper workflow every tick', async () => {
    const schedule = await h.host.client.schedule.getHandle(`reaper-${h.host.serviceTaskQueue.replace(/-sandboxes$/, '')}`).describe();
    expect(schedule.spec.intervals?.[0]?.every).toBe(TICK_MS);
    expect(schedule.action).toMatchObject({ type: 'startWorkflow', workflowType: 'sandboxReaperWorkflow', taskQueue: h.host.serviceTaskQueue });
  });

  it("keeps one schedule per service task queue, and a start replaces only its own queue's schedule of the shared-id release", async () => {
    // Deployments sharing a namespace used to overwrite one id's target queue (and, with different
    // payload keys, could not even read it at start).
    const client = h.host.client;
    const queue = `svc-${randomBytes(4).toString('hex')}`;
    const legacy = (taskQueue: string) =>
      client.schedule.create({
        scheduleId: LEGACY_REAPER_SCHEDULE_ID,
        spec: { intervals: [{ every: 3_600_000 }] },
        action: { type: 'startWorkflow', workflowType: 'sandboxReaperWorkflow', workflowId: `legacy-${queue}`, taskQueue, args: [{}] },
        state: { paused: true },
      });
    const start = () =>
      startSandboxServiceHost({ db: h.database.db, temporalAddress: inject('temporalAddress'), taskQueue: queue, workflowBundle: { codePath: inject('workflowBundlePath') }, api: false, worker: false, reaper: { intervalMs: 3_600_000 } });
    await client.schedule.getHandle(LEGACY_REAPER_SCHEDULE_ID).delete().catch(() => undefined);
    try {
      await legacy('another-deployment-sandboxes');
      await (await start()).close();
      // Another deployment's schedule stays; this queue has its own.
      expect((await client.schedule.getHandle(LEGACY_REAPER_SCHEDULE_ID).describe()).action).toMatchObject({ taskQueue: 'another-deployment-sandboxes' });
      const own = await client.schedule.getHandle(reaperScheduleId(sandboxServiceTaskQueue(queue))).describe();
      expect(own.action).toMatchObject({ type: 'startWorkflow', taskQueue: sandboxServiceTaskQueue(queue) });
      await client.schedule.getHandle(LEGACY_REAPER_SCHEDULE_ID).delete();
      await legacy(sandboxServiceTaskQueue(queue));
      await (await start()).close();
      await expect(client.schedule.getHandle(LEGACY_REAPER_SCHEDULE_ID).describe()).rejects.toThrow(/not found/i);
    } finally {
      await client.schedule.getHandle(LEGACY_REAPER_SCHEDULE_ID).delete().catch(() => undefined);
      await client.schedule.getHandle(reaperScheduleId(sandboxServiceTaskQueue(queue))).delete().catch(() => undefined);
    }
  });

  it('terminates a sandbox past its deadline within one tick even when its timer has not fired', async () => {
    const a = await h.account();
    await a.profile({ name: 'p' });
    const { id } = await a.api.create({ profile: 'p', deadline_minutes: 60 });
    await a.api.get(id, 30);
    // The timer is an hour away; the billing database says the deadline passed (a clock jump, a lost timer).
    await h.database.db.query(`UPDATE sandboxes SET deadline_at = now() - interval '1 second' WHERE id = $1`, [id]);
    // The reaper's tick (not the hour-away timer) ends it: waited on as a condition.
    const done = await h.waitFor(a.api, id, ['terminated'], 10_000);
    expect(done.end_reason).toBe('deadline');
    expect((await h.sessions(id)).map((s) => [s.kind, s.end_reason])).toEqual([['compute', 'deadline']]);
  });

  it("closes the books of a sandbox whose workflow is gone", async () => {
    const a = await h.account();
    await a.profile({ name: 'p' });
    const { rows } = await h.database.db.query<{ id: string }>('SELECT id FROM sandbox_profiles WHERE account_id = $1', [a.id]);
    const id = newSandboxId();
    const past = Date.now() - 60_000;
    await h.database.db.query(
      `INSERT INTO sandboxes (id, account_id, profile_id, platform, provider, status, created_at, cap_at, last_activity_at, deadline_at)
       VALUES ($1, $2, $3, 'linux', 'local', 'pending', $4, $5, $4, $5)`,
      [id, a.id, rows[0]!.id, new Date(past), new Date(past + 3_600_000)],
    );
    await recordTransition(h.database.db, { sandboxId: id, status: 'ready', open: { kind: 'compute', seq: 1, startedAtMs: past } });
    const done = await h.waitFor(a.api, id, ['terminated', 'failed'], 10_000);
    expect(done).toMatchObject({ status: 'terminated', end_reason: 'orphaned' });
    const [session] = await h.sessions(id);
    expect(session).toMatchObject({ end_reason: 'orphaned' });
    expect(session!.ended_at).not.toBeNull();
  });

  it('removes the worktree of a sandbox that ended but left its directory behind', async () => {
    const a = await h.account();
    await a.profile({ name: 'p' });
    const { rows } = await h.database.db.query<{ id: string }>('SELECT id FROM sandbox_profiles WHERE account_id = $1', [a.id]);
    const id = newSandboxId();
    await h.database.db.query(
      `INSERT INTO sandboxes (id, account_id, profile_id, platform, provider, status, created_at, cap_at, last_activity_at, end_reason)
       VALUES ($1, $2, $3, 'linux', 'local', 'failed', now(), now(), now(), 'provisioning_timeout')`,
      [id, a.id, rows[0]!.id],
    );
    // What a create that finished after its provisioning timeout leaves.
    const stray = await new LocalSandboxProvider().create({ sandboxId: id, repository: h.repo, group: serviceSandboxGroup(a.id), name: id, branch: serviceSandboxBranch(id), base: 'main' });
    expect(existsSync(stray.root)).toBe(true);
    const until = Date.now() + 10_000;
    while (existsSync(stray.root) && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
    expect(existsSync(stray.root)).toBe(false);
  });
});
