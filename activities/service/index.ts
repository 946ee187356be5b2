/**
 * Activities of the sandbox service: billing writes (run as local activities: fast, idempotent),
 * provisioning with warm-pool claims and grant tokens, suspend/restore, destroy, and the
 * reaper's tick. Secrets (grant tokens) are minted and written here, inside the activity, and
 * never returned to the workflow.
 */
import { writeJsonAtomic } from '../../lib/atomic-write';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { Context } from '@temporalio/activity';
import { WorkflowNotFoundError, type Client } from '@temporalio/client';
import {
  GRANTS_FILE,
  SANDBOX_ID_PATTERN,
  serviceSandboxBranch,
  serviceSandboxGroup,
  serviceSandboxWorkflowId,
  WARM_GROUP,
  type EndReason,
  type GrantRequest,
  type ProvisioningKind,
  type SandboxHandleRef,
  type SandboxPolicy,
  type TerminateReason,
} from '../../core/sandbox-service';
import { ANY_OWNER } from '../../core/ids';
import { failure } from '../failures';
import { withHeartbeat } from '../heartbeat';
import { git } from '../../lib/git';
import { localSandboxRoot } from '../sandbox/local';
import type { SandboxHandle } from '../sandbox/provider';
import type { Db } from '../billing/db';
import * as billing from '../billing/records';
import type { ProviderFor } from './providers';
import type { ServiceMetrics } from './metrics';

export interface SandboxServiceActivityDeps {
  db: Db;
  providerFor: ProviderFor;
  /** For the reaper: signals sandbox workflows. */
  client?: Client;
  metrics?: ServiceMetrics;
  /** Provision profiles with `confinement: none` (the operator's opt-in); default: refused. */
  allowUnconfined?: boolean;
  /** This worker's id (SLIPWAY_WORKER_ID): recorded as the owner of the sandboxes it creates (ADR 0013). */
  workerId?: string;
}

export interface ProvisionInput {
  sandboxId: string;
  accountId: string;
  policy: SandboxPolicy;
  grants: GrantRequest[];
  /** Grant tokens expire no later than this (the sandbox's deadline). */
  grantsNotAfterMs: number;
  grantTtlMs: number;
}

export interface ProvisionResult {
  handle: SandboxHandleRef;
  provisioningKind: ProvisioningKind;
  durationMs: number;
  /** The worker that holds it: this worker's id, `any` (a provider any host reaches), or absent (no worker id). */
  owner?: string;
}

export interface ReapResult {
  signalled: Array<{ sandboxId: string; reason: TerminateReason }>;
  closedOrphans: string[];
  /** Worktrees of ended sandboxes left on disk (a create that finished after a timeout). */
  removedLeftovers: string[];
  warmed: number;
}

/** A kubernetes profile's pod settings and warm pods, on a create request (ADR 0029); nothing for other profiles. */
const kubernetesRequest = (policy: SandboxPolicy) => (policy.kubernetes ? { kubernetes: policy.kubernetes.settings, ...(policy.kubernetes.warmPool > 0 ? { warmPool: policy.kubernetes.warmPool } : {}) } : {});

/** Where a service sandbox lives when the warm pool did not supply it. */
export const coldRoot = (policy: SandboxPolicy, accountId: string, sandboxId: string) =>
  localSandboxRoot(policy.repository, serviceSandboxGroup(accountId), sandboxId);

