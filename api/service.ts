/**
 * The sandbox service's operations, account-scoped: what REST routes and MCP tools call.
 *
 * Control plane (create, delete, wake) goes through the sandbox workflow; data plane (exec,
 * files) goes straight to the provider after one billing statement that admits the call, so a
 * tight exec loop costs a database round trip, not a workflow round trip. A call that finds
 * the sandbox suspended wakes it (a workflow update) before it is served. A sandbox held by a
 * worker on another host (ADR 0013) is served through that owner instead (workflows/service-call.ts).
 */
import { createHash, randomUUID } from 'node:crypto';
import { existsSync, promises as fs } from 'node:fs';
import type { Client } from '@temporalio/client';
import { WorkflowExecutionAlreadyStartedError, WorkflowFailedError, WorkflowNotFoundError } from '@temporalio/client';
import { ActivityFailure, ApplicationFailure, TimeoutFailure, TimeoutType } from '@temporalio/common';
import { ownerTaskQueue } from '../core/ids';
import { DEFAULT_OWNER_GRACE_SECONDS, REMOTE_OWNER_PAYLOAD_LIMIT_BYTES, serviceCallRoute, type ServiceCallKind } from '../core/routing';
import { openStreamThroughOwner, OwnerStreamSession, readThroughOwner, writeThroughOwner } from './owner-transfer';
import { TunnelSession, tunnelStream, type TunnelBroker } from './owner-tunnel';
import type { TunnelTarget } from '../activities/service/tunnel';
import { writeInput } from './session-relay';
import { sandboxServiceCallWorkflow, type SandboxServiceCall, type SandboxServiceCallResult } from '../workflows/service-call';
import type { OwnerExecResult } from '../activities/service/calls';
import type { Logger } from 'pino';
import {
  GRANTS_FILE,
  SERVICE_DEFAULTS,
  serviceSandboxWorkflowId,
  SANDBOX_ID_PATTERN,
  type ServiceSandboxInput,
} from '../core/sandbox-service';
import type { SandboxState } from '../core/states';
import type { Db, Queryable } from '../activities/billing/db';
import * as billing from '../activities/billing/records';
import { SANDBOX_BASE_ENV, type ProviderFor } from '../activities/service/providers';
import type { ServiceMetrics } from '../activities/service/metrics';
import { NotAFolderError, PathEscapeError, resolveInside } from '../activities/sandbox/paths';
import {
  checkRequestedPath,
  deleteSandboxFile,
  FileTooLargeError,
  listSandboxDir,
  NotRegularFileError,
  openSandboxFile,
  RESERVED_NAMES,
  writeSandboxFile,
  type FileEntry,
  type OpenedFile,
} from '../activities/sandbox/file-io';
import { SandboxProviderError, type SandboxProvider, type SandboxSession, type SessionRequest } from '../activities/sandbox/provider';
import { PortUnreachableError } from '../activities/sandbox/port-relay';
import { DEFAULT_LINK_TTL_SECONDS, PREVIEW_LINK_PARAM, previewHost, signPreviewLink, verifyPreviewLink, type LinkCheck } from '../activities/service/preview';
import type { Duplex } from 'node:stream';
import { serviceSandboxWorkflow, terminateSandboxSignal, wakeSandboxUpdate } from '../workflows/service-sandbox';
import { MAX_LISTED_FILES, type FileList } from './schemas';
import type { CreateSandboxBody, ExecBody, MintSshTokenBody, OpenPortBody, PreviewPortView, SandboxView, SshTokenView } from './schemas';

/**
 * Ends every live sandbox of an account now (`slipway account set --disable`): each sandbox
 * workflow gets the terminate signal and closes its billing as it ends, the same path as a
 * DELETE. A sandbox whose workflow is not running is left to the reaper, which closes its books.
 * Returns the ids signalled.
 */
