/**
 * The sandbox service's billing database: accounts, tokens, projects, profiles, sandboxes and the
 * append-only billing sessions, as typed functions over SQL. Used by the API (account-scoped
 * reads, creates under the concurrency limit, the exec hot path) and by the workflow's
 * activities (state transitions and session rows, each idempotent).
 */
import { limitsFromResources, parseProfileResources } from '../../core/limits';
import { kubernetesSettingsOf, parseProfileKubernetes } from '../../core/kubernetes';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import {
  SERVICE_DEFAULTS,
  SLOT_HOLDING_STATES,
  type EndReason,
  type GrantRequest,
  type Platform,
  type ProvisioningKind,
  type SandboxPolicy,
  type ServiceProviderKind,
  type SessionKind,
} from '../../core/sandbox-service';
import type { SandboxState } from '../../core/states';
import type { Db, Queryable } from './db';

// ---------------------------------------------------------------------------------------------
// ids and secrets

const BASE32 = 'abcdefghijklmnopqrstuvwxyz234567';
function base32(bytes: Buffer, length: number): string {
  let out = '';
  for (let i = 0; i < length; i++) out += BASE32[bytes[i]! & 31];
  return out;
}
export const newSandboxId = () => `sbx_${base32(randomBytes(20), 20)}`;
export const newId = (prefix: string) => `${prefix}_${base32(randomBytes(16), 16)}`;

export const API_TOKEN_PREFIX = 'slp_';
export const GRANT_TOKEN_PREFIX = 'slpg_';
export const newSecret = (prefix: string) => `${prefix}${randomBytes(32).toString('base64url')}`;
/** Tokens carry 256 random bits, so a plain SHA-256 is the right hash (no salt or KDF needed). */
export const hashToken = (token: string) => createHash('sha256').update(token).digest('hex');

const ts = (ms: number | null | undefined) => (ms === null || ms === undefined ? null : new Date(ms));

// ---------------------------------------------------------------------------------------------
// accounts, tokens, projects

export interface Account {
  id: string;
  name: string;
  sandboxes_enabled: boolean;
  concurrent_limit: number;
  monthly_minutes: number | null;
  created_at: Date;
}

export { ACCOUNT_ID_PATTERN } from '../../core/sandbox-service';

export async function createAccount(
  db: Queryable,
  a: { id: string; name?: string; concurrentLimit?: number; monthlyMinutes?: number | null; sandboxesEnabled?: boolean },
): Promise<Account> {
  const { rows } = await db.query<Account>(
    `INSERT INTO accounts (id, name, concurrent_limit, monthly_minutes, sandboxes_enabled)
     VALUES ($1, $2, $3, $4, $5) RETURNING *`,
    [a.id, a.name ?? a.id, a.concurrentLimit ?? SERVICE_DEFAULTS.concurrentLimit, a.monthlyMinutes ?? null, a.sandboxesEnabled ?? true],
  );
  return rows[0]!;
}

export async function getAccount(db: Queryable, id: string): Promise<Account | undefined> {
  return (await db.query<Account>('SELECT * FROM accounts WHERE id = $1', [id])).rows[0];
}

export async function updateAccount(
  db: Queryable,
  id: string,
  patch: { concurrentLimit?: number; monthlyMinutes?: number | null; sandboxesEnabled?: boolean },
): Promise<Account | undefined> {
  const { rows } = await db.query<Account>(
    `UPDATE accounts SET
       concurrent_limit = coalesce($2, concurrent_limit),
       monthly_minutes = CASE WHEN $3::boolean THEN $4 ELSE monthly_minutes END,
       sandboxes_enabled = coalesce($5, sandboxes_enabled)
     WHERE id = $1 RETURNING *`,
    [id, patch.concurrentLimit ?? null, patch.monthlyMinutes !== undefined, patch.monthlyMinutes ?? null, patch.sandboxesEnabled ?? null],
  );
  return rows[0];
}

export async function createApiToken(
  db: Queryable,
  accountId: string,
  opts: { name?: string; expiresAtMs?: number } = {},
): Promise<{ id: string; token: string; prefix: string }> {
  const token = newSecret(API_TOKEN_PREFIX);
  const id = newId('tok');
  const prefix = token.slice(0, API_TOKEN_PREFIX.length + 6);
  await db.query(
    `INSERT INTO api_tokens (id, account_id, name, token_hash, prefix, expires_at) VALUES ($1, $2, $3, $4, $5, $6)`,
    [id, accountId, opts.name ?? 'default', hashToken(token), prefix, ts(opts.expiresAtMs)],
  );
  return { id, token, prefix };
}

export async function revokeApiToken(db: Queryable, accountId: string, tokenId: string): Promise<boolean> {
  const r = await db.query('UPDATE api_tokens SET revoked_at = now() WHERE id = $1 AND account_id = $2 AND revoked_at IS NULL', [tokenId, accountId]);
  return r.rowCount > 0;
}

export interface Principal {
  accountId: string;
  tokenId: string;
  sandboxesEnabled: boolean;
}

