/** `slipway dev` (embedded server + worker in the foreground) and `slipway worker`. */
import type { DataConverter } from '@temporalio/common';
import { NativeConnection } from '@temporalio/worker';
import { isPortOpen, startDevServer, superviseDevServer, type DevServer } from '../../workers/dev-server';
import { slipwaySettings } from '../../lib/settings';
import { resolveTemporal } from '../../workers/temporal';
import { createSlipwayWorkers } from '../../workers/worker';
import { installRuntimeLogging } from '../../workers/logging';
import { slipwayDataConverter } from '../../workers/payload-codec';
import { CliError, EXIT } from '../exit-codes';

const log = (line: string) => process.stderr.write(`${line}\n`);

async function runWorkerUntilSignal(address: string, namespace: string, dataConverter: DataConverter): Promise<void> {
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
  });
  const stop = (signal: string) => {
    log(`${signal}: shutting down the worker (grace ${settings.shutdownGraceMs} ms)`);
    workers.shutdown();
  };
  process.once('SIGINT', () => stop('SIGINT'));
  process.once('SIGTERM', () => stop('SIGTERM'));
  log(`worker polling "${settings.taskQueue}" (agents: "${settings.taskQueue}-agents", concurrency ${settings.agentConcurrency}) on ${address}`);
  try {
    await workers.run();
  } finally {
    await connection.close();
  }
}

export async function devCommand(): Promise<number> {
  const settings = slipwaySettings();
  const dataConverter = slipwayDataConverter(); // a malformed SLIPWAY_PAYLOAD_KEY stops us before the server starts
  if (settings.temporalAddress) throw new CliError('`slipway dev` starts the embedded server; unset TEMPORAL_ADDRESS or use `slipway worker`.');
  if (await isPortOpen(settings.embeddedPort)) {
    throw new CliError(`port ${settings.embeddedPort} is in use: is \`slipway dev\` already running? (set SLIPWAY_TEMPORAL_PORT to use another)`, EXIT.runFailed);
  }
  const serverOptions = { dataDir: settings.dataDir, port: settings.embeddedPort, uiPort: settings.uiPort, namespace: settings.namespace };
  let server: DevServer;
  try {
    server = await startDevServer(serverOptions);
  } catch (e) {
    throw new CliError((e as Error).message, EXIT.runFailed);
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
    await runWorkerUntilSignal(server.address, settings.namespace, dataConverter);
  } finally {
    await supervised.stop();
    log('Temporal dev server stopped');
  }
  if (fatal) throw new CliError(`slipway dev stopped: ${fatal}`, EXIT.runFailed);
  return EXIT.ok;
}

export async function workerCommand(): Promise<number> {
  const settings = slipwaySettings();
  const dataConverter = slipwayDataConverter();
  let target;
  try {
    target = await resolveTemporal(settings, { startIfMissing: false });
  } catch (e) {
    throw new CliError((e as Error).message, EXIT.runFailed);
  }
  await runWorkerUntilSignal(target.address, target.namespace, dataConverter);
  return EXIT.ok;
}