export async function endAccountSandboxes(db: Queryable, client: Client, accountId: string): Promise<string[]> {
  const { rows } = await db.query<{ id: string }>(
    `SELECT id FROM sandboxes WHERE account_id = $1 AND status NOT IN ('terminating', 'terminated', 'failed') ORDER BY created_at`,
    [accountId],
  );
  const signalled: string[] = [];
  for (const { id } of rows) {
    try {
      await client.workflow.getHandle(serviceSandboxWorkflowId(id)).signal(terminateSandboxSignal, { reason: 'account_disabled' });
      signalled.push(id);
    } catch (e) {
      if (!(e instanceof WorkflowNotFoundError)) throw e;
    }
  }
  return signalled;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly issues?: Array<{ path: string; message: string }>,
    /** Sent as Retry-After (429, 503). */
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

export interface SandboxServiceDeps {
  db: Db;
  client: Client;
  /** The service task queue (sandbox workflows run there). */
  taskQueue: string;
  providerFor: ProviderFor;
  logger: Logger;
  metrics?: ServiceMetrics;
  /** Serve profiles with `confinement: none` (the operator's explicit opt-in; default false). */
  allowUnconfined?: boolean;
  /** Largest file the files API returns (bytes; default DEFAULT_FILE_LIMIT_BYTES). */
  fileLimitBytes?: number;
  /** Execs running at once per account (default DEFAULT_EXEC_CONCURRENCY); more get 429. */
  execConcurrency?: number;
  /** Requests per second per account (token bucket, burst twice that); more get 429 with Retry-After. 0: off. */
  requestsPerSecond?: number;
  /** Preview ports (ADR 0015): the link key and the domain preview origins live under; absent: off. */
  preview?: PreviewSettings;
  /** The SSH broker (ADR 0015): where it listens as clients reach it; absent: off. */
  ssh?: SshSettings;
  /** This host's worker id (ADR 0013): calls on sandboxes another worker holds run on that owner. */
  workerId?: string;
  /** How long a call waits for a remote owner to take it up before a 503 (default DEFAULT_OWNER_GRACE_SECONDS). */
  ownerGraceSeconds?: number;
  /** The client encrypts payloads (SLIPWAY_PAYLOAD_KEY): only then do calls go through a remote owner's history. */
  historyEncrypted?: boolean;
}

export interface SshSettings {
  /** The port clients connect to. */
  port: number;
  /** The host name clients connect to (default: the host of the API request that minted the token). */
  publicHost?: string;
  /** Longest token lifetime a caller may ask for (minutes; default 24 hours). */
  maxTokenMinutes?: number;
}

export const DEFAULT_SSH_TOKEN_MINUTES = 60;
export const DEFAULT_SSH_MAX_TOKEN_MINUTES = 24 * 60;

export interface PreviewSettings {
  /** HMAC key of signed links (`$SLIPWAY_HOME/preview-link.key`). */
  key: Buffer;
  /** Previews are served at `<id>-<port>.<domain>` (default "localhost": browsers resolve it to loopback). */
  domain: string;
}

export const DEFAULT_FILE_LIMIT_BYTES = 64 * 1024 * 1024;
/** Requests per second per account, by default (bursts of twice that pass). */
export const DEFAULT_REQUESTS_PER_SECOND = 50;
export const DEFAULT_EXEC_CONCURRENCY = 8;
/** The files API never touches git's or Slipway's state inside a sandbox (hooks, config, grants). */
const FILES_API = { reservedNames: RESERVED_NAMES };

export type Principal = billing.Principal;

const iso = (d: Date | null) => (d ? d.toISOString() : null);
const LIVE_WAKE_STATES: SandboxState[] = ['suspending', 'suspended', 'restoring'];

export class SandboxService {
  private readonly profiles = new Map<string, billing.ProfileRow>();
  private readonly execsRunning = new Map<string, number>();
  /** Aborted when the host stops: every command still running is killed with it. */
  private readonly stopping = new AbortController();
  private readonly sessionsOpen = new Set<SandboxSession>();
  /** Preview connections: an app may outlive every command (a detached server in a container), and its connection with it. */
  private readonly previewsOpen = new Set<Duplex>();

  constructor(private readonly deps: SandboxServiceDeps) {}

  /**
   * Ends every command this process still runs for a caller (execs, streamed execs, sessions)
   * and cuts every preview connection: the host's last step after its grace, so a stop never
   * waits on a command's own timeout or on an endless response. Their callers get what a kill
   * gives (the exit frame, the result, a cut connection); new ones are refused.
   */
  stopCommands(): void {
    this.stopping.abort();
    for (const session of this.sessionsOpen) session.kill();
    for (const stream of this.previewsOpen) stream.destroy();
  }

  get db(): Db {
    return this.deps.db;
  }

  async authenticate(token: string | undefined): Promise<Principal> {
    if (!token) throw new ApiError(401, 'unauthorized', 'missing bearer token (Authorization: Bearer <token>)');
    // Looked up on every request (one indexed statement), never cached: a revoked token or a
    // disabled account is refused from the next request on, whichever process changed the billing database.
    const principal = await billing.authenticate(this.deps.db, token);
    if (!principal) throw new ApiError(401, 'unauthorized', 'invalid, expired or revoked token');
    if (!principal.sandboxesEnabled) throw new ApiError(403, 'sandboxes_disabled', 'sandboxes are not enabled for this account');
    return principal;
  }

  private async profile(id: string): Promise<billing.ProfileRow> {
    let p = this.profiles.get(id);
    if (!p) {
      p = await billing.getProfile(this.deps.db, id);
      if (!p) throw new ApiError(500, 'internal', `profile ${id} is missing`);
      this.profiles.set(id, p);
    }
    return p;
  }

  async view(row: billing.SandboxRow): Promise<SandboxView> {
    const profile = await this.profile(row.profile_id);
    return {
      id: row.id,
      status: row.status,
      profile: profile.name,
      platform: row.platform,
      project_id: row.project_id,
      provisioning_kind: row.provisioning_kind,
      created_at: row.created_at.toISOString(),
      ready_at: iso(row.ready_at),
      suspended_at: iso(row.suspended_at),
      terminated_at: iso(row.terminated_at),
      deadline_at: iso(row.deadline_at),
      deadline_remaining_seconds: row.deadline_remaining_ms === null ? null : Math.round(row.deadline_remaining_ms / 1000),
      cap_at: row.cap_at.toISOString(),
      end_reason: row.end_reason,
      error: row.error === null ? null : hideHostPaths(row.error, { sandbox: row.root, repository: profile.repository }),
      ssh_endpoint: null,
      grants: row.grants.map((g) => ({ project_id: g.projectId, scopes: g.scopes })),
      grants_file: row.grants.length > 0 ? GRANTS_FILE : null,
    };
  }

  /**
   * Create with an Idempotency-Key: the first request with a key creates; a retry with the same key
   * and body gets that sandbox (`replayed`), with another body a 422. Without a key, a plain create.
   */
  async createIdempotent(principal: Principal, body: CreateSandboxBody, key: string | undefined): Promise<{ view: SandboxView; replayed: boolean }> {
    if (key === undefined) return { view: await this.create(principal, body), replayed: false };
    const scope = { accountId: principal.accountId, scope: 'create', key };
    const requestHash = hashRequest(body);
    const id = billing.newSandboxId();
    const prior = await billing.claimIdempotencyKey(this.deps.db, { ...scope, requestHash, sandboxId: id });
    if (prior) {
      if (prior.request_hash !== requestHash) throw idempotencyKeyReused();
      const view = prior.sandbox_id ? await this.get(principal, prior.sandbox_id).catch(() => undefined) : undefined;
      if (!view) throw new ApiError(409, 'idempotent_request_in_progress', 'a request with this Idempotency-Key is still being served; retry', undefined, 1);
      return { view, replayed: true };
    }
    try {
      return { view: await this.create(principal, body, id), replayed: false };
    } catch (e) {
      await billing.releaseIdempotencyKey(this.deps.db, scope);
      throw e;
    }
  }

  async create(principal: Principal, body: CreateSandboxBody, presetId?: string): Promise<SandboxView> {
    const { db, logger } = this.deps;
    const profile = await billing.getProfileByName(db, principal.accountId, body.profile);
    if (!profile) throw new ApiError(422, 'unknown_profile', `no profile "${body.profile}" in this account`);
    this.requireConfined(profile);
    const deadlineMinutes = body.deadline_minutes ?? profile.default_deadline_minutes;
    if (deadlineMinutes > profile.max_deadline_minutes) {
      throw new ApiError(422, 'deadline_too_long', `deadline_minutes may be at most ${profile.max_deadline_minutes} for profile "${profile.name}"`);
    }
    const foreign = await billing.foreignProjects(db, principal.accountId, body.grants.map((g) => g.project_id));
    if (foreign.length > 0) {
      throw new ApiError(422, 'grant_not_allowed', `grants must name projects of this account; not: ${foreign.join(', ')}`, foreign.map((id) => ({ path: 'grants', message: `project ${id} is not this account's` })));
    }
    const policy = billing.policyFromProfile(profile);
    const id = presetId ?? billing.newSandboxId();
    const createdAtMs = Date.now();
    const deadlineMs = Math.round(deadlineMinutes * 60_000);
    const grants = body.grants.map((g) => ({ projectId: g.project_id, scopes: g.scopes }));
    const outcome = await billing.insertSandboxWithinLimit(db, {
      id,
      accountId: principal.accountId,
      profileId: profile.id,
      projectId: body.project_id,
      platform: profile.platform,
      provider: profile.provider,
      grants,
      createdAtMs,
      deadlineAtMs: createdAtMs + deadlineMs,
      capAtMs: createdAtMs + policy.absoluteCapMs,
    });
    if (!outcome.ok && outcome.reason === 'disabled') throw new ApiError(403, 'sandboxes_disabled', 'sandboxes are not enabled for this account');
    if (!outcome.ok) {
      throw new ApiError(429, 'concurrency_limit', `this account may have ${outcome.limit} live sandbox${outcome.limit === 1 ? '' : 'es'} at once (${outcome.active} now); delete one first`, undefined, 10);
    }
    const input: ServiceSandboxInput = { sandboxId: id, accountId: principal.accountId, policy, deadlineMs, createdAtMs, grants };
    try {
      await this.deps.client.workflow.start(serviceSandboxWorkflow, {
        workflowId: serviceSandboxWorkflowId(id),
        taskQueue: this.deps.taskQueue,
        args: [input],
        staticSummary: `Sandbox ${id} (${profile.name}) for account ${principal.accountId}`,
      });
    } catch (e) {
      if (!(e instanceof WorkflowExecutionAlreadyStartedError)) {
        await billing.recordTransition(db, { sandboxId: id, status: 'failed', fields: { endReason: 'provisioning_failed', error: `could not start the sandbox workflow: ${(e as Error).message}`, terminatedAtMs: Date.now() } });
        logger.error({ sandboxId: id, err: e }, 'could not start the sandbox workflow');
        throw new ApiError(503, 'unavailable', 'the sandbox could not be started; try again', undefined, 5);
      }
    }
    logger.info({ sandboxId: id, accountId: principal.accountId, profile: profile.name, grants: grants.length, tokenId: principal.tokenId }, 'sandbox created');
    for (const g of grants) {
      logger.info({ sandboxId: id, projectId: g.projectId, scopes: g.scopes, caller: principal.tokenId }, 'sandbox received scopes on project via caller');
    }
    return this.view(outcome.sandbox);
  }

  /** Unconfined tenants own the host: refused unless the operator started the server allowing them. */
  private requireConfined(profile: billing.ProfileRow): void {
    // A container profile is confined by its container (ADR 0012).
    if (profile.provider === 'local' && profile.confinement === 'none' && !this.deps.allowUnconfined) {
      const message = `profile "${profile.name}" has confinement "none", which this server refuses: its commands would run on the host; use a bubblewrap profile (the operator may allow unconfined profiles with \`slipway api --allow-unconfined\`)`;
      throw new ApiError(422, 'unconfined_refused', message, [{ path: 'profile.confinement', message: 'must be "bubblewrap" on this server' }]);
    }
  }

  private async row(principal: Principal, id: string): Promise<billing.SandboxRow> {
    const row = SANDBOX_ID_PATTERN.test(id) ? await billing.getSandbox(this.deps.db, principal.accountId, id) : undefined;
    if (!row) throw new ApiError(404, 'not_found', `no sandbox ${id}`);
    return row;
  }

  async get(principal: Principal, id: string, waitReadyMs = 0): Promise<SandboxView> {
    let row = await this.row(principal, id);
    const until = Date.now() + waitReadyMs;
    if (row.status === 'pending' && waitReadyMs > 0) {
      // The long-poll waits on the sandbox's workflow (an update that returns once it is no longer
      // pending), not on the database; the reads below only catch the billing database up with it.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        this.deps.client.workflow.getHandle(serviceSandboxWorkflowId(id)).executeUpdate(wakeSandboxUpdate).catch(() => undefined),
        new Promise((r) => (timer = setTimeout(r, waitReadyMs))),
      ]).finally(() => clearTimeout(timer));
      row = await this.row(principal, id);
    }
    // Backs off from 20 ms to 1 s between reads: a fast create is seen quickly, and 300 s of
    // long-polling costs a few hundred queries, not tens of thousands.
    let pause = 20;
    while (row.status === 'pending' && Date.now() < until) {
      await new Promise((r) => setTimeout(r, Math.min(pause, Math.max(1, until - Date.now()))));
      pause = Math.min(pause * 2, 1000);
      row = await this.row(principal, id);
    }
    return this.view(row);
  }

  async list(principal: Principal, opts: { status?: SandboxState; limit: number }): Promise<SandboxView[]> {
    const rows = await billing.listSandboxes(this.deps.db, principal.accountId, { status: opts.status ? [opts.status] : undefined, limit: opts.limit });
    return Promise.all(rows.map((r) => this.view(r)));
  }

  async destroy(principal: Principal, id: string): Promise<SandboxView> {
    const row = await this.row(principal, id);
    if (row.status !== 'terminated' && row.status !== 'failed') {
      try {
        await this.deps.client.workflow.getHandle(serviceSandboxWorkflowId(id)).signal(terminateSandboxSignal, { reason: 'explicit_delete' });
      } catch (e) {
        // No workflow (it never started, or it is gone): the reaper closes the books.
        if (!(e instanceof WorkflowNotFoundError)) throw e;
      }
      this.deps.logger.info({ sandboxId: id, accountId: principal.accountId, tokenId: principal.tokenId }, 'sandbox delete requested');
      await this.deps.db.query('INSERT INTO audit_events (account_id, sandbox_id, event, detail) VALUES ($1, $2, $3, $4)', [
        principal.accountId,
        id,
        'delete_requested',
        JSON.stringify({ tokenId: principal.tokenId }),
      ]);
    }
    return this.view(await this.row(principal, id));
  }

  /**
   * The worker to run this call on when it is not this host (ADR 0013, "Sandbox service calls
   * through the owner"); undefined: run it here. Interactive sessions are refused for a remote owner.
   */
  private remoteOwner(row: billing.SandboxRow, call: ServiceCallKind): string | undefined {
    const route = serviceCallRoute({ owner: row.owner ?? undefined, localWorkerId: this.deps.workerId, call, historyEncrypted: this.deps.historyEncrypted === true });
    if (route.kind === 'refuse') throw new ApiError(route.status, route.code, route.message);
    return route.kind === 'owner' ? route.owner : undefined;
  }

  /** Runs one call on the owner (workflows/service-call.ts) and answers its failures as the direct path would. */
  private async onOwner(row: billing.SandboxRow, owner: string, call: SandboxServiceCall, file: string, signal?: AbortSignal): Promise<SandboxServiceCallResult> {
    const graceSeconds = this.deps.ownerGraceSeconds ?? DEFAULT_OWNER_GRACE_SECONDS;
    const handle = await this.startOnOwner(row, owner, call);
    // The caller went away: the command on the owner is cancelled with the call.
    const onAbort = () => void handle.cancel().catch(() => undefined);
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      return await handle.result();
    } catch (e) {
      throw remoteCallError(e, row.id, owner, graceSeconds, file);
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
  }

  /** Starts one call workflow for the owner (its result or updates are the caller's). */
  private async startOnOwner(row: billing.SandboxRow, owner: string, call: SandboxServiceCall) {
    const graceSeconds = this.deps.ownerGraceSeconds ?? DEFAULT_OWNER_GRACE_SECONDS;
    const handle = await this.deps.client.workflow.start(sandboxServiceCallWorkflow, {
      // This process's own queue when it has a worker id (it polls it), else the shared service queue.
      taskQueue: this.deps.workerId ? ownerTaskQueue(this.deps.taskQueue, this.deps.workerId) : this.deps.taskQueue,
      workflowId: `sandbox-call:${row.id}:${randomUUID()}`,
      args: [{ serviceQueue: this.deps.taskQueue, owner, graceSeconds, call }],
    });
    this.deps.logger.info({ sandboxId: row.id, owner, op: call.op, workflowId: handle.workflowId }, 'call on the sandbox owner');
    return handle;
  }

  /**
   * Admits one call on a sandbox: ready -> stamped and returned; suspended (or on its way) ->
   * woken first. Returns a release function that ends the call's keep-alive.
   */
  private async admit(principal: Principal, id: string): Promise<{ row: billing.SandboxRow; provider: SandboxProvider; release: () => void; profile: billing.ProfileRow }> {
    const { db } = this.deps;
    // Malformed ids never reach the database (a NUL byte is a Postgres error, not a 404).
    if (!SANDBOX_ID_PATTERN.test(id)) throw new ApiError(404, 'not_found', `no sandbox ${id}`);
    for (let attempt = 0; attempt < 3; attempt++) {
      const admitted = await billing.admitActivity(db, principal.accountId, id);
      if (admitted.admitted) {
        const row = admitted.sandbox;
        const profile = await this.profile(row.profile_id);
        // A sandbox made while unconfined profiles were allowed is not served once they are not.
        this.requireConfined(profile);
        const policy = billing.policyFromProfile(profile);
        // A call running longer than a third of the idle threshold keeps stamping, so a long
        // build is never suspended under itself; if this process dies, the stamps stop.
        const every = Math.max(250, Math.min(policy.idleTimeoutMs / 3, 30_000));
        const started = Date.now();
        const timer = setInterval(() => void billing.touchSandbox(db, id).catch(() => undefined), every);
        timer.unref();
        return {
          row,
          profile,
          provider: this.deps.providerFor(policy),
          release: () => {
            clearInterval(timer);
            if (Date.now() - started > Math.min(1000, policy.idleTimeoutMs / 10)) void billing.touchSandbox(db, id).catch(() => undefined);
          },
        };
      }
      const status = admitted.status;
      if (status === undefined) throw new ApiError(404, 'not_found', `no sandbox ${id}`);
      if (status === 'pending') throw new ApiError(409, 'not_ready', `sandbox ${id} is still provisioning; wait for ready (GET with wait_ready_seconds)`);
      if (!LIVE_WAKE_STATES.includes(status)) throw new ApiError(409, 'sandbox_ended', `sandbox ${id} is ${status}`);
      let woken: SandboxState;
      try {
        woken = await this.deps.client.workflow.getHandle(serviceSandboxWorkflowId(id)).executeUpdate(wakeSandboxUpdate);
      } catch (e) {
        // The workflow ended between our read and the update (deleted, capped): report its end.
        const now = await billing.getSandbox(db, principal.accountId, id);
        if (now && (now.status === 'terminated' || now.status === 'failed' || now.status === 'terminating')) {
          throw new ApiError(409, 'sandbox_ended', `sandbox ${id} is ${now.status}`);
        }
        this.deps.logger.error({ sandboxId: id, err: e }, 'waking the sandbox failed');
        throw new ApiError(503, 'unavailable', `sandbox ${id} could not be woken; try again`, undefined, 5);
      }
      this.deps.logger.info({ sandboxId: id, state: woken }, 'sandbox woken by activity');
      if (woken !== 'ready') throw new ApiError(409, 'sandbox_ended', `sandbox ${id} is ${woken}`);
    }
    throw new ApiError(503, 'unavailable', `sandbox ${id} did not stay ready; try again`, undefined, 1);
  }

  /** providerCallError, with the provider's own message logged for the operator when the answer is a 5xx (the tenant sees only the kind). */
  private providerCallError(e: unknown, at: Parameters<typeof providerCallError>[1]): unknown {
    const answer = providerCallError(e, at);
    if (answer instanceof ApiError && answer.status >= 500) this.deps.logger.warn({ sandboxId: at.sandboxId, err: e }, 'the sandbox provider failed a call');
    return answer;
  }

  /** Per-account cap on execs running at once: one tenant cannot take every worker slot. */
  private readonly buckets = new Map<string, { tokens: number; at: number }>();

  /**
   * Per-account request rate: a token bucket refilled at `requestsPerSecond`, holding at most twice
   * that. An empty bucket is a 429 whose Retry-After says when the next token comes.
   */
  rateLimit(accountId: string, now = Date.now()): void {
    const rate = this.deps.requestsPerSecond ?? DEFAULT_REQUESTS_PER_SECOND;
    if (rate <= 0) return;
    const burst = rate * 2;
    const bucket = this.buckets.get(accountId) ?? { tokens: burst, at: now };
    bucket.tokens = Math.min(burst, bucket.tokens + ((now - bucket.at) / 1000) * rate);
    bucket.at = now;
    this.buckets.set(accountId, bucket);
    if (bucket.tokens < 1) {
      const retryAfter = Math.max(1, Math.ceil((1 - bucket.tokens) / rate));
      throw new ApiError(429, 'rate_limited', `this account may make ${rate} requests per second; slow down`, undefined, retryAfter);
    }
    bucket.tokens -= 1;
  }

  private claimExecSlot(accountId: string): () => void {
    if (this.stopping.signal.aborted) throw new ApiError(503, 'shutting_down', 'this server is stopping; retry against another or after its restart', undefined, 1);
    const limit = this.deps.execConcurrency ?? DEFAULT_EXEC_CONCURRENCY;
    const running = this.execsRunning.get(accountId) ?? 0;
    if (running >= limit) throw new ApiError(429, 'exec_limit', `this account may run ${limit} exec${limit === 1 ? '' : 's'} at once; wait for one to finish`, undefined, 1);
    this.execsRunning.set(accountId, running + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.execsRunning.get(accountId) ?? 1) - 1;
      if (left <= 0) this.execsRunning.delete(accountId);
      else this.execsRunning.set(accountId, left);
    };
  }

  /** Exec with an Idempotency-Key: a retry gets the first run's answer instead of running again. */
  async execIdempotent(principal: Principal, id: string, body: ExecBody, signal: AbortSignal | undefined, key: string | undefined) {
    if (key === undefined) return { result: await this.exec(principal, id, body, signal), replayed: false };
    if (!SANDBOX_ID_PATTERN.test(id)) return { result: await this.exec(principal, id, body, signal), replayed: false };
    const scope = { accountId: principal.accountId, scope: `exec:${id}`, key };
    const requestHash = hashRequest(body);
    const prior = await billing.claimIdempotencyKey(this.deps.db, { ...scope, requestHash, sandboxId: id });
    if (prior) {
      if (prior.request_hash !== requestHash) throw idempotencyKeyReused();
      if (prior.response === null || prior.response === undefined) {
        throw new ApiError(409, 'idempotent_request_in_progress', 'an exec with this Idempotency-Key is still running; retry', undefined, 1);
      }
      return { result: prior.response as Awaited<ReturnType<SandboxService['exec']>>, replayed: true };
    }
    try {
      const result = await this.exec(principal, id, body, signal);
      await billing.finishIdempotent(this.deps.db, scope, result);
      return { result, replayed: false };
    } catch (e) {
      await billing.releaseIdempotencyKey(this.deps.db, scope);
      throw e;
    }
  }

  /** `signal`: aborted when the caller goes away; the command is killed with it. */
  async exec(principal: Principal, id: string, body: ExecBody, callerGone?: AbortSignal) {
    const releaseSlot = this.claimExecSlot(principal.accountId);
    const signal = callerGone ? AbortSignal.any([callerGone, this.stopping.signal]) : this.stopping.signal;
    const releaseBoth = (release: () => void) => {
      release();
      releaseSlot();
    };
    try {
      const { row, provider, release, profile } = await this.admit(principal, id);
      try {
        const root = row.root!;
        const owner = this.remoteOwner(row, 'exec');
        if (owner !== undefined) {
          const result = await this.onOwner(row, owner, { op: 'exec', input: { root, policy: billing.policyFromProfile(profile), command: body.command, args: body.args, env: execEnv(row, body.env), cwd: body.cwd, stdin: body.stdin, timeoutMs: body.timeout_seconds * 1000 } }, body.cwd ?? '.', signal);
          const run = (result as { exec: OwnerExecResult }).exec;
          this.deps.metrics?.exec(principal.accountId, row.platform, run.durationMs);
          return { exit_code: run.exitCode, stdout: run.stdout, stderr: run.stderr, timed_out: run.timedOut, duration_ms: run.durationMs };
        }
        // A host-bound sandbox is a folder here; a remote one (Daytona) checks cwd inside itself.
        if (body.cwd !== undefined && provider.hostBound) await checkCwd(root, body.cwd);
        const env = execEnv(row, body.env);
        const run = await provider
          .exec(
            { root },
            { command: body.command, args: body.args, env, inheritEnv: false, cwd: body.cwd, stdin: body.stdin, timeoutMs: body.timeout_seconds * 1000, maxCaptureBytes: 4 * 1024 * 1024, signal },
          )
          .catch((e) => {
            throw this.providerCallError(e, { sandboxId: id, root, hostBound: provider.hostBound, cwd: body.cwd });
          });
        this.deps.metrics?.exec(principal.accountId, row.platform, run.durationMs);
        return { exit_code: run.exitCode, stdout: run.stdout, stderr: run.stderr, timed_out: run.timedOut, duration_ms: run.durationMs };
      } finally {
        release();
      }
    } finally {
      releaseSlot();
    }
  }

  /**
   * An interactive session (streaming exec, the WebSocket): admitted as exec is (account, exec
   * slot, wake, cwd, environment), and activity for idle suspend until it ends. The caller ends
   * it (kill) when its client goes away.
   */
  async openSession(principal: Principal, id: string, body: SessionStart, transport: 'stream' | 'websocket'): Promise<SandboxSession> {
    const { session, row, release } = await this.admitSession(
      principal,
      id,
      { command: body.command, args: body.args, env: body.env, cwd: body.cwd, ...(body.pty ? { pty: body.pty } : {}) },
      transport === 'stream' ? { stdin: body.stdin, timeoutMs: body.timeoutMs ?? 0 } : undefined,
    );
    // A streamed exec's input is given whole in its request: written and closed here (a remote owner got it with the start).
    if (transport === 'stream') {
      if (body.stdin && !(session instanceof OwnerStreamSession)) writeInput(session, Buffer.from(body.stdin), { accountId: principal.accountId, metrics: this.deps.metrics });
      session.stdin.end();
    }
    this.deps.metrics?.sessionOpened(principal.accountId, row.platform, transport, session.pty);
    void session.exit.finally(release);
    return session;
  }

  /**
   * One admission for every interactive session (streaming exec, WebSocket, SSH): an exec slot,
   * the sandbox admitted (woken, kept from idling), the owner checked, then the provider's
   * session with the sandbox's environment only. On failure both are freed here; on success
   * `release` frees them. A provider without sessions is a 501 before anything starts.
   */
  private async admitSession(
    principal: Principal,
    id: string,
    req: SessionRequest,
    /** A streamed exec (its whole input, its timeout): on a remote owner it runs through a call workflow unless it wants a terminal; anything else goes over the owner's tunnel. */
    streamed?: { stdin?: string; timeoutMs: number },
  ): Promise<{ session: SandboxSession; row: billing.SandboxRow; release: () => void }> {
    const releaseSlot = this.claimExecSlot(principal.accountId);
    const releaseBoth = (release: () => void) => {
      release();
      releaseSlot();
    };
    try {
      const { row, provider, release, profile } = await this.admit(principal, id);
      try {
        const root = row.root!;
        const owner = this.remoteOwner(row, streamed ? 'stream' : 'session');
        // A terminal needs the tunnel (the call workflow carries plain output only): a streamed exec
        // with a pty takes it too, its whole stdin written and closed there as on this host.
        if (owner !== undefined && streamed && !req.pty) {
          if (streamed.stdin !== undefined && Buffer.byteLength(streamed.stdin) > REMOTE_OWNER_PAYLOAD_LIMIT_BYTES) {
            throw new ApiError(413, 'stdin_too_large', `stdin is over ${REMOTE_OWNER_PAYLOAD_LIMIT_BYTES} bytes, the most a call to a sandbox on another host carries`, [{ path: 'stdin', message: `at most ${REMOTE_OWNER_PAYLOAD_LIMIT_BYTES} bytes` }]);
          }
          const graceSeconds = this.deps.ownerGraceSeconds ?? DEFAULT_OWNER_GRACE_SECONDS;
          const input = { root, policy: billing.policyFromProfile(profile), command: req.command, args: req.args ?? [], env: execEnv(row, req.env ?? {}), cwd: req.cwd, stdin: streamed.stdin, timeoutMs: streamed.timeoutMs };
          const session = await openStreamThroughOwner(
            (call) => this.startOnOwner(row, owner, call),
            async (e) => remoteCallError(e, id, owner, graceSeconds, req.cwd ?? '.'),
            input,
          );
          return { session: this.track(session), row, release: () => releaseBoth(release) };
        }
        if (owner !== undefined) {
          // Interactive: bytes both ways while it runs, over the owner's tunnel (ADR 0028).
          const { ws, whyClosed } = await this.openTunnel(row, owner, billing.policyFromProfile(profile), {
            kind: 'session',
            command: req.command,
            args: req.args ?? [],
            env: execEnv(row, req.env ?? {}),
            ...(req.cwd !== undefined ? { cwd: req.cwd } : {}),
            ...(req.pty ? { pty: req.pty } : {}),
          });
          return { session: this.track(new TunnelSession(ws, req.pty !== undefined, whyClosed)), row, release: () => releaseBoth(release) };
        }
        if (provider.sessions === false) throw new ApiError(501, 'sessions_unsupported', `the ${provider.kind} provider has no interactive sessions`);
        // A host-bound sandbox is a folder here; a remote one (Daytona) checks cwd inside itself.
        if (req.cwd !== undefined && provider.hostBound) await checkCwd(root, req.cwd);
        const session = await provider.openSession({ root }, { ...req, env: execEnv(row, req.env ?? {}), inheritEnv: false }).catch((e: unknown) => {
          throw this.providerCallError(e, { sandboxId: id, root, hostBound: provider.hostBound, cwd: req.cwd });
        });
        return { session: this.track(session), row, release: () => releaseBoth(release) };
      } catch (e) {
        release();
        throw e;
      }
    } catch (e) {
      releaseSlot();
      throw e;
    }
  }

  /** Known to stopCommands until it closes. */
  private trackPreview(stream: Duplex): Duplex {
    this.previewsOpen.add(stream);
    stream.once('close', () => this.previewsOpen.delete(stream));
    if (this.stopping.signal.aborted) stream.destroy(); // opened as the host stopped
    return stream;
  }

  /** Known to stopCommands until it ends. */
  private track(session: SandboxSession): SandboxSession {
    this.sessionsOpen.add(session);
    void session.exit.finally(() => this.sessionsOpen.delete(session));
    if (this.stopping.signal.aborted) session.kill(); // opened as the host stopped
    return session;
  }

  /** 404 unless the sandbox is this account's (checked before a WebSocket is accepted). */
  async requireSandbox(principal: Principal, id: string): Promise<void> {
    await this.row(principal, id);
  }

  get metrics(): ServiceMetrics | undefined {
    return this.deps.metrics;
  }

  get fileLimitBytes(): number {
    return this.deps.fileLimitBytes ?? DEFAULT_FILE_LIMIT_BYTES;
  }

  /**
   * The one way the files API reaches a sandbox's files: a host-bound sandbox's folder directly
   * (file-io.ts, descriptor-relative on this host), a remote one (Daytona) through its provider's
   * file API. Either way paths are confined, `.git` and `.slipway` refused once links are
   * followed, reads capped at the file limit before content moves, and failures answered by
   * `fileCallError` (the provider's kind for a remote sandbox, as exec).
   */
  private files(row: billing.SandboxRow, provider: SandboxProvider, profile: billing.ProfileRow): SandboxFiles {
    const root = row.root!;
    const read = { ...FILES_API, maxBytes: this.fileLimitBytes };
    if (provider.hostBound) {
      // Under bubblewrap a tenant can link only files of its own tree (ADR 0006): its hard links are its own.
      const allowHardLinks = profile.confinement === 'bubblewrap';
      return {
        open: (file) => openSandboxFile(root, file, { ...read, allowHardLinks }),
        write: (file, content) => writeSandboxFile(root, file, content, FILES_API),
        delete: (file) => deleteSandboxFile(root, file, FILES_API),
        list: (dir) => listSandboxDir(root, dir, FILES_API),
      };
    }
    const handle = { root };
    return {
      open: (file) => provider.openFile(handle, file, read),
      write: (file, content) => provider.writeFile(handle, file, content, FILES_API),
      delete: (file) => provider.deleteFile(handle, file, FILES_API),
      list: (dir) => provider.listFiles(handle, dir, FILES_API),
    };
  }

  /** A file call's failure as an answer: the file's own errors (400, 404, 413), a remote provider's by kind (409, 503, 502). */
  private fileCallError(e: unknown, row: billing.SandboxRow, provider: SandboxProvider, file: string): unknown {
    if (!provider.hostBound) return this.providerCallError(e, { sandboxId: row.id, root: row.root!, hostBound: false, file });
    return mapFsError(e, file);
  }

  /**
   * Opens a file for streaming (size capped, regular files only, `.git` and `.slipway` refused).
   * The call counts as activity until the stream ends.
   */
  async openFile(principal: Principal, id: string, file: string): Promise<OpenedFile> {
    checkPath(file);
    const { row, provider, release, profile } = await this.admit(principal, id);
    let opened: OpenedFile;
    try {
      const owner = this.remoteOwner(row, 'file');
      if (owner !== undefined) {
        const allowHardLinks = profile.confinement === 'bubblewrap';
        const remote = await readThroughOwner((call) => this.onOwner(row, owner, call, file), { root: row.root!, path: file, maxBytes: this.fileLimitBytes, allowHardLinks });
        remote.stream.once('close', release);
        return remote;
      }
      opened = await this.files(row, provider, profile).open(file).catch((e: unknown) => {
        throw this.fileCallError(e, row, provider, file);
      });
    } catch (e) {
      release();
      throw mapFsError(e, file);
    }
    opened.stream.once('close', release);
    return opened;
  }

  async readFile(principal: Principal, id: string, file: string): Promise<Buffer> {
    const { stream } = await this.openFile(principal, id, file);
    const chunks: Buffer[] = [];
    for await (const chunk of stream) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  async writeFile(principal: Principal, id: string, file: string, content: Buffer): Promise<void> {
    checkPath(file);
    if (content.length > this.fileLimitBytes) throw new ApiError(413, 'file_too_large', `the file is ${content.length} bytes, over the limit of ${this.fileLimitBytes} bytes`);
    const { row, provider, release, profile } = await this.admit(principal, id);
    try {
      const owner = this.remoteOwner(row, 'file');
      if (owner !== undefined) {
        await writeThroughOwner((call) => this.onOwner(row, owner, call, file), { root: row.root!, path: file, content });
        return;
      }
      await this.files(row, provider, profile).write(file, content).catch((e: unknown) => {
        throw this.fileCallError(e, row, provider, file);
      });
    } finally {
      release();
    }
  }

  async deleteFile(principal: Principal, id: string, file: string): Promise<void> {
    checkPath(file);
    const { row, provider, release, profile } = await this.admit(principal, id);
    try {
      const owner = this.remoteOwner(row, 'file');
      if (owner !== undefined) {
        await this.onOwner(row, owner, { op: 'deleteFile', input: { root: row.root!, path: file } }, file);
        return;
      }
      await this.files(row, provider, profile).delete(file).catch((e: unknown) => {
        throw this.fileCallError(e, row, provider, file);
      });
    } finally {
      release();
    }
  }

  /** A folder's entries (`.git` and `.slipway` left out), by name, at most MAX_LISTED_FILES. */
  async listFiles(principal: Principal, id: string, dir: string): Promise<FileList> {
    checkPath(dir);
    const { row, provider, release, profile } = await this.admit(principal, id);
    try {
      const owner = this.remoteOwner(row, 'file');
      const entries =
        owner !== undefined
          ? ((await this.onOwner(row, owner, { op: 'listFiles', input: { root: row.root!, path: dir } }, dir)) as { entries: FileEntry[] }).entries
          : await this.files(row, provider, profile)
              .list(dir)
              .catch((e: unknown) => {
                throw this.fileCallError(e, row, provider, dir);
              });
      return { path: dir, entries: entries.slice(0, MAX_LISTED_FILES), truncated: entries.length > MAX_LISTED_FILES };
    } catch (e) {
      // Here the path itself is what is not a folder.
      if (e instanceof ApiError && e.code === 'not_a_directory') throw new ApiError(400, 'not_a_directory', `"${dir}" is not a folder in the sandbox`, [{ path: 'path', message: 'not a folder' }]);
      throw e;
    } finally {
      release();
    }
  }

  private readonly sshRevokeListeners: Array<(tokenId: string) => void> = [];

  /** The broker hears of revoked tokens, to end their open connections. */
  onSshTokenRevoked(listener: (tokenId: string) => void): void {
    this.sshRevokeListeners.push(listener);
  }

  /** Turns the SSH broker's token API on (the host calls this once the broker listens). */
  configureSsh(settings: SshSettings): void {
    this.deps.ssh = settings;
  }

  /** Owner tunnels (ADR 0028): sessions and previews of sandboxes held by workers on other hosts. */
  configureTunnels(broker: TunnelBroker): void {
    this.tunnels = broker;
  }

  tunnels?: TunnelBroker;

  /**
   * Opens a session or a port connection on a sandbox's remote owner: a call workflow runs
   * `ownerTunnel` there, which dials this process back; its failures before that (a bad cwd, a
   * closed port, the owner gone) answer as on the direct path.
   */
  private async openTunnel(row: billing.SandboxRow, owner: string, policy: ReturnType<typeof billing.policyFromProfile>, target: TunnelTarget): Promise<{ ws: import('ws').WebSocket; whyClosed: () => Promise<string> }> {
    const broker = this.tunnels;
    if (!broker?.url) {
      throw new ApiError(501, 'remote_owner_stream', `the sandbox is held by worker "${owner}" on another host, and this API host has no tunnel for it to dial (it needs SLIPWAY_PAYLOAD_KEY and an HTTP listener; set slipway api --tunnel-url to where workers reach it)`);
    }
    const graceSeconds = this.deps.ownerGraceSeconds ?? DEFAULT_OWNER_GRACE_SECONDS;
    const tunnelId = randomUUID();
    // The owner dials once it opened the session: within the grace time plus the session's start.
    const arrived = broker.expect(tunnelId, graceSeconds * 1000 + 60_000);
    let handle;
    try {
      handle = await this.startOnOwner(row, owner, { op: 'tunnel', input: { root: row.root!, policy, tunnelId, apiUrl: broker.url, target } });
    } catch (e) {
      broker.cancel(tunnelId);
      throw e;
    }
    const h = handle;
    const failed = h.result().then(
      () => Promise.reject(new ApiError(502, 'tunnel_failed', `the worker "${owner}" ended the call before it opened the tunnel`)),
      (e: unknown) => Promise.reject(remoteCallError(e, row.id, owner, graceSeconds, target.kind === 'session' ? (target.cwd ?? '.') : String(target.port))),
    );
    failed.catch(() => undefined);
    try {
      const ws = await Promise.race([arrived, failed]);
      // The id is not a secret (its proof is): logged so an operator can match both ends.
      this.deps.logger.info({ sandboxId: row.id, owner, tunnelId, kind: target.kind, workflowId: h.workflowId }, 'owner tunnel open');
      const whyClosed = async () => {
        let timer: NodeJS.Timeout | undefined;
        const told = await Promise.race([
          h.result().then(() => 'the session ended without its exit status', (e: unknown) => ((remoteCallError(e, row.id, owner, graceSeconds, '.') as Error)?.message ?? String(e))),
          new Promise<string>((r) => (timer = setTimeout(() => r(`the tunnel to worker "${owner}" closed`), 10_000))),
        ]).finally(() => clearTimeout(timer));
        return told;
      };
      // The client went away or the session ended: the call ends with it.
      ws.once('close', () => void h.cancel().catch(() => undefined));
      return { ws, whyClosed };
    } catch (e) {
      broker.cancel(tunnelId);
      await h.cancel().catch(() => undefined);
      throw e instanceof Error && !(e instanceof ApiError) && /did not open tunnel/.test(e.message) ? new ApiError(503, 'owner_unavailable', `the worker "${owner}" that holds sandbox ${row.id} did not open its tunnel: ${e.message}`, undefined, 5) : e;
    }
  }

  /** The domain preview origins live under; undefined when previews are off. */
  get previewDomain(): string | undefined {
    return this.deps.preview?.domain;
  }

  private previewSettings(): PreviewSettings {
    const p = this.deps.preview;
    if (!p) throw new ApiError(404, 'previews_off', 'preview ports are not enabled on this server (slipway api --preview-domain)');
    return p;
  }

  private portView(id: string, row: billing.PreviewPortRow, origin: { scheme: string; port: string | undefined }, ttlSeconds = DEFAULT_LINK_TTL_SECONDS): PreviewPortView {
    const p = this.previewSettings();
    const url = `${origin.scheme}://${previewHost(id, row.port, p.domain)}${origin.port ? `:${origin.port}` : ''}/`;
    const expiresAtMs = Date.now() + ttlSeconds * 1000;
    const token = signPreviewLink(p.key, { sandboxId: id, port: row.port, expiresAtMs });
    return {
      port: row.port,
      opened_at: row.opened_at.toISOString(),
      url,
      link: `${url}?${PREVIEW_LINK_PARAM}=${token}`,
      link_expires_at: new Date(Math.floor(expiresAtMs / 1000) * 1000).toISOString(),
    };
  }

  /** Opens a port of a live sandbox for previews (again: a fresh link for it). */
  async openPort(principal: Principal, id: string, body: OpenPortBody, origin: { scheme: string; port: string | undefined }): Promise<PreviewPortView> {
    this.previewSettings();
    const row = await this.row(principal, id);
    if (['terminating', 'terminated', 'failed'].includes(row.status)) throw new ApiError(409, 'sandbox_ended', `sandbox ${id} is ${row.status}`);
    const profile = await this.profile(row.profile_id);
    // An unconfined sandbox shares the host's network: its 127.0.0.1 is the host's loopback.
    if (profile.confinement !== 'bubblewrap') throw new ApiError(422, 'preview_needs_confinement', `sandbox ${id} is not confined: preview ports need a sandbox with a network of its own`);
    const opened = await billing.openPreviewPort(this.deps.db, { sandboxId: id, accountId: principal.accountId, port: body.port });
    this.deps.logger.info({ sandboxId: id, port: body.port, tokenId: principal.tokenId }, 'preview port opened');
    return this.portView(id, opened, origin, body.link_ttl_seconds);
  }

  async listPorts(principal: Principal, id: string, origin: { scheme: string; port: string | undefined }): Promise<PreviewPortView[]> {
    this.previewSettings();
    await this.row(principal, id);
    return (await billing.listPreviewPorts(this.deps.db, id)).map((r) => this.portView(id, r, origin));
  }

  async closePort(principal: Principal, id: string, port: number): Promise<void> {
    await this.row(principal, id);
    if (!(await billing.closePreviewPort(this.deps.db, id, port))) throw new ApiError(404, 'port_not_open', `port ${port} of sandbox ${id} is not open for preview`);
    this.deps.logger.info({ sandboxId: id, port, tokenId: principal.tokenId }, 'preview port closed');
  }

  /** A signed link's verdict for this sandbox and port. */
  checkPreviewLink(token: string, sandboxId: string, port: number): LinkCheck {
    return verifyPreviewLink(this.previewSettings().key, token, { sandboxId, port, nowMs: Date.now() });
  }

  /**
   * Who may open a preview with a bearer token: the sandbox's own account only (another
   * account's sandbox is a 404, as everywhere in the API).
   */
  async authorizePreviewBearer(token: string, sandboxId: string): Promise<void> {
    const principal = await this.authenticate(token);
    await this.row(principal, sandboxId);
  }

  /**
   * A byte stream to the sandbox's port, for an authorised preview request: the port must be
   * open, the sandbox is admitted (woken, kept from idling) until `release`.
   */
  async connectPreview(sandboxId: string, port: number): Promise<{ stream: Duplex; release: () => void; accountId: string }> {
    const owner = SANDBOX_ID_PATTERN.test(sandboxId) ? await billing.getSandboxById(this.deps.db, sandboxId) : undefined;
    if (!owner) throw new ApiError(404, 'not_found', `no sandbox ${sandboxId}`);
    if (!(await billing.isPreviewPortOpen(this.deps.db, sandboxId, port))) throw new ApiError(404, 'port_not_open', `port ${port} of sandbox ${sandboxId} is not open for preview`);
    // Each request starts a relay process: previews count against the owner's request rate.
    this.rateLimit(owner.account_id);
    const { row, provider, release, profile } = await this.admit({ accountId: owner.account_id, tokenId: 'preview', sandboxesEnabled: true }, sandboxId);
    try {
      const holder = this.remoteOwner(row, 'session');
      if (holder !== undefined) {
        const { ws } = await this.openTunnel(row, holder, billing.policyFromProfile(profile), { kind: 'port', port });
        return { stream: this.trackPreview(tunnelStream(ws)), release, accountId: owner.account_id };
      }
      if (!provider.connectPort) throw new ApiError(501, 'previews_unsupported', `the ${provider.kind} provider cannot reach sandbox ports`);
      const stream = await provider.connectPort({ root: row.root! }, port);
      return { stream: this.trackPreview(stream), release, accountId: owner.account_id };
    } catch (e) {
      release();
      if (e instanceof PortUnreachableError) throw new ApiError(502, 'port_unreachable', e.message);
      throw e;
    }
  }

  /** Mints an SSH credential for one live sandbox (shown once, stored hashed). */
  async mintSshToken(principal: Principal, id: string, body: MintSshTokenBody, requestHost: string | undefined): Promise<SshTokenView> {
    const ssh = this.deps.ssh;
    if (!ssh) throw new ApiError(404, 'ssh_off', 'the SSH broker is not enabled on this server (slipway api --ssh-port)');
    const row = await this.row(principal, id);
    if (['terminating', 'terminated', 'failed'].includes(row.status)) throw new ApiError(409, 'sandbox_ended', `sandbox ${id} is ${row.status}`);
    const max = ssh.maxTokenMinutes ?? DEFAULT_SSH_MAX_TOKEN_MINUTES;
    const minutes = body.ttl_minutes ?? Math.min(DEFAULT_SSH_TOKEN_MINUTES, max);
    if (minutes > max) throw new ApiError(400, 'invalid_body', `invalid body: ttl_minutes: may be at most ${max} on this server`, [{ path: 'ttl_minutes', message: `at most ${max}` }]);
    const minted = await billing.createSshToken(this.deps.db, { accountId: principal.accountId, sandboxId: id, createdBy: principal.tokenId, expiresAtMs: Date.now() + minutes * 60_000 });
    const host = ssh.publicHost ?? (requestHost ?? '127.0.0.1').replace(/:\d+$/, '').replace(/^\[(.*)\]$/, '$1');
    this.deps.logger.info({ sandboxId: id, sshTokenId: minted.id, tokenId: principal.tokenId, minutes }, 'ssh token minted');
    return {
      token_id: minted.id,
      token: minted.token,
      host,
      port: ssh.port,
      user: minted.token,
      password_user: id,
      command: `ssh -p ${ssh.port} ${minted.token}@${host}`,
      expires_at: minted.expiresAt.toISOString(),
    };
  }

  async revokeSshToken(principal: Principal, id: string, tokenId: string): Promise<void> {
    await this.row(principal, id);
    if (!(await billing.revokeSshToken(this.deps.db, principal.accountId, id, tokenId))) throw new ApiError(404, 'not_found', `no live SSH token ${tokenId} for sandbox ${id}`);
    // This process's connections made with it end now (another replica's at their next channel).
    for (const listener of this.sshRevokeListeners) listener(tokenId);
    this.deps.logger.info({ sandboxId: id, sshTokenId: tokenId, tokenId: principal.tokenId }, 'ssh token revoked');
  }

  /**
   * The sandbox an SSH login may open: the token must be live and, when the client named a
   * sandbox as its user, be that sandbox's. Undefined: refused (no reason is told to the client).
   */
  async authenticateSsh(token: string, claimedSandbox?: string): Promise<{ accountId: string; sandboxId: string; tokenId: string } | undefined> {
    const found = await billing.authenticateSshToken(this.deps.db, token);
    if (!found || (claimedSandbox !== undefined && claimedSandbox !== found.sandboxId)) return undefined;
    return found;
  }

  /**
   * An interactive session in the sandbox of an SSH login: the token is checked again (a
   * revoked or expired one opens no new channel), the call counts as an exec (per-account
   * limit) and as activity (no idle suspend) until `release`.
   */
  async openSshSession(login: { accountId: string; sandboxId: string; tokenId: string }, req: SessionRequest): Promise<{ session: SandboxSession; release: () => void }> {
    if (!(await billing.sshTokenLive(this.deps.db, login.tokenId))) throw new ApiError(401, 'unauthorized', 'this SSH token was revoked or has expired');
    const { session, release } = await this.admitSession({ accountId: login.accountId, tokenId: login.tokenId, sandboxesEnabled: true }, login.sandboxId, req);
    return { session, release };
  }

  async introspectGrant(token: string | undefined) {
    if (!token) throw new ApiError(401, 'unauthorized', 'missing bearer token');
    const grant = await billing.introspectGrant(this.deps.db, token);
    if (!grant) throw new ApiError(401, 'unauthorized', 'invalid, expired or revoked grant token');
    return { grant_id: grant.grantId, sandbox_id: grant.sandboxId, project_id: grant.projectId, scopes: grant.scopes, expires_at: grant.expiresAt.toISOString() };
  }
}