/** The account behind an API token, or undefined (unknown, revoked or expired). */
export async function authenticate(db: Queryable, token: string): Promise<Principal | undefined> {
  const { rows } = await db.query<{ account_id: string; id: string; sandboxes_enabled: boolean }>(
    `SELECT t.account_id, t.id, a.sandboxes_enabled FROM api_tokens t JOIN accounts a ON a.id = t.account_id
     WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())`,
    [hashToken(token)],
  );
  const row = rows[0];
  return row && { accountId: row.account_id, tokenId: row.id, sandboxesEnabled: row.sandboxes_enabled };
}

export async function createProject(db: Queryable, accountId: string, name: string): Promise<{ id: string; name: string }> {
  const { rows } = await db.query<{ id: string; name: string }>(
    'INSERT INTO projects (id, account_id, name) VALUES ($1, $2, $3) RETURNING id, name',
    [randomUUID(), accountId, name],
  );
  return rows[0]!;
}

/** Project ids in `ids` that the account does not own. */
export async function foreignProjects(db: Queryable, accountId: string, ids: string[]): Promise<string[]> {
  if (ids.length === 0) return [];
  const { rows } = await db.query<{ id: string }>('SELECT id::text AS id FROM projects WHERE account_id = $1 AND id = ANY($2::uuid[])', [accountId, ids]);
  const owned = new Set(rows.map((r) => r.id));
  return [...new Set(ids)].filter((id) => !owned.has(id));
}

// ---------------------------------------------------------------------------------------------
// profiles

export interface ProfileRow {
  id: string;
  account_id: string;
  name: string;
  kind: string;
  provider: ServiceProviderKind;
  platform: Platform;
  resources: Record<string, unknown>;
  repository: string;
  base_ref: string;
  copy_ignored: boolean;
  confinement: 'none' | 'bubblewrap';
  network: boolean;
  idle_timeout_seconds: number;
  provisioning_timeout_seconds: number;
  default_deadline_minutes: number;
  max_deadline_minutes: number;
  absolute_cap_minutes: number;
  warm_replicas: number;
  /** A kubernetes profile's `kubernetes:` section as given (checked on insert), or null. */
  kubernetes: Record<string, unknown> | null;
  created_at: Date;
}

export interface ProfileSpec {
  name: string;
  provider?: ServiceProviderKind;
  platform?: Platform;
  resources?: Record<string, unknown>;
  repository: string;
  baseRef?: string;
  copyIgnored?: boolean;
  confinement?: 'none' | 'bubblewrap';
  network?: boolean;
  idleTimeoutSeconds?: number;
  provisioningTimeoutSeconds?: number;
  defaultDeadlineMinutes?: number;
  maxDeadlineMinutes?: number;
  absoluteCapMinutes?: number;
  warmReplicas?: number;
  /** provider: kubernetes only: the pods' settings (ProfileKubernetesSchema; errors name `kubernetes.<field>`). */
  kubernetes?: unknown;
}

export async function createProfile(db: Queryable, accountId: string, p: ProfileSpec): Promise<ProfileRow> {
  const d = SERVICE_DEFAULTS;
  const resources = parseProfileResources(p.resources ?? {});
  if (p.kubernetes !== undefined && p.provider !== 'kubernetes') throw new Error(`kubernetes: applies to provider: kubernetes only, not provider: ${p.provider ?? 'local'}`);
  // Checked here, stored as given: defaults are applied when the policy is read, so they can change with Slipway.
  if (p.kubernetes !== undefined) parseProfileKubernetes(p.kubernetes);
  const { rows } = await db.query<ProfileRow>(
    `INSERT INTO sandbox_profiles (id, account_id, name, provider, platform, resources, repository, base_ref, copy_ignored,
       confinement, network, idle_timeout_seconds, provisioning_timeout_seconds, default_deadline_minutes,
       max_deadline_minutes, absolute_cap_minutes, warm_replicas, kubernetes)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18) RETURNING *`,
    [
      newId('prf'),
      accountId,
      p.name,
      p.provider ?? 'local',
      p.platform ?? 'linux',
      JSON.stringify(resources),
      p.repository,
      p.baseRef ?? 'HEAD',
      p.copyIgnored ?? true,
      p.confinement ?? d.confinement,
      p.network ?? d.network,
      p.idleTimeoutSeconds ?? d.idleTimeoutSeconds,
      p.provisioningTimeoutSeconds ?? d.provisioningTimeoutSeconds,
      p.defaultDeadlineMinutes ?? d.defaultDeadlineMinutes,
      p.maxDeadlineMinutes ?? d.maxDeadlineMinutes,
      p.absoluteCapMinutes ?? d.absoluteCapMinutes,
      p.warmReplicas ?? 0,
      p.kubernetes === undefined ? null : JSON.stringify(p.kubernetes),
    ],
  );
  return rows[0]!;
}

