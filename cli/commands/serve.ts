/** `slipway dev` (embedded server + worker in the foreground) and `slipway worker`. */
import type { DataConverter } from '@temporalio/common';
import { NativeConnection } from '@temporalio/worker';
import { isPortOpen, startDevServer, superviseDevServer, type DevServer } from '../../workers/dev-server';
import { slipwaySettings } from '../../lib/settings';
import { resolveWorkerId, WorkerIdError } from '../../lib/worker-id';
import { resolveTemporal, withPortHint } from '../../workers/temporal';
import { createSlipwayWorkers } from '../../workers/worker';
import { installRuntimeLogging } from '../../workers/logging';
import { slipwayDataConverter } from '../../workers/payload-codec';
import { ownerTaskQueue } from '../../core/ids';
import { CliError, EXIT } from '../exit-codes';

const log = (line: string) => process.stderr.write(`${line}\n`);

/** This worker's stable id: the flag, SLIPWAY_WORKER_ID, or the one kept under $SLIPWAY_HOME (a bad one: exit 2 naming it). */
async function workerIdOf(flag?: string): Promise<string> {
  const settings = slipwaySettings();
  try {
    return await resolveWorkerId(settings.dataDir, flag ?? settings.workerId);
  } catch (e) {
    if (e instanceof WorkerIdError) throw new CliError(flag !== undefined ? e.message.replace('SLIPWAY_WORKER_ID', '--id') : e.message, EXIT.badInput);
    throw e;
  }
}

async function runWorkerUntilSignal(address: string, namespace: string, dataConverter: DataConverter, workerId: string): Promise<void> {
  const settings = slipwaySettings();
  installRuntimeLogging(process.env.SLIPWAY_LOG_LEVEL ? undefined : 'INFO');
  const connection = await NativeConnection.connect({ address });
  const workers = await createSlipwayWorkers({
    connection,
    namespace,
    taskQueue: settings.taskQueue,
    agentConcurrency: settings.agentConcurrency,
    activityConcurrency: settings.activityConcurrency,
    workflowTaskConcurrency: settings.workflowTaskConcurrency,
    shutdownGraceMs: settings.shutdownGraceMs,
    dataConverter,
    workerId,
  });
  const stop = (signal: string) => {
    log(`${signal}: shutting down the worker (grace ${settings.shutdownGraceMs} ms)`);
    workers.shutdown();
  };
  process.once('SIGINT', () => stop('SIGINT'));
  process.once('SIGTERM', () => stop('SIGTERM'));
  log(`worker polling "${settings.taskQueue}" and its own "${ownerTaskQueue(settings.taskQueue, workerId)}" as worker ${workerId} (agents: "-agents" of each, concurrency ${settings.agentConcurrency}) on ${address}`);
  try {
    await workers.run();
  } finally {
    await connection.close();
  }
}

export async function devCommand(): Promise<number> {
  const settings = slipwaySettings();
  const dataConverter = slipwayDataConverter(); // a malformed SLIPWAY_PAYLOAD_KEY stops us before the server starts
  const workerId = await workerIdOf();
  if (settings.temporalAddress) throw new CliError('`slipway dev` starts the embedded server; unset TEMPORAL_ADDRESS or use `slipway worker`.');
  if (await isPortOpen(settings.embeddedPort)) {
    throw new CliError(`port ${settings.embeddedPort} is in use: is \`slipway dev\` already running? (set SLIPWAY_TEMPORAL_PORT to use another)`, EXIT.runFailed);
  }
  const serverOptions = { dataDir: settings.dataDir, port: settings.embeddedPort, uiPort: settings.uiPort, namespace: settings.namespace };
  let server: DevServer;
  try {
    server = await startDevServer(serverOptions);
  } catch (e) {
    throw new CliError(withPortHint((e as Error).message), EXIT.runFailed);
  }
  log(`Temporal dev server at ${server.address}; Web UI ${server.uiUrl}; data ${settings.dataDir}`);
  // A server that dies is restarted on the same SQLite file; one that cannot be stops `dev` with the reason.
  let fatal: string | undefined;
  const supervised = superviseDevServer(server, serverOptions, {
    log,
    onFatal: (message) => {
      fatal = message;
      log(`${message}; stopping the worker`);
      process.emit('SIGTERM'); // the worker's own shutdown path, with its grace time
    },
  });
  try {
    await runWorkerUntilSignal(server.address, settings.namespace, dataConverter, workerId);
  } finally {
    await supervised.stop();
    log('Temporal dev server stopped');
  }
  if (fatal) throw new CliError(`slipway dev stopped: ${fatal}`, EXIT.runFailed);
  return EXIT.ok;
}

export async function workerCommand(opts: { id?: string } = {}): Promise<number> {
  const settings = slipwaySettings();
  const dataConverter = slipwayDataConverter();
  const workerId = await workerIdOf(opts.id);
  let target;
  try {
    target = await resolveTemporal(settings, { startIfMissing: false });
  } catch (e) {
    throw new CliError((e as Error).message, EXIT.runFailed);
  }
  await runWorkerUntilSignal(target.address, target.namespace, dataConverter, workerId);
  return EXIT.ok;
}