/** A sandbox's files as the files API sees them (SandboxService.files). */
interface SandboxFiles {
  open(file: string): Promise<OpenedFile>;
  write(file: string, content: Buffer): Promise<void>;
  delete(file: string): Promise<void>;
  list(dir: string): Promise<FileEntry[]>;
}

/** What an exec or a session runs with (its own fields, nothing else). */
export interface SessionStart {
  command: string;
  args: string[];
  env: Record<string, string>;
  cwd?: string;
  pty?: { cols: number; rows: number };
  /** A streamed exec's whole input (streams only). */
  stdin?: string;
  /** A streamed exec's timeout (streams only): a remote owner kills the command itself at it. */
  timeoutMs?: number;
}

/**
 * A tenant command's environment. Values travel in the process environment (not argv, where
 * `ps` shows them), and the server's own environment never reaches the command.
 */
function execEnv(row: billing.SandboxRow, extra: Record<string, string>): Record<string, string> {
  const root = row.root!;
  return {
    ...SANDBOX_BASE_ENV,
    HOME: root,
    SLIPWAY_SANDBOX_ID: row.id,
    SLIPWAY_SANDBOX_ROOT: root,
    ...(row.grants.length > 0 ? { SLIPWAY_GRANTS_FILE: `${root}/${GRANTS_FILE}` } : {}),
    ...extra,
  };
}