export async function getProfileByName(db: Queryable, accountId: string, name: string): Promise<ProfileRow | undefined> {
  return (await db.query<ProfileRow>('SELECT * FROM sandbox_profiles WHERE account_id = $1 AND name = $2', [accountId, name])).rows[0];
}

export async function getProfile(db: Queryable, id: string): Promise<ProfileRow | undefined> {
  return (await db.query<ProfileRow>('SELECT * FROM sandbox_profiles WHERE id = $1', [id])).rows[0];
}

export async function listProfiles(db: Queryable, accountId?: string): Promise<ProfileRow[]> {
  return accountId
    ? (await db.query<ProfileRow>('SELECT * FROM sandbox_profiles WHERE account_id = $1 ORDER BY name', [accountId])).rows
    : (await db.query<ProfileRow>('SELECT * FROM sandbox_profiles ORDER BY account_id, name')).rows;
}

export function policyFromProfile(p: ProfileRow): SandboxPolicy {
  return {
    profileId: p.id,
    profileName: p.name,
    provider: p.provider,
    platform: p.platform,
    repository: p.repository,
    baseRef: p.base_ref,
    copyIgnored: p.copy_ignored,
    confinement: p.confinement,
    network: p.network,
    ...(limitsFromResources(p.resources) ? { limits: limitsFromResources(p.resources) } : {}),
    idleTimeoutMs: Math.round(p.idle_timeout_seconds * 1000),
    provisioningTimeoutMs: Math.round(p.provisioning_timeout_seconds * 1000),
    absoluteCapMs: Math.round(p.absolute_cap_minutes * 60_000),
    warmReplicas: p.warm_replicas,
    ...(p.provider === 'kubernetes' && p.kubernetes ? { kubernetes: profileKubernetesPolicy(p.kubernetes) } : {}),
  };
}

/** A stored `kubernetes:` section as the policy carries it: the pods' settings (no secrets) and the warm pool. */
function profileKubernetesPolicy(section: unknown): NonNullable<SandboxPolicy['kubernetes']> {
  const { warm_pool, ...rest } = parseProfileKubernetes(section);
  return { settings: kubernetesSettingsOf(rest)!, warmPool: warm_pool };
}

// ---------------------------------------------------------------------------------------------
// sandboxes

export interface SandboxRow {
  id: string;
  account_id: string;
  profile_id: string;
  project_id: string | null;
  platform: Platform;
  provider: ServiceProviderKind;
  status: SandboxState;
  provisioning_kind: ProvisioningKind | null;
  repository: string | null;
  root: string | null;
  branch: string | null;
  snapshot_ref: string | null;
  grants: GrantRequest[];
  created_at: Date;
  ready_at: Date | null;
  suspended_at: Date | null;
  terminated_at: Date | null;
  deadline_at: Date | null;
  deadline_remaining_ms: number | null;
  cap_at: Date;
  last_activity_at: Date;
  end_reason: EndReason | null;
  error: string | null;
  /** The worker that holds it (ADR 0013): a worker id, `any`, or null (made before owners were recorded). */
  owner: string | null;
}

export interface NewSandbox {
  id: string;
  accountId: string;
  profileId: string;
  projectId?: string;
  platform: Platform;
  provider: ServiceProviderKind;
  grants: GrantRequest[];
  createdAtMs: number;
  deadlineAtMs: number;
  capAtMs: number;
}

export type CreateOutcome =
  | { ok: true; sandbox: SandboxRow }
  | { ok: false; reason: 'concurrency_limit'; limit: number; active: number }
  | { ok: false; reason: 'disabled' };

/**
 * Inserts a pending sandbox if the account has a free concurrency slot. The per-account
 * advisory lock makes count-then-insert atomic: parallel creates queue on it, and each sees
 * the rows the ones before it inserted.
 */
export async function insertSandboxWithinLimit(db: Db, s: NewSandbox): Promise<CreateOutcome> {
  return db.transaction(async (tx) => {
    await tx.query(`SELECT pg_advisory_xact_lock(hashtext('slipway.sandbox_slots'), hashtext($1))`, [s.accountId]);
    // FOR SHARE: a disable (UPDATE accounts) waits for this insert or is seen by it, so no sandbox
    // of a disabled account is inserted after the disable's sweep of live sandboxes.
    const { rows } = await tx.query<{ limit: number; active: number; enabled: boolean }>(
      `SELECT a.concurrent_limit AS limit, a.sandboxes_enabled AS enabled,
              (SELECT count(*)::int FROM sandboxes WHERE account_id = a.id AND status = ANY($2)) AS active
       FROM accounts a WHERE a.id = $1 FOR SHARE OF a`,
      [s.accountId, SLOT_HOLDING_STATES],
    );
    const { limit, active, enabled } = rows[0]!;
    if (!enabled) return { ok: false, reason: 'disabled' };
    if (active >= limit) return { ok: false, reason: 'concurrency_limit', limit, active };
    const inserted = await tx.query<SandboxRow>(
      `INSERT INTO sandboxes (id, account_id, profile_id, project_id, platform, provider, status, grants, created_at,
         deadline_at, cap_at, last_activity_at)
       VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, $9, $10, $8) RETURNING *`,
      [s.id, s.accountId, s.profileId, s.projectId ?? null, s.platform, s.provider, JSON.stringify(s.grants), ts(s.createdAtMs), ts(s.deadlineAtMs), ts(s.capAtMs)],
    );
    return { ok: true, sandbox: inserted.rows[0]! };
  });
}

