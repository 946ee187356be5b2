/**
 * Slipway's workers: one hosts the workflows and the git/gate/sandbox activities; agent runs
 * have their own task queue with a small, explicit concurrency. A worker with an id also polls
 * its own queues (`<queue>@<id>` and its agents queue) for the activities of the sandboxes it
 * holds (docs/adr/0013-worker-ownership.md).
 */
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Client } from '@temporalio/client';
import type { DataConverter } from '@temporalio/common';
import { NativeConnection, Worker, bundleWorkflowCode, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { agentTaskQueue, ownerTaskQueue } from '../core/ids';
import { createActivities, createAgentActivities, defaultActivityDeps, type ActivityDeps } from '../activities';
import { createJanitorActivities, temporalHomeOf } from '../activities/sandbox/janitor';
import { createOwnerActivities } from '../activities/owners';
import { createWorkflowEndActivities } from '../activities/workflow-ends';
import { PodWatchers } from '../activities/sandbox/kube-watch';
import { slipwayDataConverter } from './payload-codec';
import { DEFAULT_SHUTDOWN_GRACE_MS, DEFAULT_WORKFLOW_TASK_CONCURRENCY } from '../lib/settings';
import { startSpawner } from '../lib/spawner';

// '.ts' when run from source, '.js' from the compiled package (dist/).
const SOURCE_EXT = path.extname(__filename);
export const WORKFLOWS_PATH = path.join(__dirname, '..', 'workflows', `index${SOURCE_EXT}`);
/** Written by scripts/build.cjs beside the compiled code, from the same sources, so it is never stale. */
export const PREBUILT_WORKFLOW_BUNDLE = path.join(__dirname, '..', 'workflow-bundle.js');

export interface SlipwayWorkerOptions {
  connection: NativeConnection;
  namespace?: string;
  taskQueue: string;
  /** A pre-built bundle (tests bundle once per run); otherwise the package's own (dist/workflow-bundle.js), else bundled now. */
  workflowBundle?: WorkflowBundleWithSourceMap | { codePath: string };
  agentConcurrency?: number;
  activityConcurrency?: number;
  /** Workflow tasks at once (default: lib/settings.ts DEFAULT_WORKFLOW_TASK_CONCURRENCY). */
  workflowTaskConcurrency?: number;
  shutdownGraceMs?: number;
  deps?: ActivityDeps;
  /** Payload codecs shared with the clients; default: from the environment (workers/payload-codec.ts). */
  dataConverter?: DataConverter;
  /**
   * This worker's stable id (lib/worker-id.ts): the sandboxes it creates are owned by it and
   * their activities come to its own queues. Without one, every activity runs on the shared queues.
   */
  workerId?: string;
}

export interface SlipwayWorkers {
  /** Resolves when both workers have stopped. */
  run(): Promise<void>;
  shutdown(): void;
}

export async function bundleWorkflows(): Promise<WorkflowBundleWithSourceMap> {
  return bundleWorkflowCode({ workflowsPath: WORKFLOWS_PATH, logger: quietBundlerLogger });
}

/**
 * The compiled package's bundle, built once at build time: bundling takes seconds of CPU that
 * every worker start would otherwise pay. From source there is none and the workflows are bundled.
 */
export function prebuiltWorkflowBundle(): { codePath: string } | undefined {
  return SOURCE_EXT === '.js' && existsSync(PREBUILT_WORKFLOW_BUNDLE) ? { codePath: PREBUILT_WORKFLOW_BUNDLE } : undefined;
}

const quietBundlerLogger = {
  log: () => undefined,
  trace: () => undefined,
  debug: () => undefined,
  info: () => undefined,
  warn: (message: string) => console.warn(message),
  error: (message: string) => console.error(message),
};

export async function createSlipwayWorkers(opts: SlipwayWorkerOptions): Promise<SlipwayWorkers> {
  const dataConverter = opts.dataConverter ?? slipwayDataConverter();
  // The janitor asks Temporal whether objectives still run, through a client on this connection;
  // objectives are registered with this cluster and namespace, so a janitor sweeps only its own.
  const client = new Client({ connection: opts.connection, namespace: opts.namespace ?? 'default', dataConverter });
  const home = temporalHomeOf(client);
  const deps = { temporalHome: home, ...(opts.deps ?? defaultActivityDeps()), ...(opts.workerId ? { workerId: opts.workerId } : {}) };
  const shutdownGraceTime = opts.shutdownGraceMs ?? DEFAULT_SHUTDOWN_GRACE_MS;
  // One set of activities serves the shared and the owner queues (their in-process state is shared).
  const activities = { ...createActivities(deps), ...createJanitorActivities({ client, temporalHome: home }), ...createOwnerActivities({ client }), ...createWorkflowEndActivities({ client }) };
  const agentActivities = createAgentActivities(deps);
  // The history's ActivityTaskStarted events name the worker id, so where each activity ran can be read there.
  const identity = opts.workerId ? { identity: `${process.pid}@${os.hostname()}/${opts.workerId}` } : {};
  const main = await Worker.create({
    ...identity,
    connection: opts.connection,
    namespace: opts.namespace ?? 'default',
    taskQueue: opts.taskQueue,
    workflowBundle: opts.workflowBundle ?? prebuiltWorkflowBundle() ?? (await bundleWorkflows()),
    dataConverter,
    activities,
    maxConcurrentActivityTaskExecutions: opts.activityConcurrency ?? 4,
    maxConcurrentWorkflowTaskExecutions: opts.workflowTaskConcurrency ?? DEFAULT_WORKFLOW_TASK_CONCURRENCY,
    shutdownGraceTime,
  });
  const activityWorker = (taskQueue: string, acts: object, concurrency: number) =>
    Worker.create({
      ...identity,
      connection: opts.connection,
      namespace: opts.namespace ?? 'default',
      taskQueue,
      dataConverter,
      activities: acts,
      maxConcurrentActivityTaskExecutions: concurrency,
      shutdownGraceTime,
    });
  const workers = [main, await activityWorker(agentTaskQueue(opts.taskQueue), agentActivities, opts.agentConcurrency ?? 2)];
  if (opts.workerId) {
    const own = ownerTaskQueue(opts.taskQueue, opts.workerId);
    workers.push(await activityWorker(own, activities, opts.activityConcurrency ?? 4));
    workers.push(await activityWorker(agentTaskQueue(own), agentActivities, opts.agentConcurrency ?? 2));
  }
  return {
    async run() {
      // While it runs, the Kubernetes provider watches each namespace it makes or probes pods in
      // (one informer each, kube-watch.ts): its probe answers from what the informer saw.
      const release = PodWatchers.shared.hold();
      // Git runs through a small spawner process: forking this big one per call is what costs (ADR 0036).
      const releaseSpawner = startSpawner();
      const runs = workers.map((w) => w.run());
      try {
        await Promise.all(runs);
      } catch (e) {
        // One worker failing takes the other down too, so the process never half-serves.
        for (const w of workers) if (w.getState() === 'RUNNING') w.shutdown();
        await Promise.allSettled(runs);
        throw e;
      } finally {
        releaseSpawner();
        await release();
      }
    },
    shutdown() {
      for (const w of workers) if (w.getState() === 'RUNNING') w.shutdown();
    },
  };
}