/** Refuses a malformed path before anything is woken or touched. */
function checkPath(file: string): void {
  try {
    checkRequestedPath(file, FILES_API);
  } catch (e) {
    throw mapFsError(e, file);
  }
}

/** An exec's cwd must be an existing folder inside the sandbox: a clear 400, not a failed spawn. */
async function checkCwd(root: string, cwd: string): Promise<void> {
  let resolved: string;
  try {
    resolved = await resolveInside(root, cwd);
  } catch (e) {
    throw e instanceof PathEscapeError ? cwdRefused(e) : mapFsError(e, cwd);
  }
  const st = await fs.stat(resolved).catch(() => undefined);
  if (!st?.isDirectory()) throw invalidCwd(new NotAFolderError(cwd, st ? 'not a folder' : 'no such folder'));
}

const cwdRefused = (e: PathEscapeError) => new ApiError(400, 'path_refused', e.message, [{ path: 'cwd', message: e.message }]);
const invalidCwd = (e: NotAFolderError) => new ApiError(400, 'invalid_cwd', `cwd "${e.requested}" is not a folder in the sandbox`, [{ path: 'cwd', message: e.reason }]);

/**
 * The HTTP answer to a remote provider's failure, by its kind: a sandbox the provider no longer
 * has is gone (409, as a local sandbox whose folder vanished); a request the provider refused as
 * given is 400 with its reason (naming `file` when the call was on one), one it cannot do in the
 * sandbox's state 409; a rate limit, a quota or an outage of the provider is a 503 to retry (after
 * the provider's reset when it gave one); credentials it refused, or anything else, a 502 (the
 * upstream failed, not the request).
 */
