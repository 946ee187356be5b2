/**
 * The billing database on real Postgres and on the embedded PGlite: migrations, the concurrency limit
 * under parallel creates, idempotent transition writes, the append-only rule and the monthly
 * usage query.
 */
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectBillingSocket, billingSocketPath, serveBillingSocket } from '../../activities/billing/socket';
import { loadMigrations, migrate } from '../../activities/billing/migrate';
import {
  authenticate,
  claimIdle,
  admitActivity,
  createAccount,
  createApiToken,
  createProfile,
  hashToken,
  insertSandboxWithinLimit,
  listSessions,
  monthlyUsage,
  newSandboxId,
  recordTransition,
  type NewSandbox,
} from '../../activities/billing/records';
import { freshPglite, freshPostgres, type TestDatabase } from './db';

const engines: Array<[string, () => Promise<TestDatabase>]> = [
  ['postgres', freshPostgres],
  ['pglite', freshPglite],
];

describe.each(engines)('billing on %s', (_engine, open) => {
  let t: TestDatabase;
  let profileId: string;
  beforeAll(async () => {
    t = await open();
    await createAccount(t.db, { id: 'acme' });
    await createAccount(t.db, { id: 'wide', concurrentLimit: 3 });
    profileId = (await createProfile(t.db, 'acme', { name: 'linux-small', repository: '/nowhere' })).id;
  });
  afterAll(async () => {
    await t?.drop();
  });

  const sandbox = (accountId: string, extra: Partial<NewSandbox> = {}): NewSandbox => ({
    id: newSandboxId(),
    accountId,
    profileId,
    platform: 'linux',
    provider: 'local',
    grants: [],
    createdAtMs: Date.now(),
    deadlineAtMs: Date.now() + 3_600_000,
    capAtMs: Date.now() + 7 * 86_400_000,
    ...extra,
  });

  it('applies migrations once and records them with checksums', async () => {
    expect(await migrate(t.db)).toEqual([]); // already applied by open()
    const { rows } = await t.db.query<{ version: number; checksum: string }>('SELECT version, checksum FROM slipway_migrations ORDER BY version');
    expect(rows.map((r) => r.version)).toEqual(loadMigrations().map((m) => m.version));
    expect(rows[0]!.checksum).toMatch(/^[0-9a-f]{64}$/);
  });

  it('refuses a migration edited after it was applied', async () => {
    const edited = loadMigrations().map((m) => ({ ...m, checksum: 'x' }));
    await expect(migrate(t.db, edited)).rejects.toThrow(/changed after it was applied/);
  });

  it('stores API tokens hashed and authenticates by hash', async () => {
    const { token } = await createApiToken(t.db, 'acme', { name: 'ci' });
    const stored = await t.db.query<{ token_hash: string }>('SELECT token_hash FROM api_tokens');
    expect(JSON.stringify(stored.rows)).not.toContain(token);
    expect(stored.rows.map((r) => r.token_hash)).toContain(hashToken(token));
    expect(await authenticate(t.db, token)).toMatchObject({ accountId: 'acme', sandboxesEnabled: true });
    expect(await authenticate(t.db, `${token}x`)).toBeUndefined();
  });

  it('admits exactly `limit` sandboxes under parallel creates', async () => {
    const results = await Promise.all(Array.from({ length: 8 }, () => insertSandboxWithinLimit(t.db, sandbox('acme'))));
    expect(results.filter((r) => r.ok)).toHaveLength(1);
    expect(results.filter((r) => !r.ok).every((r) => !r.ok && r.reason === 'concurrency_limit' && r.limit === 1)).toBe(true);
    const wide = await Promise.all(Array.from({ length: 8 }, () => insertSandboxWithinLimit(t.db, sandbox('wide'))));
    expect(wide.filter((r) => r.ok)).toHaveLength(3);
  });

  it("inserts no sandbox for a disabled account, even one whose token was checked before the disable", async () => {
    await createAccount(t.db, { id: 'off-soon', concurrentLimit: 5 });
    expect((await insertSandboxWithinLimit(t.db, sandbox('off-soon'))).ok).toBe(true);
    await t.db.query(`UPDATE accounts SET sandboxes_enabled = false WHERE id = 'off-soon'`);
    expect(await insertSandboxWithinLimit(t.db, sandbox('off-soon'))).toEqual({ ok: false, reason: 'disabled' });
  });

  it('writes each transition once however often it is retried, and keeps sessions append-only', async () => {
    const s = sandbox('wide', { id: newSandboxId() });
    await t.db.query(`UPDATE accounts SET concurrent_limit = 100 WHERE id = 'wide'`);
    expect((await insertSandboxWithinLimit(t.db, s)).ok).toBe(true);
    const readyAt = Date.now();
    const ready = {
      sandboxId: s.id,
      status: 'ready' as const,
      fields: { readyAtMs: readyAt, provisioningKind: 'cold_boot' as const, root: '/r', touch: true },
      open: { kind: 'compute' as const, seq: 1, startedAtMs: readyAt, provisioningKind: 'cold_boot' as const },
    };
    await recordTransition(t.db, ready);
    await recordTransition(t.db, ready); // a retried activity
    expect(await listSessions(t.db, s.id)).toHaveLength(1);

    const suspended = {
      sandboxId: s.id,
      status: 'suspended' as const,
      close: { kind: 'compute' as const, seq: 1, endedAtMs: readyAt + 1_000, reason: 'idle_offload' as const },
      open: { kind: 'snapshot_storage' as const, seq: 1, startedAtMs: readyAt + 1_000 },
    };
    await recordTransition(t.db, suspended);
    await recordTransition(t.db, { ...suspended, close: { ...suspended.close, endedAtMs: readyAt + 5_000 } }); // retried, later clock
    const sessions = await listSessions(t.db, s.id);
    expect(sessions.map((x) => [x.kind, x.seq, x.end_reason])).toEqual([
      ['compute', 1, 'idle_offload'],
      ['snapshot_storage', 1, null],
    ]);
    expect(sessions[0]!.ended_at!.getTime() - readyAt).toBe(1_000); // the first close stands

    await expect(t.db.query('DELETE FROM sandbox_sessions WHERE sandbox_id = $1', [s.id])).rejects.toThrow(/append-only/);
    await expect(t.db.query(`UPDATE sandbox_sessions SET ended_at = now() WHERE sandbox_id = $1 AND kind = 'compute'`, [s.id])).rejects.toThrow(/already closed/);
    await expect(t.db.query(`UPDATE sandbox_sessions SET started_at = now() - interval '1 day' WHERE sandbox_id = $1 AND ended_at IS NULL`, [s.id])).rejects.toThrow(/append-only/);
  });

  it('never moves a terminal sandbox back to a live state', async () => {
    const s = sandbox('wide');
    await insertSandboxWithinLimit(t.db, s);
    await recordTransition(t.db, { sandboxId: s.id, status: 'failed', fields: { endReason: 'provisioning_timeout' } });
    await recordTransition(t.db, { sandboxId: s.id, status: 'ready' }); // a late, stray write
    const { rows } = await t.db.query<{ status: string }>('SELECT status FROM sandboxes WHERE id = $1', [s.id]);
    expect(rows[0]!.status).toBe('failed');
  });

  it('lets activity and the idle claim exclude each other', async () => {
    const s = sandbox('wide');
    await insertSandboxWithinLimit(t.db, s);
    await recordTransition(t.db, { sandboxId: s.id, status: 'ready', fields: { touch: true } });
    expect(await claimIdle(t.db, s.id, 60_000)).toMatchObject({ claimed: false, status: 'ready' });
    await t.db.query(`UPDATE sandboxes SET last_activity_at = now() - interval '2 minutes' WHERE id = $1`, [s.id]);
    expect(await claimIdle(t.db, s.id, 60_000)).toEqual({ claimed: true });
    expect(await admitActivity(t.db, 'wide', s.id)).toEqual({ admitted: false, status: 'suspending' });
    expect(await admitActivity(t.db, 'acme', s.id)).toEqual({ admitted: false, status: undefined }); // another account's
  });

  it('computes monthly minutes per kind in one query, clipped to the month', async () => {
    await createAccount(t.db, { id: 'billing', concurrentLimit: 10 });
    const p = await createProfile(t.db, 'billing', { name: 'p', repository: '/x' });
    const at = (iso: string) => Date.parse(iso);
    const add = async (start: string, end: string | null, kind: 'compute' | 'snapshot_storage', seq: number, id: string) => {
      await t.db.query(
        `INSERT INTO sandboxes (id, account_id, profile_id, platform, provider, status, created_at, cap_at, last_activity_at)
         VALUES ($1, 'billing', $2, 'linux', 'local', 'terminated', $3, $3, $3) ON CONFLICT DO NOTHING`,
        [id, p.id, new Date(at(start))],
      );
      await recordTransition(t.db, { sandboxId: id, status: 'terminated', open: { kind, seq, startedAtMs: at(start) } });
      if (end) await recordTransition(t.db, { sandboxId: id, status: 'terminated', close: { kind, seq, endedAtMs: at(end), reason: 'explicit_delete' } });
    };
    const a = newSandboxId();
    const b = newSandboxId();
    await add('2026-10-31T23:30:00Z', '2026-11-01T00:30:00Z', 'compute', 1, a); // 30 min in November
    await add('2026-11-10T10:00:00Z', '2026-11-10T11:00:00Z', 'snapshot_storage', 1, a); // 60 min storage
    await add('2026-11-10T11:00:00Z', '2026-11-10T11:45:00Z', 'compute', 2, a); // 45 min
    await add('2026-11-30T23:00:00Z', '2026-12-01T02:00:00Z', 'compute', 1, b); // 60 min in November
    const usage = await monthlyUsage(t.db, 'billing', '2026-11');
    expect(usage).toEqual([
      { kind: 'compute', platform: 'linux', minutes: 135, sessions: 3 },
      { kind: 'snapshot_storage', platform: 'linux', minutes: 60, sessions: 1 },
    ]);
    expect(await monthlyUsage(t.db, 'billing', '2026-12')).toEqual([{ kind: 'compute', platform: 'linux', minutes: 120, sessions: 1 }]);
  });
});