/** One sandbox of one account; another account's sandbox is simply not found. */
export async function getSandbox(db: Queryable, accountId: string, id: string): Promise<SandboxRow | undefined> {
  return (await db.query<SandboxRow>('SELECT * FROM sandboxes WHERE id = $1 AND account_id = $2', [id, accountId])).rows[0];
}

/** Records which worker holds the sandbox (written by the provisioning activity, on the owner). */
export async function setSandboxOwner(db: Queryable, id: string, owner: string | null): Promise<void> {
  await db.query('UPDATE sandboxes SET owner = $2 WHERE id = $1', [id, owner]);
}

export async function getSandboxById(db: Queryable, id: string): Promise<SandboxRow | undefined> {
  return (await db.query<SandboxRow>('SELECT * FROM sandboxes WHERE id = $1', [id])).rows[0];
}

export async function listSandboxes(
  db: Queryable,
  accountId: string,
  opts: { status?: SandboxState[]; limit?: number } = {},
): Promise<SandboxRow[]> {
  const { rows } = await db.query<SandboxRow>(
    `SELECT * FROM sandboxes WHERE account_id = $1 AND ($2::text[] IS NULL OR status = ANY($2))
     ORDER BY created_at DESC, id LIMIT $3`,
    [accountId, opts.status ?? null, opts.limit ?? 100],
  );
  return rows;
}

/**
 * The hot path of every exec and file call: if the sandbox is ready, stamp it active and
 * return it (one statement). Otherwise return its status so the caller can wake it or refuse.
 * An idle claim (status -> suspending) and this stamp exclude each other: whichever lands
 * first wins, so a suspend never starts under a call that was already admitted.
 */
export async function admitActivity(
  db: Queryable,
  accountId: string,
  id: string,
): Promise<{ admitted: true; sandbox: SandboxRow } | { admitted: false; status?: SandboxState }> {
  const { rows } = await db.query<SandboxRow>(
    `UPDATE sandboxes SET last_activity_at = now() WHERE id = $1 AND account_id = $2 AND status = 'ready' RETURNING *`,
    [id, accountId],
  );
  if (rows[0]) return { admitted: true, sandbox: rows[0] };
  const found = await db.query<{ status: SandboxState }>('SELECT status FROM sandboxes WHERE id = $1 AND account_id = $2', [id, accountId]);
  return { admitted: false, status: found.rows[0]?.status };
}

/** Keeps a long call's sandbox from looking idle. */
export async function touchSandbox(db: Queryable, id: string): Promise<void> {
  await db.query(`UPDATE sandboxes SET last_activity_at = greatest(last_activity_at, now()) WHERE id = $1`, [id]);
}

/**
 * The idle detector's claim: ready -> suspending, only if nothing touched the sandbox for
 * `idleMs` (by the database's clock, the same clock admitActivity stamps with).
 */
export async function claimIdle(
  db: Queryable,
  id: string,
  idleMs: number,
): Promise<{ claimed: true } | { claimed: false; status?: SandboxState; idleForMs: number }> {
  const r = await db.query(
    `UPDATE sandboxes SET status = 'suspending'
     WHERE id = $1 AND status = 'ready' AND last_activity_at <= now() - ($2::double precision * interval '1 millisecond')
     RETURNING id`,
    [id, idleMs],
  );
  if (r.rowCount > 0) return { claimed: true };
  const { rows } = await db.query<{ status: SandboxState; idle_for_ms: number }>(
    `SELECT status, greatest(0, extract(epoch FROM now() - last_activity_at) * 1000)::double precision AS idle_for_ms FROM sandboxes WHERE id = $1`,
    [id],
  );
  return { claimed: false, status: rows[0]?.status, idleForMs: rows[0]?.idle_for_ms ?? 0 };
}

// ---------------------------------------------------------------------------------------------
// transitions and sessions

export interface SessionOpen {
  kind: SessionKind;
  seq: number;
  startedAtMs: number;
  provisioningKind?: ProvisioningKind;
}

export interface SessionClose {
  kind: SessionKind;
  seq: number;
  endedAtMs: number;
  reason: EndReason;
}

/** Columns a transition may set; `null` clears, undefined leaves as is. */
export interface TransitionFields {
  readyAtMs?: number;
  suspendedAtMs?: number | null;
  terminatedAtMs?: number;
  deadlineAtMs?: number | null;
  deadlineRemainingMs?: number | null;
  provisioningKind?: ProvisioningKind;
  repository?: string;
  root?: string;
  branch?: string;
  snapshotRef?: string | null;
  endReason?: EndReason;
  error?: string;
  /** Restart the idle clock (the sandbox just became ready). */
  touch?: boolean;
}

