/**
 * The embedded Temporal: `temporal server start-dev` with SQLite persistence under the Slipway
 * data folder, the Web UI, and Slipway's search attributes registered at start.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, rmSync, statSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Connection } from '@temporalio/client';
import { SEARCH_ATTRIBUTE_CLI_TYPE, SLIPWAY_SEARCH_ATTRIBUTES } from '../core/search-attributes';
import { readJson, writeJsonAtomic } from '../lib/atomic-write';
import { temporalEndpointsFile } from '../lib/settings';
import { withoutPayloadKeys } from '../lib/payload-keys';
import { ensureTemporalBinary } from './temporal-binary';

export interface DevServerOptions {
  dataDir: string;
  port: number;
  uiPort?: number;
  /** No Web UI (tests). */
  headless?: boolean;
  namespace?: string;
  /** How long to wait for the server to accept connections. */
  startTimeoutMs?: number;
  binary?: string;
  /** Port of the server's Prometheus `/metrics` (default: a free one the CLI picks); the bench reads the server's work there. */
  metricsPort?: number;
}

export interface DevServer {
  address: string;
  /** Its HTTP API (`127.0.0.1:port`), also kept in `temporalEndpointsFile(dataDir)` while it runs. */
  httpAddress: string;
  uiUrl?: string;
  process: ChildProcess;
  logFile: string;
  stop(): Promise<void>;
}

/**
 * SQLite in write-ahead-log mode with `synchronous=normal` (ADR 0035): a commit appends to the
 * WAL without an fsync (the default rollback journal with `full` fsyncs the journal and the
 * database on every commit). A commit is in the WAL once the server's write returns, so a killed
 * server (kill -9) loses nothing; a power loss or kernel crash can lose the commits since the last
 * checkpoint, never corrupt the database.
 */
export const SQLITE_PRAGMAS: readonly string[] = ['journal_mode=wal', 'synchronous=normal'];
const SQLITE_PRAGMA_FLAGS = SQLITE_PRAGMAS.flatMap((p) => ['--sqlite-pragma', p]);

/**
 * Dynamic config of the embedded server (ADR 0039). The history service reads new transfer tasks
 * (a workflow task after a signal or an activity, an activity, a signal, a child start) at most
 * `transferProcessorMaxPollRPS` times a second per shard, 20 by default, and the dev server has
 * one shard: every hop of an objective waited about 45 ms for the next read once the limiter's
 * burst was spent. A read happens only when a task was written, so a higher cap costs nothing idle.
 */
export const DEV_SERVER_DYNAMIC_CONFIG: Readonly<Record<string, number>> = { 'history.transferProcessorMaxPollRPS': 1000 };
const DYNAMIC_CONFIG_FLAGS = Object.entries(DEV_SERVER_DYNAMIC_CONFIG).flatMap(([key, value]) => ['--dynamic-config-value', `${key}=${JSON.stringify(value)}`]);

export function searchAttributeFlags(): string[] {
  return SLIPWAY_SEARCH_ATTRIBUTES.flatMap((key) => ['--search-attribute', `${key.name}=${SEARCH_ATTRIBUTE_CLI_TYPE[key.type]}`]);
}

export async function isPortOpen(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ port, host });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

/** Waits until the server answers gRPC health checks (the SDK's own 5 s wait is too short on a busy machine). */
export async function waitForTemporal(address: string, timeoutMs: number, isAlive: () => boolean = () => true): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    if (!isAlive()) throw new Error('the Temporal dev server exited during start-up');
    try {
      const connection = await Connection.connect({ address, connectTimeout: 2_000 });
      try {
        await connection.healthService.check({});
        await connection.workflowService.getSystemInfo({});
        return;
      } finally {
        await connection.close();
      }
    } catch (e) {
      lastError = e;
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  throw new Error(`Temporal at ${address} did not become ready within ${timeoutMs} ms: ${(lastError as Error)?.message ?? 'no answer'}`);
}

/**
 * Starts `temporal server start-dev`. Besides the ports the caller chose (gRPC, Web UI, metrics if
 * given), the server listens on ports picked among free ones and bound a moment later: its HTTP
 * API (picked here) and its history, matching and worker services (picked by the CLI); on a busy
 * machine another process can take one in between ("address already in use" for a port nobody
 * asked for). Such a start is tried again, up to three times; any other failure is reported at
 * once with the server's own reason and its log.
 */
export async function startDevServer(opts: DevServerOptions): Promise<DevServer> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startDevServerOnce(opts);
    } catch (e) {
      if (attempt >= 3 || !(e instanceof AuxiliaryPortTaken)) throw e;
    }
  }
}

class AuxiliaryPortTaken extends Error {}

/**
 * Reads what a server that failed to start wrote: its reason (the CLI's `Error:` line, a panic, or
 * its last error log line), so the caller sees why without opening the log, and whether to try
 * again: a port was taken and none of them is one the caller chose (`chosenPorts`), which would
 * be taken again.
 */
export function readStartFailure(written: string, chosenPorts: readonly number[]): { retry: boolean; reason?: string } {
  const takenPorts = [...written.matchAll(/:(\d+): bind: address already in use/g)].map((m) => Number(m[1]));
  const retry = takenPorts.length > 0 && !takenPorts.some((p) => chosenPorts.includes(p));
  const lines = written.split('\n').map((l) => l.trim()).filter(Boolean);
  const errorLine = lines.find((l) => l.startsWith('Error: ')) ?? lines.find((l) => l.startsWith('panic: ')) ?? [...lines].reverse().find((l) => /"level":"(error|fatal)"/.test(l));
  let reason = errorLine?.replace(/^Error: /, '');
  if (reason?.startsWith('{')) {
    try {
      const entry = JSON.parse(reason) as { msg?: string; error?: string };
      reason = [entry.msg, entry.error].filter(Boolean).join(': ') || reason;
    } catch {
      // not one JSON entry: the line as written
    }
  }
  return { retry, reason: reason && reason.length > 400 ? `${reason.slice(0, 400)}…` : reason };
}