export function createSandboxServiceActivities(deps: SandboxServiceActivityDeps) {
  const { db, providerFor } = deps;

  const writeGrants = async (handle: SandboxHandleRef, input: ProvisionInput) => {
    if (input.grants.length === 0) return;
    const notAfter = Math.min(input.grantsNotAfterMs, Date.now() + input.grantTtlMs);
    const minted = await billing.mintGrants(db, input.sandboxId, input.accountId, input.grants, notAfter);
    const file = path.join(handle.root, GRANTS_FILE);
    await fs.mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    const body = {
      sandbox_id: input.sandboxId,
      grants: minted.map((g) => ({ id: g.id, project_id: g.projectId, scopes: g.scopes, token: g.token, expires_at: g.expiresAt.toISOString() })),
    };
    await writeJsonAtomic(file, body, { mode: 0o600 });
  };

  const claimWarm = async (input: ProvisionInput): Promise<SandboxHandleRef | undefined> => {
    if (input.policy.warmReplicas <= 0) return undefined;
    const warm = await billing.claimWarm(db, input.policy.profileId, input.sandboxId);
    if (!warm) return undefined;
    // Name the branch after the sandbox (cheap: a ref rename) so `git branch` tells the story.
    const branch = serviceSandboxBranch(input.sandboxId);
    const current = await git(warm.root, ['symbolic-ref', '--short', 'HEAD']).catch(() => undefined);
    if (current && current !== branch) await git(warm.root, ['branch', '-m', current, branch]);
    return { provider: input.policy.provider, repository: warm.repository, root: warm.root, branch };
  };

  const replenish = async (policy: SandboxPolicy, accountId: string): Promise<number> => {
    const free = await billing.countFreeWarm(db, policy.profileId);
    let made = 0;
    for (let i = free; i < policy.warmReplicas; i++) {
      const id = billing.newId('warm');
      const provider = providerFor(policy);
      const handle = await provider.create({
        sandboxId: id,
        repository: policy.repository,
        group: WARM_GROUP,
        name: id,
        branch: `slipway/warm/${id}`,
        base: policy.baseRef,
        ...kubernetesRequest(policy),
      });
      await billing.addWarm(db, { id, profile_id: policy.profileId, repository: policy.repository, root: handle.root, branch: handle.branch });
      made++;
    }
    void accountId;
    return made;
  };

  return {
    // --- billing (local activities) ---------------------------------------------------------

    async recordSandboxTransition(t: billing.BillingTransition): Promise<void> {
      await billing.recordTransition(db, t);
      deps.metrics?.transition(t.status);
    },

    async claimIdleSandbox(input: { sandboxId: string; idleMs: number }) {
      return billing.claimIdle(db, input.sandboxId, input.idleMs);
    },

    /** Moves grant expiry to the sandbox's current deadline (it moved after a suspension). */
    async capSandboxGrants(input: { sandboxId: string; notAfterMs: number }): Promise<void> {
      await billing.capGrants(db, input.sandboxId, input.notAfterMs);
    },

    // --- provider work ----------------------------------------------------------------------

    /** Warm-pool claim or cold create, then grants. Idempotent: a retry reuses what exists. */
    async provisionSandbox(input: ProvisionInput): Promise<ProvisionResult> {
      const started = Date.now();
      // The API refuses these already; a workflow started before a restart without the opt-in must not slip through.
      if (input.policy.provider === 'local' && input.policy.confinement === 'none' && !deps.allowUnconfined) {
        throw failure('configuration_error', `profile "${input.policy.profileName}" has confinement "none", which this server refuses (start it with --allow-unconfined to allow)`);
      }
      return withHeartbeat(async (signal) => {
        let handle = await claimWarm(input);
        let provisioningKind: ProvisioningKind = 'warm_hit';
        if (!handle) {
          provisioningKind = 'cold_boot';
          let created: SandboxHandle;
          try {
            created = await providerFor(input.policy).create({
              sandboxId: input.sandboxId,
              repository: input.policy.repository,
              group: serviceSandboxGroup(input.accountId),
              name: input.sandboxId,
              branch: serviceSandboxBranch(input.sandboxId),
              base: input.policy.baseRef,
              copyIgnored: input.policy.copyIgnored,
              ...kubernetesRequest(input.policy),
              // A provisioning timeout or a DELETE cancels the activity; the create stops with it.
              signal,
            });
          } catch (e) {
            throw failure('sandbox_failure', `could not create sandbox ${input.sandboxId}: ${(e as Error).message}`);
          }
          handle = { provider: input.policy.provider, repository: input.policy.repository, root: created.root, branch: created.branch };
        } else if (input.policy.warmReplicas > 0) {
          // Refill in the background; the reaper's tick catches up if this process dies.
          void replenish(input.policy, input.accountId).catch((e) => Context.current().log.warn('warm pool refill failed', { error: String(e) }));
        }
        await writeGrants(handle, input);
        // Recorded here, on the worker that made it, so the API knows where exec and files must run.
        const owner = providerFor(input.policy).hostBound ? deps.workerId : ANY_OWNER;
        await billing.setSandboxOwner(db, input.sandboxId, owner ?? null);
        const durationMs = Date.now() - started;
        deps.metrics?.provisioned(input.policy.platform, provisioningKind, durationMs);
        return { handle, provisioningKind, durationMs, ...(owner ? { owner } : {}) };
      });
    },

    async suspendSandbox(input: { sandboxId: string; handle: SandboxHandleRef; policy: SandboxPolicy }) {
      const provider = providerFor(input.policy);
      if (!provider.suspend) throw failure('configuration_error', `the ${provider.kind} provider cannot suspend sandboxes`);
      const started = Date.now();
      const result = await withHeartbeat(() => provider.suspend!({ root: input.handle.root }, { templateIgnored: input.policy.copyIgnored }));
      deps.metrics?.suspended(Date.now() - started);
      return { snapshotRef: result.snapshotRef, bytes: result.bytes, durationMs: Date.now() - started };
    },

    async restoreSandbox(input: { sandboxId: string; handle: SandboxHandleRef; policy: SandboxPolicy }) {
      const provider = providerFor(input.policy);
      if (!provider.restore) throw failure('configuration_error', `the ${provider.kind} provider cannot restore sandboxes`);
      const started = Date.now();
      try {
        await withHeartbeat(() => provider.restore!({ root: input.handle.root }, { templateIgnored: input.policy.copyIgnored }));
      } catch (e) {
        if ((e as Error).name === 'SnapshotError') throw failure('configuration_error', (e as Error).message);
        throw e;
      }
      deps.metrics?.restored(Date.now() - started);
      return { durationMs: Date.now() - started };
    },

    /** Frees everything the sandbox holds: its directory, its snapshot, its grant tokens. */
    async destroyServiceSandbox(input: { sandboxId: string; accountId: string; policy: SandboxPolicy; handle?: SandboxHandleRef }) {
      const provider = providerFor(input.policy);
      const root = input.handle?.root ?? coldRoot(input.policy, input.accountId, input.sandboxId);
      const repository = input.handle?.repository ?? input.policy.repository;
      await provider.destroy({ repository, root });
      await provider.deleteSnapshot?.({ root });
      await billing.revokeGrants(db, input.sandboxId);
    },

    // --- reaper ------------------------------------------------------------------------------

    /**
     * One tick of the safety net: terminate sandboxes past their deadline or cap (the
     * workflow's timers should have done it already), close the books of sandboxes whose
     * workflow is gone, and refill warm pools.
     */
    async reapSandboxes(input: { orphanGraceMs?: number } = {}): Promise<ReapResult> {
      const client = deps.client;
      if (!client) throw failure('configuration_error', 'the reaper needs a Temporal client');
      const result: ReapResult = { signalled: [], closedOrphans: [], removedLeftovers: [], warmed: 0 };
      const { rows } = await db.query<{ id: string; account_id: string; status: string; reason: TerminateReason | null; age_ms: number }>(
        // A disabled account's sandboxes end too: no tenant keeps running (and billing) after it is turned off.
        `SELECT s.id, s.account_id, s.status,
                CASE WHEN s.cap_at < now() THEN 'absolute_cap'
                     WHEN s.status = 'ready' AND s.deadline_at < now() THEN 'deadline'
                     WHEN NOT a.sandboxes_enabled AND s.status <> 'terminating' THEN 'account_disabled' END AS reason,
                extract(epoch FROM now() - s.created_at) * 1000 AS age_ms
         FROM sandboxes s JOIN accounts a ON a.id = s.account_id WHERE s.status NOT IN ('terminated', 'failed')`,
      );
      const grace = input.orphanGraceMs ?? 60_000;
      for (const row of rows) {
        const handle = client.workflow.getHandle(serviceSandboxWorkflowId(row.id));
        let running = true;
        try {
          running = (await handle.describe()).status.name === 'RUNNING';
        } catch (e) {
          if (!(e instanceof WorkflowNotFoundError)) throw e;
          running = false;
        }
        if (!running) {
          if (row.age_ms < grace) continue; // the API may be between its insert and the workflow start
          const at = Date.now();
          const reason: EndReason = 'orphaned';
          await billing.closeOrphanSessions(db, row.id, at, reason);
          await billing.recordTransition(db, {
            sandboxId: row.id,
            status: row.status === 'pending' ? 'failed' : 'terminated',
            fields: { terminatedAtMs: at, endReason: reason, error: 'the sandbox workflow is not running' },
            audit: { event: 'reaper_closed_orphan' },
          });
          await billing.revokeGrants(db, row.id);
          result.closedOrphans.push(row.id);
          continue;
        }
        if (row.reason) {
          await handle.signal('terminateSandbox', { reason: row.reason });
          result.signalled.push({ sandboxId: row.id, reason: row.reason });
        }
      }
      // Leftovers: service worktrees whose sandbox has ended (or never existed in the billing database).
      const profiles = await billing.listProfiles(db);
      const seen = new Set<string>();
      for (const profile of profiles) {
        const key = `${profile.provider}:${profile.repository}`;
        if (seen.has(key)) continue;
        seen.add(key);
        const provider = providerFor(billing.policyFromProfile(profile));
        // Providers found by label (Kubernetes): objects no record names, and those of sandboxes that
        // ended (past their deadline and closed above, say) whose pod died or outlived them.
        if (provider.sweepOrphans) {
          const swept = await provider
            .sweepOrphans(profile.repository, {
              graceMs: grace,
              isLive: async ({ sandboxId, group, createdAt }) => {
                if (!group.startsWith(serviceSandboxGroup(''))) return true;
                const row = await billing.getSandboxById(db, sandboxId);
                return row ? row.status !== 'terminated' && row.status !== 'failed' : Date.now() - Date.parse(createdAt) < grace;
              },
            })
            .catch(() => [] as string[]);
          result.removedLeftovers.push(...swept);
        }
        const listed = await provider.list(profile.repository).catch(() => []);
        // Every provider keeps an account's sandboxes in `.slipway/<kind>/acct-<account>/<id>` (worktrees,
        // containers, daytona: a remote sandbox found by its labels), so leftovers of each are found alike.
        const slipwayDir = path.join(await fs.realpath(profile.repository).catch(() => profile.repository), '.slipway');
        for (const entry of listed) {
          const id = path.basename(entry.root);
          const group = path.dirname(entry.root);
          if (!path.basename(group).startsWith(serviceSandboxGroup('')) || path.dirname(path.dirname(group)) !== slipwayDir || !SANDBOX_ID_PATTERN.test(id)) continue;
          const row = await billing.getSandboxById(db, id);
          if (row && row.status !== 'terminated' && row.status !== 'failed') continue;
          // A remote sandbox has no folder here: the age of Slipway's record of it stands for it.
          const made = (await fs.stat(entry.root).catch(() => fs.stat(`${entry.root}.json`)).catch(() => undefined))?.mtimeMs ?? 0;
          if (!row && Date.now() - made < grace) continue;
          await provider.destroy({ repository: profile.repository, root: entry.root });
          result.removedLeftovers.push(id);
        }
      }
      for (const profile of profiles) {
        if (profile.warm_replicas > 0) result.warmed += await replenish(billing.policyFromProfile(profile), profile.account_id);
      }
      return result;
    },

    async replenishWarmPool(input: { profileId: string }): Promise<number> {
      const profile = await billing.getProfile(db, input.profileId);
      if (!profile) return 0;
      return replenish(billing.policyFromProfile(profile), profile.account_id);
    },
  };
}

export type SandboxServiceActivities = ReturnType<typeof createSandboxServiceActivities>;