export interface BillingTransition {
  sandboxId: string;
  status: SandboxState;
  fields?: TransitionFields;
  close?: SessionClose;
  open?: SessionOpen;
  audit?: { event: string; detail?: Record<string, unknown> };
}

const FIELD_COLUMNS: Record<Exclude<keyof TransitionFields, 'touch'>, { column: string; time?: boolean }> = {
  readyAtMs: { column: 'ready_at', time: true },
  suspendedAtMs: { column: 'suspended_at', time: true },
  terminatedAtMs: { column: 'terminated_at', time: true },
  deadlineAtMs: { column: 'deadline_at', time: true },
  deadlineRemainingMs: { column: 'deadline_remaining_ms' },
  provisioningKind: { column: 'provisioning_kind' },
  repository: { column: 'repository' },
  root: { column: 'root' },
  branch: { column: 'branch' },
  snapshotRef: { column: 'snapshot_ref' },
  endReason: { column: 'end_reason' },
  error: { column: 'error' },
};

/**
 * Records one lifecycle transition in one transaction: the sandbox row, then at most one
 * session close and one session open. Idempotent: sessions are keyed by (sandbox, kind, seq),
 * a close only touches a row still open, and row fields are set to values, never incremented.
 * A terminal row is never moved back to a live state.
 */
export async function recordTransition(db: Db, t: BillingTransition): Promise<void> {
  await db.transaction(async (tx) => {
    const sets = ['status = $2'];
    const params: unknown[] = [t.sandboxId, t.status];
    for (const [key, spec] of Object.entries(FIELD_COLUMNS) as Array<[keyof typeof FIELD_COLUMNS, { column: string; time?: boolean }]>) {
      const value = t.fields?.[key];
      if (value === undefined) continue;
      params.push(spec.time ? ts(value as number | null) : value);
      sets.push(`${spec.column} = $${params.length}`);
    }
    if (t.fields?.touch) sets.push('last_activity_at = now()');
    const terminal = t.status === 'terminated' || t.status === 'failed';
    const { rows } = await tx.query<{ account_id: string; platform: string }>(
      `UPDATE sandboxes SET ${sets.join(', ')} WHERE id = $1 ${terminal ? '' : `AND status NOT IN ('terminated', 'failed')`}
       RETURNING account_id, platform`,
      params,
    );
    const row = rows[0] ?? (await tx.query<{ account_id: string; platform: string }>('SELECT account_id, platform FROM sandboxes WHERE id = $1', [t.sandboxId])).rows[0];
    if (!row) throw new Error(`no sandbox ${t.sandboxId} in the billing database`);
    if (t.close) await closeSession(tx, t.sandboxId, t.close);
    if (t.open) await openSession(tx, { sandboxId: t.sandboxId, accountId: row.account_id, platform: row.platform, ...t.open });
    if (t.audit && rows[0]) {
      await tx.query('INSERT INTO audit_events (account_id, sandbox_id, event, detail) VALUES ($1, $2, $3, $4)', [
        row.account_id,
        t.sandboxId,
        t.audit.event,
        JSON.stringify(t.audit.detail ?? {}),
      ]);
    }
  });
}

export async function openSession(
  db: Queryable,
  s: SessionOpen & { sandboxId: string; accountId: string; platform: string },
): Promise<void> {
  await db.query(
    `INSERT INTO sandbox_sessions (account_id, sandbox_id, kind, seq, platform, provisioning_kind, started_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (sandbox_id, kind, seq) DO NOTHING`,
    [s.accountId, s.sandboxId, s.kind, s.seq, s.platform, s.provisioningKind ?? null, ts(s.startedAtMs)],
  );
}

export async function closeSession(db: Queryable, sandboxId: string, c: SessionClose): Promise<void> {
  // greatest(): an abnormal exit observed a moment before the session's own start (clock
  // granularity) still yields a valid, empty interval.
  await db.query(
    `UPDATE sandbox_sessions SET ended_at = greatest(started_at, $4), end_reason = $5
     WHERE sandbox_id = $1 AND kind = $2 AND seq = $3 AND ended_at IS NULL`,
    [sandboxId, c.kind, c.seq, ts(c.endedAtMs), c.reason],
  );
}

export interface SessionRow {
  id: number;
  account_id: string;
  sandbox_id: string;
  kind: SessionKind;
  seq: number;
  platform: string;
  provisioning_kind: ProvisioningKind | null;
  started_at: Date;
  ended_at: Date | null;
  end_reason: EndReason | null;
}

export async function listSessions(db: Queryable, sandboxId: string): Promise<SessionRow[]> {
  return (await db.query<SessionRow>('SELECT * FROM sandbox_sessions WHERE sandbox_id = $1 ORDER BY started_at, kind, seq', [sandboxId])).rows;
}

