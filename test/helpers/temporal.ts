/** A real worker on the shared test server, on a task queue of its own. */
import { randomUUID } from 'node:crypto';
import { Client, Connection, type WorkflowHandle } from '@temporalio/client';
import { NativeConnection } from '@temporalio/worker';
import { inject } from 'vitest';
import { createSlipwayWorkers } from '../../workers/worker';
import { installRuntimeLogging } from '../../workers/logging';
import { slipwayDataConverter } from '../../workers/payload-codec';
import type { ActivityDeps } from '../../activities';

export interface TestWorker {
  client: Client;
  taskQueue: string;
  /** Stops the workers (the server keeps running). */
  stop(): Promise<void>;
}

/** On the shared test server, or on the server at `address` (a test that needs one of its own). */
export async function startTestWorker(opts: { deps?: ActivityDeps; agentConcurrency?: number; activityConcurrency?: number; address?: string } = {}): Promise<TestWorker> {
  installRuntimeLogging();
  const address = opts.address ?? inject('temporalAddress');
  const taskQueue = `test-${randomUUID().slice(0, 8)}`;
  const nativeConnection = await NativeConnection.connect({ address });
  const workers = await createSlipwayWorkers({
    connection: nativeConnection,
    taskQueue,
    workflowBundle: { codePath: inject('workflowBundlePath') },
    agentConcurrency: opts.agentConcurrency ?? 2,
    ...(opts.activityConcurrency ? { activityConcurrency: opts.activityConcurrency } : {}),
    shutdownGraceMs: 2_000,
    deps: opts.deps,
  });
  const running = workers.run();
  const connection = await Connection.connect({ address });
  return {
    // The same data converter as the workers (SLIPWAY_PAYLOAD_KEY from the environment, else the default).
    client: new Client({ connection, dataConverter: slipwayDataConverter() }),
    taskQueue,
    async stop() {
      workers.shutdown();
      await running;
      await nativeConnection.close();
      await connection.close();
    },
  };
}

/**
 * Every run of a workflow, newest first: the chain continue-as-new leaves, followed back through
 * each run's `continuedExecutionRunId` to the first.
 */
export async function runHistories(client: Client, workflowId: string): Promise<Array<{ runId: string; history: Awaited<ReturnType<WorkflowHandle['fetchHistory']>> }>> {
  const runs = [];
  let runId: string | undefined = (await client.workflow.getHandle(workflowId).describe()).runId;
  while (runId) {
    const history = await client.workflow.getHandle(workflowId, runId).fetchHistory();
    runs.push({ runId, history });
    runId = history.events?.[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId || undefined;
  }
  return runs;
}

/**
 * A workflow's whole history as text, payloads decoded. Walks the objects itself: JSON.stringify
 * would call protobufjs' toJSON, which turns payload bytes into base64 and hides their content.
 */
export async function historyText(client: Client, workflowId: string): Promise<string> {
  // Every run of the workflow, oldest first: a stream continues as new per fix iteration.
  const history = (await runHistories(client, workflowId)).map((r) => r.history).reverse();
  const parts: string[] = [];
  const seen = new Set<unknown>();
  const walk = (value: unknown): void => {
    if (value === null || value === undefined) return;
    if (value instanceof Uint8Array) parts.push(Buffer.from(value).toString('utf8'));
    else if (typeof value === 'string') parts.push(value);
    else if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') parts.push(String(value));
    else if (typeof value === 'object' && !seen.has(value)) {
      seen.add(value);
      for (const key of Object.keys(value)) walk((value as Record<string, unknown>)[key]);
    }
  };
  walk(history);
  return parts.join('\n');
}