describe('billing socket', () => {
  it('refuses a socket path the kernel cannot hold, naming SLIPWAY_HOME, and starts nothing', async () => {
    const t = await freshPglite();
    try {
      const long = path.join(os.tmpdir(), 'x'.repeat(120), 'slipway.sock');
      await expect(serveBillingSocket(t.db, long)).rejects.toThrow(/longer than 107 bytes; choose a shorter SLIPWAY_HOME/);
    } finally {
      await t.drop();
    }
  });

  it('keeps dates, numbers and SQLSTATE codes across the socket, and offers no transactions', async () => {
    const t = await freshPglite();
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lsock-'));
    const served = await serveBillingSocket(t.db, billingSocketPath(dir));
    try {
      const remote = connectBillingSocket(billingSocketPath(dir));
      await createAccount(remote, { id: 'via-socket' });
      const { rows } = await remote.query<{ created_at: Date; concurrent_limit: number }>(`SELECT created_at, concurrent_limit FROM accounts WHERE id = 'via-socket'`);
      expect(rows[0]!.created_at).toBeInstanceOf(Date);
      expect(rows[0]!.concurrent_limit).toBe(1);
      await expect(createAccount(remote, { id: 'via-socket' })).rejects.toMatchObject({ code: '23505' });
      await expect(remote.transaction(async () => 1)).rejects.toThrow(/not available through the billing database socket/);
    } finally {
      await served.close();
      await t.drop();
    }
  });
});