/** Sessions still open for sandboxes that are already terminal (should never exist). */
export async function closeOrphanSessions(db: Queryable, sandboxId: string, atMs: number, reason: EndReason): Promise<void> {
  await db.query(
    `UPDATE sandbox_sessions SET ended_at = greatest(started_at, $2), end_reason = $3 WHERE sandbox_id = $1 AND ended_at IS NULL`,
    [sandboxId, ts(atMs), reason],
  );
}

// ---------------------------------------------------------------------------------------------
// usage

export interface UsageLine {
  kind: SessionKind;
  platform: string;
  minutes: number;
  sessions: number;
}

/**
 * A session never closed (a lost billing write) must not bill forever: each kind's interval is
 * clamped to the longest a sandbox can live, the absolute cap.
 */
export const SESSION_CLAMP_MINUTES: Record<SessionKind, number> = {
  compute: SERVICE_DEFAULTS.absoluteCapMinutes,
  snapshot_storage: SERVICE_DEFAULTS.absoluteCapMinutes,
};

export function monthRange(month: string): { start: Date; end: Date } {
  const m = /^(\d{4})-(\d{2})$/.exec(month);
  if (!m || Number(m[2]) < 1 || Number(m[2]) > 12) throw new Error(`month must look like 2026-11, got "${month}"`);
  const start = new Date(Date.UTC(Number(m[1]), Number(m[2]) - 1, 1));
  const end = new Date(Date.UTC(Number(m[1]), Number(m[2]), 1));
  return { start, end };
}

/**
 * Billable minutes of one account in one calendar month (UTC), per session kind and platform,
 * in one query: each session's interval (open ones up to now) clamped per kind and
 * intersected with the month.
 */
export const MONTHLY_USAGE_SQL = `
SELECT kind, platform,
       coalesce(sum(extract(epoch FROM upper(billed) - lower(billed))), 0)::double precision / 60 AS minutes,
       count(*)::int AS sessions
FROM (
  SELECT kind, platform,
         tstzrange(started_at,
                   least(coalesce(ended_at, now()),
                         started_at + (CASE kind WHEN 'compute' THEN $4::double precision ELSE $5::double precision END) * interval '1 minute'))
         * tstzrange($2::timestamptz, $3::timestamptz) AS billed
  FROM sandbox_sessions
  WHERE account_id = $1 AND started_at < $3 AND (ended_at IS NULL OR ended_at > $2)
) s
WHERE NOT isempty(billed)
GROUP BY kind, platform
ORDER BY kind, platform`;

export async function monthlyUsage(db: Queryable, accountId: string, month: string): Promise<UsageLine[]> {
  const { start, end } = monthRange(month);
  const { rows } = await db.query<UsageLine>(MONTHLY_USAGE_SQL, [
    accountId,
    start,
    end,
    SESSION_CLAMP_MINUTES.compute,
    SESSION_CLAMP_MINUTES.snapshot_storage,
  ]);
  return rows;
}

// ---------------------------------------------------------------------------------------------
// grants

export interface MintedGrant {
  id: string;
  projectId: string;
  scopes: string[];
  token: string;
  expiresAt: Date;
}

/**
 * Mints one token per grant and stores its hash. Re-minting for the same (sandbox, idx) — a
 * retried provisioning activity — replaces the earlier token, so there is never a second row
 * and never a live token nobody holds.
 */
export async function mintGrants(db: Db, sandboxId: string, accountId: string, grants: GrantRequest[], expiresAtMs: number): Promise<MintedGrant[]> {
  return db.transaction(async (tx) => {
    const out: MintedGrant[] = [];
    for (const [idx, g] of grants.entries()) {
      const token = newSecret(GRANT_TOKEN_PREFIX);
      const { rows } = await tx.query<{ id: string; expires_at: Date }>(
        `INSERT INTO grant_tokens (id, sandbox_id, account_id, idx, project_id, scopes, token_hash, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (sandbox_id, idx) DO UPDATE SET token_hash = excluded.token_hash, expires_at = excluded.expires_at, revoked_at = NULL
         RETURNING id, expires_at`,
        [newId('grt'), sandboxId, accountId, idx, g.projectId, g.scopes, hashToken(token), ts(expiresAtMs)],
      );
      out.push({ id: rows[0]!.id, projectId: g.projectId, scopes: g.scopes, token, expiresAt: rows[0]!.expires_at });
      await tx.query('INSERT INTO audit_events (account_id, sandbox_id, event, detail) VALUES ($1, $2, $3, $4)', [
        accountId,
        sandboxId,
        'grant_minted',
        JSON.stringify({ grantId: rows[0]!.id, projectId: g.projectId, scopes: g.scopes }),
      ]);
    }
    return out;
  });
}

export async function revokeGrants(db: Queryable, sandboxId: string): Promise<void> {
  await db.query('UPDATE grant_tokens SET revoked_at = now() WHERE sandbox_id = $1 AND revoked_at IS NULL', [sandboxId]);
}