export function providerFailure(e: SandboxProviderError, sandboxId: string, now = Date.now(), file?: string): ApiError {
  const said = e.providerMessage?.trim() || undefined;
  switch (e.kind) {
    case 'bad_request': {
      // The request was refused as given: the caller can fix it, so the provider's reason is passed on.
      const message = `the sandbox provider refused the call${file !== undefined ? ` on "${file}"` : ''}: ${said ?? 'bad request'}`;
      return new ApiError(400, 'provider_refused', message, file !== undefined ? [{ path: 'path', message }] : undefined);
    }
    case 'conflict':
      return new ApiError(409, 'provider_conflict', `the sandbox provider cannot do this now${file !== undefined ? ` on "${file}"` : ''}: ${said ?? 'conflict'}`);
    case 'not_found':
      return new ApiError(409, 'sandbox_ended', `sandbox ${sandboxId} is gone (the provider no longer has it)`);
    case 'rate_limit':
      return new ApiError(503, 'provider_unavailable', 'the sandbox provider is rate limiting this server; retry later', undefined, Math.max(1, Math.ceil(((e.resetAt ?? now) - now) / 1000)));
    case 'transient':
      return new ApiError(503, 'provider_unavailable', 'the sandbox provider is failing; retry later', undefined, 5);
    case 'quota':
      return new ApiError(503, 'provider_unavailable', 'the sandbox provider refused: its quota is used up', undefined, 60);
    case 'unauthorized':
      return new ApiError(502, 'provider_error', 'the sandbox provider refused this server\'s credentials');
    default:
      return new ApiError(502, 'provider_error', 'the sandbox provider failed the call');
  }
}

