/**
 * The whole sandbox service for a test file: a fresh database on the real test Postgres, a
 * service worker on its own task queue of the shared Temporal server, the watcher, the API on
 * a free port over real HTTP, and a repository for profiles. Logs are captured for scanning.
 */
import { ApiClientError } from '../../api/client';
import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import pino from 'pino';
import { inject } from 'vitest';
import { createAccount, createApiToken, createProfile, createProject, listSessions, type ProfileSpec } from '../../activities/billing/records';
import { defaultProviderFor, type ProviderFor } from '../../activities/service/providers';
import { SandboxApiClient } from '../../api/client';
import type { SandboxView } from '../../api/schemas';
import { installRuntimeLogging } from '../../workers/logging';
import { startSandboxServiceHost, type SandboxServiceHost, type SandboxServiceHostOptions } from '../../workers/sandbox-service';
import { freshPostgres, type TestDatabase } from './db';
import { makeServiceRepo } from './repo';

export interface TestAccount {
  id: string;
  token: string;
  api: SandboxApiClient;
  profile(spec: Partial<ProfileSpec> & { name: string }): Promise<string>;
  project(name: string): Promise<string>;
}

export interface ServiceHarness {
  host: SandboxServiceHost;
  database: TestDatabase;
  url: string;
  repo: string;
  /** The main task queue (the service queue is derived from it): for worker processes that join this host. */
  taskQueue: string;
  logs: string[];
  account(opts?: { limit?: number; enabled?: boolean }): Promise<TestAccount>;
  /** Polls GET until the sandbox reaches one of `states`. */
  waitFor(api: SandboxApiClient, id: string, states: string[], timeoutMs?: number): Promise<SandboxView>;
  sessions(id: string): ReturnType<typeof listSessions>;
  stop(): Promise<void>;
}

/** Wraps a provider so creates in repositories whose path contains "slow" hang for `ms`. */
export function slowCreates(inner: ProviderFor, ms: number): ProviderFor {
  return (policy) => {
    const provider = inner(policy);
    return new Proxy(provider, {
      get(target, prop, receiver) {
        if (prop === 'create') {
          return async (req: Parameters<typeof provider.create>[0]) => {
            if (req.repository.includes('slow')) await new Promise((r) => setTimeout(r, ms));
            return target.create(req);
          };
        }
        const value = Reflect.get(target, prop, receiver);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
  };
}

export async function startServiceHarness(
  opts: Partial<Pick<SandboxServiceHostOptions, 'reaper' | 'watchIntervalMs' | 'providerFor' | 'allowUnconfined' | 'fileLimitBytes' | 'execConcurrency' | 'requestsPerSecond' | 'preview' | 'ssh' | 'worker' | 'workerId' | 'ownerGraceSeconds' | 'shutdownGraceMs'>> = {},
): Promise<ServiceHarness> {
  installRuntimeLogging();
  const database = await freshPostgres();
  const logs: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, done) {
      logs.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      done();
    },
  });
  const logger = pino({ level: 'info', redact: { paths: ['req.headers.authorization'], censor: '[redacted]' } }, sink);
  const taskQueue = `svc-${randomBytes(4).toString('hex')}`;
  const host = await startSandboxServiceHost({
    db: database.db,
    temporalAddress: inject('temporalAddress'),
    taskQueue,
    workflowBundle: { codePath: inject('workflowBundlePath') },
    api: { host: '127.0.0.1', port: 0 },
    watchIntervalMs: opts.watchIntervalMs ?? 100,
    reaper: opts.reaper ? { ...opts.reaper, scheduleId: `reaper-${taskQueue}` } : false,
    providerFor: opts.providerFor ?? defaultProviderFor(),
    logger,
    allowUnconfined: opts.allowUnconfined,
    fileLimitBytes: opts.fileLimitBytes,
    execConcurrency: opts.execConcurrency,
    // Attack tests fire requests as fast as they can: no rate limit unless a test asks for one.
    requestsPerSecond: opts.requestsPerSecond ?? 0,
    preview: opts.preview,
    ssh: opts.ssh,
    worker: opts.worker,
    workerId: opts.workerId,
    ownerGraceSeconds: opts.ownerGraceSeconds,
    shutdownGraceMs: opts.shutdownGraceMs,
  });
  const repo = makeServiceRepo();
  let n = 0;
  return {
    host,
    database,
    url: host.url!,
    repo,
    taskQueue,
    logs,
    async account(o = {}) {
      const id = `acct-${++n}-${randomBytes(3).toString('hex')}`;
      await createAccount(database.db, { id, concurrentLimit: o.limit ?? 1, sandboxesEnabled: o.enabled ?? true });
      const { token } = await createApiToken(database.db, id, { name: 'test' });
      return {
        id,
        token,
        api: new SandboxApiClient(host.url!, token),
        // Explicit, as an operator's would be: confined and offline unless a test says otherwise.
        profile: async (spec) => (await createProfile(database.db, id, { repository: repo, baseRef: 'main', confinement: 'bubblewrap', network: false, ...spec })).name,
        project: async (name) => (await createProject(database.db, id, name)).id,
      };
    },
    async waitFor(api, id, states, timeoutMs = 30_000) {
      const until = Date.now() + timeoutMs;
      let last: SandboxView | undefined;
      while (Date.now() < until) {
        last = await api.get(id);
        if (states.includes(last.status)) return last;
        await new Promise((r) => setTimeout(r, 50));
      }
      throw new Error(`sandbox ${id} did not reach ${states.join('/')} in ${timeoutMs} ms (last: ${last?.status})`);
    },
    sessions: (id) => listSessions(database.db, id),
    async stop() {
      await host.close();
      await host.client.schedule.getHandle(`reaper-${taskQueue}`).delete().catch(() => undefined);
      await database.drop();
    },
  };
}

/** A request as a client without the SDK makes it: raw bodies, any headers (tests of the HTTP surface). */
export const rawRequest = (
  base: string,
  method: string,
  p: string,
  opts: { token?: string; body?: string | Buffer; headers?: Record<string, string>; signal?: AbortSignal } = {},
) =>
  fetch(new URL(p, base), {
    method,
    headers: { ...(opts.token ? { authorization: `Bearer ${opts.token}` } : {}), ...(typeof opts.body === 'string' ? { 'content-type': 'application/json' } : {}), ...opts.headers },
    body: opts.body === undefined ? undefined : typeof opts.body === 'string' ? opts.body : new Uint8Array(opts.body),
    signal: opts.signal,
  });

/** 'ok', or the API error's status and code. */
export const codeOf = async (p: Promise<unknown>): Promise<string> => {
  try {
    await p;
    return 'ok';
  } catch (e) {
    return e instanceof ApiClientError ? `${e.status} ${e.code}` : String(e);
  }
};