/** Caps live grants at the sandbox's (moved) deadline. */
export async function capGrants(db: Queryable, sandboxId: string, notAfterMs: number): Promise<void> {
  await db.query('UPDATE grant_tokens SET expires_at = least(expires_at, $2) WHERE sandbox_id = $1 AND revoked_at IS NULL', [sandboxId, ts(notAfterMs)]);
}

export async function introspectGrant(
  db: Queryable,
  token: string,
): Promise<{ grantId: string; sandboxId: string; accountId: string; projectId: string; scopes: string[]; expiresAt: Date } | undefined> {
  const { rows } = await db.query<{ id: string; sandbox_id: string; account_id: string; project_id: string; scopes: string[]; expires_at: Date }>(
    `SELECT id, sandbox_id, account_id, project_id::text, scopes, expires_at FROM grant_tokens
     WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > now()`,
    [hashToken(token)],
  );
  const r = rows[0];
  return r && { grantId: r.id, sandboxId: r.sandbox_id, accountId: r.account_id, projectId: r.project_id, scopes: r.scopes, expiresAt: r.expires_at };
}

// ---------------------------------------------------------------------------------------------
// warm pool

export interface WarmRow {
  id: string;
  profile_id: string;
  repository: string;
  root: string;
  branch: string;
  claimed_by: string | null;
}

/**
 * Claims a free warm sandbox of the profile for `sandboxId` (UPDATE ... RETURNING with
 * SKIP LOCKED, so parallel claims never take the same one). A retried claim finds the row it
 * already holds.
 */
export async function claimWarm(db: Queryable, profileId: string, sandboxId: string): Promise<WarmRow | undefined> {
  const mine = await db.query<WarmRow>('SELECT * FROM warm_sandboxes WHERE claimed_by = $1', [sandboxId]);
  if (mine.rows[0]) return mine.rows[0];
  const { rows } = await db.query<WarmRow>(
    `UPDATE warm_sandboxes SET claimed_by = $2, claimed_at = now()
     WHERE id = (SELECT id FROM warm_sandboxes WHERE profile_id = $1 AND claimed_by IS NULL ORDER BY created_at
                 LIMIT 1 FOR UPDATE SKIP LOCKED)
     RETURNING *`,
    [profileId, sandboxId],
  );
  return rows[0];
}

export async function addWarm(db: Queryable, w: Omit<WarmRow, 'claimed_by'>): Promise<void> {
  await db.query('INSERT INTO warm_sandboxes (id, profile_id, repository, root, branch) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING', [
    w.id,
    w.profile_id,
    w.repository,
    w.root,
    w.branch,
  ]);
}

export async function countFreeWarm(db: Queryable, profileId: string): Promise<number> {
  const { rows } = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM warm_sandboxes WHERE profile_id = $1 AND claimed_by IS NULL', [profileId]);
  return rows[0]!.n;
}

export async function dropWarm(db: Queryable, id: string): Promise<void> {
  await db.query('DELETE FROM warm_sandboxes WHERE id = $1', [id]);
}

// ---------------------------------------------------------------------------------------------
// idempotency keys

/** How long a key is remembered. */
export const IDEMPOTENCY_TTL_HOURS = 24;

export interface IdempotencyRow {
  request_hash: string;
  sandbox_id: string | null;
  response: unknown;
}

/**
 * Claims `key` for this request: returns undefined when this request is the first (it must then
 * do the work and, for exec, `finishIdempotent`), or the row of the first request.
 */
export async function claimIdempotencyKey(
  db: Queryable,
  k: { accountId: string; scope: string; key: string; requestHash: string; sandboxId?: string },
): Promise<IdempotencyRow | undefined> {
  await db.query(`DELETE FROM idempotency_keys WHERE created_at < now() - interval '${IDEMPOTENCY_TTL_HOURS} hours'`);
  const inserted = await db.query(
    `INSERT INTO idempotency_keys (account_id, scope, key, request_hash, sandbox_id) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT DO NOTHING RETURNING key`,
    [k.accountId, k.scope, k.key, k.requestHash, k.sandboxId ?? null],
  );
  if (inserted.rows.length > 0) return undefined;
  const { rows } = await db.query<IdempotencyRow>(
    'SELECT request_hash, sandbox_id, response FROM idempotency_keys WHERE account_id = $1 AND scope = $2 AND key = $3',
    [k.accountId, k.scope, k.key],
  );
  return rows[0];
}

export async function finishIdempotent(db: Queryable, k: { accountId: string; scope: string; key: string }, response: unknown): Promise<void> {
  await db.query('UPDATE idempotency_keys SET response = $4 WHERE account_id = $1 AND scope = $2 AND key = $3', [k.accountId, k.scope, k.key, JSON.stringify(response)]);
}

/** A request that failed releases its key, so a retry can do the work. */
export async function releaseIdempotencyKey(db: Queryable, k: { accountId: string; scope: string; key: string }): Promise<void> {
  await db.query('DELETE FROM idempotency_keys WHERE account_id = $1 AND scope = $2 AND key = $3 AND response IS NULL', [k.accountId, k.scope, k.key]);
}

