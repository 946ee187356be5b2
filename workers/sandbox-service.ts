/**
 * The sandbox service host: what `slipway api` runs. One process holds the billing database, a worker
 * on the service task queue (sandbox and reaper workflows, their activities), the provider
 * watcher, the reaper's Temporal Schedule, and the HTTP API (REST, MCP, metrics).
 *
 * The local provider keeps sandboxes on this machine's disk, so API and worker share a host;
 * with remote providers they can be split (`worker: false` / `api: false`).
 */
import { Client, Connection, ScheduleAlreadyRunning, ScheduleOverlapPolicy } from '@temporalio/client';
import type { DataConverter } from '@temporalio/common';
import { NativeConnection, Worker, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import type { FastifyInstance } from 'fastify';
import pino, { type Logger } from 'pino';
import { LEGACY_REAPER_SCHEDULE_ID, reaperScheduleId, reaperWorkflowId, sandboxServiceTaskQueue } from '../core/sandbox-service';
import type { Db } from '../activities/billing/db';
import { migrate } from '../activities/billing/migrate';
import { listProfiles, policyFromProfile } from '../activities/billing/records';
import { PodWatchers } from '../activities/sandbox/kube-watch';
import { KubernetesSandboxProvider } from '../activities/sandbox/kubernetes';
import { createSandboxServiceActivities } from '../activities/service';
import { createSandboxCallActivities } from '../activities/service/calls';
import { ownerTaskQueue } from '../core/ids';
import os from 'node:os';
import { createServiceMetrics, type ServiceMetrics } from '../activities/service/metrics';
import { defaultProviderFor, type ProviderFor } from '../activities/service/providers';
import { probeBwrap, requireBwrap } from '../activities/sandbox/bubblewrap';
import { buildApiServer } from '../api/server';
import { SandboxService, type PreviewSettings, type SshSettings } from '../api/service';
import { startSshBroker, type SshBroker } from '../api/ssh-server';
import { sandboxReaperWorkflow } from '../workflows/service-sandbox';
import { startSandboxWatcher, type SandboxWatcher } from './sandbox-watcher';
import { bundleWorkflows } from './worker';
import { payloadKeyringFromEnv, slipwayDataConverter } from './payload-codec';
import { DEFAULT_SHUTDOWN_GRACE_MS } from '../lib/settings';
import { TunnelBroker } from '../api/owner-tunnel';
import { tunnelKey } from '../activities/service/tunnel';

export interface SandboxServiceHostOptions {
  db: Db;
  temporalAddress: string;
  namespace?: string;
  /** The main task queue; the service's own queue is derived from it. */
  taskQueue: string;
  workflowBundle?: WorkflowBundleWithSourceMap | { codePath: string };
  providerFor?: ProviderFor;
  logger?: Logger;
  /** HTTP listener; false: no API in this process. */
  api?: { host: string; port: number } | false;
  /** Host a worker on the service queue (default true). */
  worker?: boolean;
  watchIntervalMs?: number;
  /** The reaper's schedule; false: do not create one. */
  reaper?: { intervalMs: number; scheduleId?: string; orphanGraceMs?: number } | false;
  activityConcurrency?: number;
  /** Workflows kept in the worker's cache (default: the SDK's, sized from the heap). */
  maxCachedWorkflows?: number;
  /** Process-level metrics (memory, event loop) on /metrics too. */
  defaultMetrics?: boolean;
  /**
   * Serve profiles with `confinement: none` (their commands run on the host as this process's
   * user): for single-tenant setups only. Default false: such profiles are refused, and the
   * host refuses to start without a working bubblewrap.
   */
  allowUnconfined?: boolean;
  /** Largest file body accepted by PUT and returned by GET /files (bytes). */
  fileLimitBytes?: number;
  /** Execs running at once per account (more get 429 with Retry-After). */
  execConcurrency?: number;
  /** Requests per second per account (more get 429 with Retry-After); 0 turns it off. */
  requestsPerSecond?: number;
  /** Preview ports (ADR 0015): link key and domain; absent: previews are off. */
  preview?: PreviewSettings;
  /** The SSH broker (ADR 0015): listen address, host key, and what clients are told; absent: off. */
  ssh?: { host: string; port: number; hostKey: Buffer; publicHost?: string; maxTokenMinutes?: number };
  /** Payload codecs of the client and the worker; default: from the environment (workers/payload-codec.ts). */
  dataConverter?: DataConverter;
  /**
   * This process's worker id (ADR 0013): recorded as the owner of the sandboxes it creates; its
   * worker also polls `<service queue>@<id>` for exec and file calls from API hosts that are not
   * the owner. Absent: sandboxes have no recorded owner and every call is direct (one host).
   */
  workerId?: string;
  /**
   * On close, how long commands callers still run (execs, streamed execs, sessions) may go on
   * before they are killed (default 10 s, `SLIPWAY_SHUTDOWN_GRACE_MS` for `slipway api`); no
   * new request is taken meanwhile (fastify answers 503).
   */
  shutdownGraceMs?: number;
  /** How long an exec or file call waits for a remote owner to take it up before a 503 (default 180). */
  ownerGraceSeconds?: number;
  /**
   * Where workers on other hosts reach this process's API to open sessions and previews of the
   * sandboxes they hold (ADR 0028); default: the API's own listen URL (one host only).
   */
  tunnelUrl?: string;
}

export interface SandboxServiceHost {
  url?: string;
  /** The SSH broker's port, when it runs. */
  sshPort?: number;
  app?: FastifyInstance;
  service: SandboxService;
  metrics: ServiceMetrics;
  client: Client;
  watcher?: SandboxWatcher;
  serviceTaskQueue: string;
  /** Fills every profile's warm pool now (also done at start and on each reaper tick). */
  replenishWarmPools(): Promise<number>;
  close(): Promise<void>;
}

/** JSON logs on stderr. Authorization headers and token fields are redacted wherever they appear. */
export function serviceLogger(level = process.env.SLIPWAY_LOG_LEVEL?.toLowerCase() || 'info', destination?: pino.DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: 'slipway-api' },
      redact: { paths: ['req.headers.authorization', 'headers.authorization', '*.token', 'token', '*.password'], censor: '[redacted]' },
    },
    destination ?? pino.destination(2),
  );
}