/**
 * An exec or a session the provider refused or failed: the cwd's checks (the provider's own for
 * a remote sandbox), the provider's failure kind, and "gone" only where it is true (a host-bound
 * sandbox whose folder vanished; the watcher will end it).
 */
function providerCallError(e: unknown, at: { sandboxId: string; root: string; hostBound: boolean; cwd?: string; file?: string }): unknown {
  if (e instanceof ApiError) return e;
  if (at.hostBound && !existsSync(at.root)) return new ApiError(409, 'sandbox_ended', `sandbox ${at.sandboxId} is gone (its directory was removed)`);
  if (e instanceof NotAFolderError) return invalidCwd(e);
  if (e instanceof PathEscapeError && at.cwd !== undefined) return cwdRefused(e);
  if (e instanceof SandboxProviderError) return providerFailure(e, at.sandboxId, Date.now(), at.file);
  return mapFsError(e, at.file ?? at.cwd ?? '.');
}

/** A call on a remote owner failed: the owner took nothing up (503), or the owner's error as the direct path answers it. */
function remoteCallError(e: unknown, sandboxId: string, owner: string, graceSeconds: number, file: string): unknown {
  let cause: unknown = e instanceof WorkflowFailedError ? e.cause : e;
  if (cause instanceof ActivityFailure) cause = cause.cause;
  if (cause instanceof TimeoutFailure) {
    const what = cause.timeoutType === TimeoutType.SCHEDULE_TO_START ? `took nothing up within ${graceSeconds} s` : 'stopped answering';
    return new ApiError(503, 'owner_unavailable', `the worker "${owner}" that holds sandbox ${sandboxId} ${what}; it may be gone`, undefined, 5);
  }
  if (!(cause instanceof ApplicationFailure)) return e;
  const message = cause.message;
  switch (cause.type) {
    case 'sandbox_gone':
      return new ApiError(409, 'sandbox_ended', `sandbox ${sandboxId} is gone (its directory was removed)`);
    case 'invalid_cwd':
      return new ApiError(400, 'invalid_cwd', `cwd "${file}" is not a folder in the sandbox`, [{ path: 'cwd', message }]);
    case 'PathEscapeError':
      return new ApiError(400, 'path_refused', message, [{ path: 'path', message }]);
    case 'FileTooLargeError':
      return new ApiError(413, 'file_too_large', message);
    case 'NotRegularFileError':
      return new ApiError(400, 'not_a_regular_file', message);
    case 'file_changed':
      return new ApiError(409, 'file_changed', message);
    case 'PortUnreachableError':
      return new ApiError(502, 'port_unreachable', message);
    case 'previews_unsupported':
      return new ApiError(501, 'previews_unsupported', message);
    case 'tunnel_unreachable':
    case 'tunnel_unavailable':
      return new ApiError(503, 'owner_unavailable', `the worker "${owner}" that holds sandbox ${sandboxId} cannot open a tunnel to this API host: ${message}`, undefined, 5);
    case 'upload_incomplete':
      return new ApiError(503, 'upload_incomplete', `${message}; retry`, undefined, 1);
    default:
      return mapFsError(Object.assign(new Error(message), { code: cause.type }), file);
  }
}

