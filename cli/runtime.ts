/**
 * What a CLI command needs to talk to Temporal: a client, and, when the command started the
 * embedded server itself, an in-process worker that lives as long as the command.
 */
import type { NativeConnection } from '@temporalio/worker';
import type { Client } from '@temporalio/client';
import { objectiveWorkflowId } from '../core/ids';
import { slipwaySettings, type SlipwaySettings } from '../lib/settings';
import type { TemporalTarget } from '../workers/temporal';
import type { SlipwayWorkers } from '../workers/worker';
import { resolveWorkerId, WorkerIdError } from '../lib/worker-id';
import { CliError, EXIT } from './exit-codes';

// Loaded when a command opens the runtime, not when its module is loaded: command modules import
// this one, and `slipway <verb> --help` must not pay for the Temporal SDK (ADR 0016).
// The worker's modules (activities and all) only when this process hosts a worker.
const lazy = {
  client: () => require('@temporalio/client') as typeof import('@temporalio/client'),
  temporal: () => require('../workers/temporal') as typeof import('../workers/temporal'),
  codec: () => require('../workers/payload-codec') as typeof import('../workers/payload-codec'),
  worker: () => require('@temporalio/worker') as typeof import('@temporalio/worker'),
  workers: () => require('../workers/worker') as typeof import('../workers/worker'),
  logging: () => require('../workers/logging') as typeof import('../workers/logging'),
};

export interface Runtime {
  settings: SlipwaySettings;
  target: TemporalTarget;
  client: Client;
  /** True when this process hosts a worker (it started the embedded server). */
  hostsWorker: boolean;
  close(): Promise<void>;
}

export async function openRuntime(opts: { startIfMissing: boolean; log?: (line: string) => void }): Promise<Runtime> {
  const { connectClient, resolveTemporal } = lazy.temporal();
  const { slipwayDataConverter } = lazy.codec();
  const settings = slipwaySettings();
  // Read (and checked: PayloadKeyError, exit 2) before anything starts; clients and the worker share it.
  const dataConverter = slipwayDataConverter();
  // Checked before anything starts, like the payload key: a bad SLIPWAY_WORKER_ID is bad input.
  const workerId = opts.startIfMissing
    ? await resolveWorkerId(settings.dataDir, settings.workerId).catch((e: Error) => {
        throw e instanceof WorkerIdError ? new CliError(e.message, EXIT.badInput) : e;
      })
    : undefined;
  let target: TemporalTarget;
  try {
    target = await resolveTemporal(settings, { startIfMissing: opts.startIfMissing });
  } catch (e) {
    throw new CliError((e as Error).message, EXIT.runFailed);
  }
  if (target.server) opts.log?.(`started the embedded Temporal server at ${target.address} (Web UI ${target.uiUrl}, data in ${settings.dataDir})`);
  const { client, close: closeClient } = await connectClient(target, dataConverter);
  let workers: SlipwayWorkers | undefined;
  let workerRun: Promise<void> | undefined;
  let nativeConnection: NativeConnection | undefined;
  if (target.server) {
    const { NativeConnection } = lazy.worker();
    const { createSlipwayWorkers } = lazy.workers();
    lazy.logging().installRuntimeLogging();
    nativeConnection = await NativeConnection.connect({ address: target.address });
    workers = await createSlipwayWorkers({
      connection: nativeConnection,
      namespace: target.namespace,
      taskQueue: settings.taskQueue,
      agentConcurrency: settings.agentConcurrency,
      activityConcurrency: settings.activityConcurrency,
      shutdownGraceMs: settings.shutdownGraceMs,
      dataConverter,
      workerId,
    });
    workerRun = workers.run();
  }
  return {
    settings,
    target,
    client,
    hostsWorker: workers !== undefined,
    async close() {
      workers?.shutdown();
      await workerRun?.catch(() => undefined);
      await nativeConnection?.close();
      await closeClient();
      await target.server?.stop();
    },
  };
}

/** Warns when no worker polls the task queue, so a started run does not silently sit there. */
export async function hasWorkflowPollers(client: Client, namespace: string, taskQueue: string): Promise<boolean> {
  const response = await client.workflowService.describeTaskQueue({
    namespace,
    taskQueue: { name: taskQueue },
    taskQueueType: 1, // TASK_QUEUE_TYPE_WORKFLOW
  });
  return (response.pollers ?? []).length > 0;
}

/**
 * An objective's workflow handle and description; an unknown id is bad input (exit 2) naming it.
 * One place for `status`, `watch`, `cancel` and the human loop.
 */
export async function describeObjective(client: Client, objectiveId: string) {
  const handle = client.workflow.getHandle(objectiveWorkflowId(objectiveId));
  try {
    return { handle, description: await handle.describe() };
  } catch (e) {
    if (e instanceof lazy.client().WorkflowNotFoundError) throw new CliError(`no objective "${objectiveId}"`, EXIT.badInput);
    throw e;
  }
}