/**
 * Removes the one-for-all reaper schedule an earlier release made, when it targets this queue
 * (the queue's own schedule replaces it). A schedule another deployment made, or one this
 * process cannot read (another payload key), is left alone.
 */
async function dropLegacyReaperSchedule(client: Client, serviceTaskQueue: string): Promise<void> {
  const handle = client.schedule.getHandle(LEGACY_REAPER_SCHEDULE_ID);
  const legacy = await handle.describe().catch(() => undefined);
  if (legacy?.action.type === 'startWorkflow' && legacy.action.taskQueue === serviceTaskQueue) await handle.delete().catch(() => undefined);
}

export async function startSandboxServiceHost(opts: SandboxServiceHostOptions): Promise<SandboxServiceHost> {
  const logger = opts.logger ?? serviceLogger();
  const { db } = opts;
  const allowUnconfined = opts.allowUnconfined ?? false;
  if (allowUnconfined) {
    logger.warn({ allowUnconfined }, 'unconfined profiles are allowed: their commands run on this host as this user; use this only for a single-tenant setup');
  } else {
    // Every tenant runs under bubblewrap: without a working one there is nothing safe to serve.
    await probeBwrap(requireBwrap());
  }
  await migrate(db);
  const providerFor = opts.providerFor ?? defaultProviderFor();
  const metrics = createServiceMetrics(db, { defaultMetrics: opts.defaultMetrics, allowUnconfined });
  const namespace = opts.namespace ?? 'default';
  const serviceTaskQueue = sandboxServiceTaskQueue(opts.taskQueue);
  const dataConverter = opts.dataConverter ?? slipwayDataConverter();
  const keyring = payloadKeyringFromEnv();
  const payloadKey = keyring?.keys.get(keyring.currentKeyId);
  const ownerTunnelKey = payloadKey ? tunnelKey(payloadKey) : undefined;
  const connection = await Connection.connect({ address: opts.temporalAddress });
  const client = new Client({ connection, namespace, dataConverter });
  const closers: Array<() => Promise<void>> = [];

  const activities = createSandboxServiceActivities({ db, providerFor, client, metrics, allowUnconfined, workerId: opts.workerId });
  const replenishWarmPools = async () => {
    let made = 0;
    for (const p of await listProfiles(db)) if (p.warm_replicas > 0) made += await activities.replenishWarmPool({ profileId: p.id });
    return made;
  };
  const workers: Worker[] = [];
  const runs: Array<Promise<void>> = [];
  const nativeConnection = opts.worker !== false || opts.workerId ? await NativeConnection.connect({ address: opts.temporalAddress }) : undefined;
  const identity = opts.workerId ? { identity: `${process.pid}@${os.hostname()}/${opts.workerId}` } : {};
  const workflowBundle = opts.workflowBundle ?? (nativeConnection ? await bundleWorkflows() : undefined);
  if (opts.worker !== false) {
    const worker = await Worker.create({
      connection: nativeConnection!,
      namespace,
      taskQueue: serviceTaskQueue,
      workflowBundle,
      dataConverter,
      activities,
      maxConcurrentActivityTaskExecutions: opts.activityConcurrency ?? 16,
      maxConcurrentLocalActivityExecutions: 64,
      maxConcurrentWorkflowTaskExecutions: 16,
      ...(opts.maxCachedWorkflows !== undefined ? { maxCachedWorkflows: opts.maxCachedWorkflows } : {}),
      shutdownGraceTime: 5_000,
      ...identity,
    });
    runs.push(worker.run());
    workers.push(worker);
    // Warm pools fill in the background; a create before that is a cold boot.
    void replenishWarmPools().catch((e) => logger.warn({ err: e }, 'warm pool fill failed'));
  }
  if (opts.workerId) {
    // This process's own queue (ADR 0013): it takes the exec and file calls on the sandboxes it
    // holds, and runs the call workflows of its API (so a call never waits on another host's worker).
    const ownerWorker = await Worker.create({
      connection: nativeConnection!,
      namespace,
      taskQueue: ownerTaskQueue(serviceTaskQueue, opts.workerId),
      workflowBundle,
      dataConverter,
      activities: createSandboxCallActivities({ providerFor, ...(ownerTunnelKey ? { tunnelKey: ownerTunnelKey } : {}) }),
      maxConcurrentActivityTaskExecutions: opts.activityConcurrency ?? 16,
      shutdownGraceTime: 5_000,
      ...identity,
    });
    runs.push(ownerWorker.run());
    workers.push(ownerWorker);
  }
  if (nativeConnection) {
    const workerRun = Promise.all(runs);
    closers.push(async () => {
      for (const w of workers) if (w.getState() === 'RUNNING') w.shutdown();
      await workerRun.catch(() => undefined);
      await nativeConnection.close();
    });
  }

  if (opts.reaper) {
    const scheduleId = opts.reaper.scheduleId ?? reaperScheduleId(serviceTaskQueue);
    const spec = { intervals: [{ every: opts.reaper.intervalMs }] };
    const action = {
      type: 'startWorkflow' as const,
      workflowType: sandboxReaperWorkflow,
      workflowId: `${reaperWorkflowId}:${scheduleId}`,
      taskQueue: serviceTaskQueue,
      args: [{ orphanGraceMs: opts.reaper.orphanGraceMs }] as [{ orphanGraceMs?: number }],
    };
    try {
      await client.schedule.create({ scheduleId, spec, action, policies: { overlap: ScheduleOverlapPolicy.SKIP } });
    } catch (e) {
      if (!(e instanceof ScheduleAlreadyRunning)) throw e;
      await client.schedule.getHandle(scheduleId).update((prev) => ({ ...prev, spec, action }));
    }
    if (!opts.reaper.scheduleId) await dropLegacyReaperSchedule(client, serviceTaskQueue);
  }

  let watcher: SandboxWatcher | undefined;
  if (opts.worker !== false) {
    // This worker's pod informers (one per namespace it makes pods in) push Kubernetes deaths to
    // the watcher; the probe pass every watchIntervalMs (0: none) is the fallback for the rest.
    const podWatchers = PodWatchers.shared;
    const release = podWatchers.hold();
    watcher = startSandboxWatcher({ db, client, providerFor, intervalMs: opts.watchIntervalMs ?? 2_000, logger: logger.child({ component: 'watcher' }), podWatchers });
    closers.unshift(async () => {
      await watcher!.stop();
      await release();
    });
    // Pods made before a restart are watched from the start, not from the next create.
    for (const p of await listProfiles(db)) {
      if (p.provider !== 'kubernetes') continue;
      try {
        const policy = policyFromProfile(p);
        const provider = providerFor(policy);
        if (provider instanceof KubernetesSandboxProvider) provider.watch(undefined, { namespace: policy.kubernetes?.settings.namespace });
      } catch (e) {
        logger.warn({ err: e, profile: p.name }, 'cannot watch the pods of a kubernetes profile');
      }
    }
  }

  const service = new SandboxService({
    db,
    client,
    taskQueue: serviceTaskQueue,
    providerFor,
    logger,
    metrics,
    allowUnconfined,
    fileLimitBytes: opts.fileLimitBytes,
    execConcurrency: opts.execConcurrency,
    requestsPerSecond: opts.requestsPerSecond,
    preview: opts.preview,
    workerId: opts.workerId,
    ownerGraceSeconds: opts.ownerGraceSeconds,
    historyEncrypted: (dataConverter.payloadCodecs?.length ?? 0) > 0,
  });
  // The broker listens before the API answers, so the port it advertises is the bound one (0 picks a free port).
  let ssh: SshBroker | undefined;
  if (opts.ssh) {
    const settings: SshSettings = { port: 0, publicHost: opts.ssh.publicHost, maxTokenMinutes: opts.ssh.maxTokenMinutes };
    service.configureSsh(settings);
    ssh = await startSshBroker({ service, hostKey: opts.ssh.hostKey, host: opts.ssh.host, port: opts.ssh.port, logger: logger.child({ component: 'ssh' }) });
    settings.port = ssh.port;
    closers.unshift(() => ssh!.close());
  }
  // Owner tunnels are authenticated with a key derived from the payload key both ends share.
  const tunnels = ownerTunnelKey ? new TunnelBroker(ownerTunnelKey, opts.tunnelUrl) : undefined;
  if (tunnels) service.configureTunnels(tunnels);
  let app: FastifyInstance | undefined;
  let url: string | undefined;
  if (opts.api !== false) {
    app = await buildApiServer({
      service,
      logger,
      fileLimitBytes: opts.fileLimitBytes,
      metrics: async () => ({ contentType: metrics.registry.contentType, body: await metrics.registry.metrics() }),
    });
    const listen = opts.api ?? { host: '127.0.0.1', port: 8787 };
    url = await app.listen({ host: listen.host, port: listen.port });
    if (tunnels && !tunnels.url) tunnels.url = url;
    // Fastify's close waits for every request in flight, a streamed exec's included: a command
    // may run for an hour. After the grace they are killed, so their callers get the kill's answer.
    closers.unshift(async () => {
      const closed = app!.close();
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([closed, new Promise((r) => (timer = setTimeout(r, opts.shutdownGraceMs ?? DEFAULT_SHUTDOWN_GRACE_MS)))]);
      clearTimeout(timer);
      service.stopCommands();
      await closed;
    });
  }

  return {
    url,
    sshPort: ssh?.port,
    app,
    service,
    metrics,
    client,
    watcher,
    serviceTaskQueue,
    replenishWarmPools,
    async close() {
      for (const close of closers) await close().catch(() => undefined);
      await connection.close();
    },
  };
}