function mapFsError(e: unknown, file: string): unknown {
  if (e instanceof ApiError) return e;
  if (e instanceof PathEscapeError) return new ApiError(400, 'path_refused', e.message, [{ path: 'path', message: e.message }]);
  if (e instanceof FileTooLargeError) return new ApiError(413, 'file_too_large', e.message);
  if (e instanceof NotRegularFileError) return new ApiError(400, 'not_a_regular_file', e.message);
  const code = (e as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return new ApiError(404, 'file_not_found', `no file "${file}" in the sandbox`);
  if (code === 'EISDIR') return new ApiError(400, 'is_a_directory', `"${file}" is a directory`);
  if (code === 'ENOTDIR') return new ApiError(400, 'not_a_directory', `a parent of "${file}" is not a directory`);
  if (code === 'ELOOP') return new ApiError(400, 'path_refused', `"${file}" is a symbolic link`);
  if (code === 'ENAMETOOLONG') return new ApiError(400, 'name_too_long', `path "${file.slice(0, 64)}...": ${(e as Error).message.replace(/^ENAMETOOLONG: /, '')}`, [{ path: 'path', message: 'too long' }]);
  if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') return new ApiError(403, 'permission_denied', `"${file}" cannot be accessed`);
  if (code === 'ENOSPC' || code === 'EDQUOT' || code === 'EFBIG') return new ApiError(507, 'no_space', 'the sandbox has no space left for this file');
  return e;
}

/** The body a key was first used with: the same key with another body is a client bug. */
function hashRequest(body: unknown): string {
  return createHash('sha256').update(JSON.stringify(body)).digest('hex');
}

function idempotencyKeyReused(): ApiError {
  return new ApiError(422, 'idempotency_key_reused', 'this Idempotency-Key was used with a different request body', [
    { path: 'headers.idempotency-key', message: 'already used with another body' },
  ]);
}

/** `Idempotency-Key`: 1 to 200 printable ASCII characters, or absent. */
export function idempotencyKeyOf(headers: Record<string, string | string[] | undefined>): string | undefined {
  const raw = headers['idempotency-key'];
  if (raw === undefined) return undefined;
  const value = Array.isArray(raw) ? raw[0] : raw;
  if (value === undefined || !/^[!-~]{1,200}$/.test(value)) {
    throw new ApiError(400, 'invalid_request', 'Idempotency-Key must be 1 to 200 printable ASCII characters', [{ path: 'headers.idempotency-key', message: 'invalid' }]);
  }
  return value;
}

/**
 * Tenants never see the host's paths: the sandbox's root reads as `<sandbox>`, the operator's
 * repository as `<repository>`, and any other absolute path as `<host path>`.
 */
export function hideHostPaths(text: string, places: { sandbox?: string | null; repository?: string | null }): string {
  let out = text;
  // The sandbox's root lies inside the repository: it goes first.
  if (places.sandbox && places.sandbox.length > 1) out = out.split(places.sandbox).join('<sandbox>');
  if (places.repository && places.repository.length > 1) out = out.split(places.repository).join('<repository>');
  return out.replace(/(^|[\s'"(=:,])\/(?:[\w.@+-]+\/)*[\w.@+-]+/g, '$1<host path>');
}