async function startDevServerOnce(opts: DevServerOptions): Promise<DevServer> {
  const binary = opts.binary ?? (await ensureTemporalBinary());
  mkdirSync(opts.dataDir, { recursive: true });
  const logFile = path.join(opts.dataDir, 'temporal-server.log');
  // Chosen here rather than by the CLI, so it can be recorded for `status`/`list` (ADR 0024); a
  // port taken between the pick and the bind is retried like the metrics port (AuxiliaryPortTaken).
  const httpPort = await freePort();
  const logStart = existsSync(logFile) ? statSync(logFile).size : 0;
  const log = openSync(logFile, 'a');
  const args = [
    'server',
    'start-dev',
    '--ip', '127.0.0.1',
    '--port', String(opts.port),
    '--db-filename', path.join(opts.dataDir, 'temporal.sqlite'),
    '--namespace', opts.namespace ?? 'default',
    '--log-level', 'warn',
    ...SQLITE_PRAGMA_FLAGS,
    ...DYNAMIC_CONFIG_FLAGS,
    '--http-port', String(httpPort),
    ...(opts.metricsPort ? ['--metrics-port', String(opts.metricsPort)] : []),
    ...searchAttributeFlags(),
    ...(opts.headless ? ['--headless'] : ['--ui-port', String(opts.uiPort ?? 8233)]),
  ];
  // The server stores what Slipway's clients and workers encrypted and never reads it: no payload keys.
  const child = spawn(binary, args, { stdio: ['ignore', log, log], detached: false, env: withoutPayloadKeys(process.env) });
  closeSync(log);
  let exited = false;
  child.once('exit', () => {
    exited = true;
  });
  const address = `127.0.0.1:${opts.port}`;
  const httpAddress = `127.0.0.1:${httpPort}`;
  const endpointsFile = temporalEndpointsFile(opts.dataDir);
  const stop = async () => {
    // Only our own record: a server started since (a restart) keeps its own.
    if ((await readJson<{ httpAddress?: string }>(endpointsFile))?.httpAddress === httpAddress) rmSync(endpointsFile, { force: true });
    if (exited) return;
    const done = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await done;
    clearTimeout(timer);
  };
  try {
    await waitForTemporal(address, opts.startTimeoutMs ?? 60_000, () => !exited);
  } catch (e) {
    await stop();
    const chosen = [opts.port, ...(opts.headless ? [] : [opts.uiPort ?? 8233]), ...(opts.metricsPort ? [opts.metricsPort] : [])];
    const { retry, reason } = readStartFailure(readFileSync(logFile, 'utf8').slice(logStart), chosen);
    const message = `${(e as Error).message}${reason ? `: ${reason}` : ''}\nServer log: ${logFile}`;
    throw retry ? new AuxiliaryPortTaken(message) : new Error(message);
  }
  await writeJsonAtomic(endpointsFile, { address, httpAddress });
  return {
    address,
    httpAddress,
    uiUrl: opts.headless ? undefined : `http://localhost:${opts.uiPort ?? 8233}`,
    process: child,
    logFile,
    stop,
  };
}

export interface SupervisedDevServer {
  /** The server running now (a new one after each restart). */
  readonly current: DevServer;
  stop(): Promise<void>;
}

/**
 * Keeps the embedded server up for `slipway dev`: when it exits on its own (killed, crashed),
 * starts it again on the same port and SQLite file, which keeps every workflow; the worker's
 * connection reconnects by itself. More than `maxRestarts` deaths within `windowMs`, or a restart
 * that fails, ends in `onFatal` with what happened, so `slipway dev` never stays up silently
 * without a server.
 */
export function superviseDevServer(
  first: DevServer,
  options: DevServerOptions,
  hooks: { log: (line: string) => void; onFatal: (message: string) => void },
  limits: { maxRestarts?: number; windowMs?: number } = {},
): SupervisedDevServer {
  const maxRestarts = limits.maxRestarts ?? 5;
  const windowMs = limits.windowMs ?? 10 * 60_000;
  let current = first;
  let stopping = false;
  const restarts: number[] = [];
  const watch = (server: DevServer) => {
    server.process.once('exit', (code, signal) => {
      if (!stopping && server === current) void restart(server, signal ? `was killed by ${signal}` : `exited with code ${code}`);
    });
  };
  const restart = async (dead: DevServer, how: string) => {
    const now = Date.now();
    while (restarts.length > 0 && restarts[0]! < now - windowMs) restarts.shift();
    if (restarts.length >= maxRestarts) {
      hooks.onFatal(`the Temporal dev server ${how}, its ${maxRestarts}th death within ${Math.round(windowMs / 60_000)} minutes; not restarting it again. Server log: ${dead.logFile}`);
      return;
    }
    restarts.push(now);
    hooks.log(`the Temporal dev server ${how}; restarting it (${restarts.length}/${maxRestarts}) on ${dead.address} with the same data. Server log: ${dead.logFile}`);
    try {
      const next = await startDevServer(options);
      if (stopping) {
        await next.stop();
        return;
      }
      current = next;
      watch(next);
      hooks.log(`Temporal dev server restarted at ${next.address}; the worker reconnects`);
    } catch (e) {
      if (!stopping) hooks.onFatal(`the Temporal dev server ${how} and could not be restarted: ${(e as Error).message}`);
    }
  };
  watch(first);
  return {
    get current() {
      return current;
    },
    async stop() {
      stopping = true;
      await current.stop();
    },
  };
}