export interface PreviewPortRow {
  port: number;
  opened_at: Date;
}

/** Opens `port` of a sandbox for previews (already open: its row). */
export async function openPreviewPort(db: Queryable, p: { sandboxId: string; accountId: string; port: number }): Promise<PreviewPortRow> {
  const inserted = await db.query<PreviewPortRow>(
    `INSERT INTO preview_ports (sandbox_id, account_id, port) VALUES ($1, $2, $3) ON CONFLICT (sandbox_id, port) WHERE closed_at IS NULL DO NOTHING RETURNING port, opened_at`,
    [p.sandboxId, p.accountId, p.port],
  );
  if (inserted.rows[0]) return inserted.rows[0];
  return (await db.query<PreviewPortRow>('SELECT port, opened_at FROM preview_ports WHERE sandbox_id = $1 AND port = $2 AND closed_at IS NULL', [p.sandboxId, p.port])).rows[0]!;
}

export async function listPreviewPorts(db: Queryable, sandboxId: string): Promise<PreviewPortRow[]> {
  return (await db.query<PreviewPortRow>('SELECT port, opened_at FROM preview_ports WHERE sandbox_id = $1 AND closed_at IS NULL ORDER BY port', [sandboxId])).rows;
}

export async function isPreviewPortOpen(db: Queryable, sandboxId: string, port: number): Promise<boolean> {
  return (await db.query('SELECT 1 FROM preview_ports WHERE sandbox_id = $1 AND port = $2 AND closed_at IS NULL', [sandboxId, port])).rows.length > 0;
}

/** Closes an open port; false when it was not open. */
export async function closePreviewPort(db: Queryable, sandboxId: string, port: number): Promise<boolean> {
  return (await db.query('UPDATE preview_ports SET closed_at = now() WHERE sandbox_id = $1 AND port = $2 AND closed_at IS NULL RETURNING id', [sandboxId, port])).rows.length > 0;
}

export const SSH_TOKEN_PREFIX = 'slps_';
/** An SSH token is also an SSH user name (`ssh TOKEN@host`): lowercase hex after the prefix. */
export const SSH_TOKEN_PATTERN = /^slps_[0-9a-f]{64}$/;

export async function createSshToken(
  db: Queryable,
  t: { accountId: string; sandboxId: string; createdBy: string; expiresAtMs: number },
): Promise<{ id: string; token: string; expiresAt: Date }> {
  const token = `${SSH_TOKEN_PREFIX}${randomBytes(32).toString('hex')}`;
  const id = newId('sst');
  const { rows } = await db.query<{ expires_at: Date }>(
    'INSERT INTO ssh_tokens (id, account_id, sandbox_id, token_hash, created_by, expires_at) VALUES ($1, $2, $3, $4, $5, $6) RETURNING expires_at',
    [id, t.accountId, t.sandboxId, hashToken(token), t.createdBy, new Date(t.expiresAtMs)],
  );
  return { id, token, expiresAt: rows[0]!.expires_at };
}

/** The sandbox a live (unexpired, unrevoked) SSH token opens, with its account; the account must still have sandboxes enabled. */
export async function authenticateSshToken(db: Queryable, token: string): Promise<{ tokenId: string; accountId: string; sandboxId: string } | undefined> {
  if (!SSH_TOKEN_PATTERN.test(token)) return undefined;
  const { rows } = await db.query<{ id: string; account_id: string; sandbox_id: string }>(
    `SELECT t.id, t.account_id, t.sandbox_id FROM ssh_tokens t JOIN accounts a ON a.id = t.account_id
     WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND t.expires_at > now() AND a.sandboxes_enabled`,
    [hashToken(token)],
  );
  const r = rows[0];
  return r && { tokenId: r.id, accountId: r.account_id, sandboxId: r.sandbox_id };
}

export async function listSshTokens(db: Queryable, accountId: string, sandboxId: string): Promise<Array<{ id: string; created_at: Date; expires_at: Date; revoked_at: Date | null }>> {
  return (
    await db.query<{ id: string; created_at: Date; expires_at: Date; revoked_at: Date | null }>(
      'SELECT id, created_at, expires_at, revoked_at FROM ssh_tokens WHERE account_id = $1 AND sandbox_id = $2 ORDER BY created_at',
      [accountId, sandboxId],
    )
  ).rows;
}

export async function revokeSshToken(db: Queryable, accountId: string, sandboxId: string, tokenId: string): Promise<boolean> {
  const r = await db.query('UPDATE ssh_tokens SET revoked_at = now() WHERE id = $1 AND account_id = $2 AND sandbox_id = $3 AND revoked_at IS NULL', [tokenId, accountId, sandboxId]);
  return r.rowCount > 0;
}

/** Whether an SSH token (by id) is still unexpired and unrevoked. */
export async function sshTokenLive(db: Queryable, tokenId: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM ssh_tokens WHERE id = $1 AND revoked_at IS NULL AND expires_at > now()', [tokenId])).rows.length > 0;
}
