/**
 * `slipway api`: the sandbox service (REST, MCP over HTTP, metrics) with its worker, watcher
 * and reaper schedule, on the embedded Temporal and billing unless TEMPORAL_ADDRESS and
 * DATABASE_URL say otherwise. `slipway mcp`: the MCP tools over stdio, as a client of the API.
 */
import type { Command } from 'commander';
import path from 'node:path';
import type { Db } from '../../activities/billing/db';
import { slipwaySettings } from '../../lib/settings';
import { resolveWorkerId, WorkerIdError } from '../../lib/worker-id';
import { ALLOW_UNCONFINED_ENV, allowUnconfinedFromEnv } from '../../core/sandbox-service';
import { CliError, EXIT } from '../exit-codes';
import { portNumber, wholeNumber } from '../numbers';
import { GROUP_DESCRIPTIONS } from '../verbs';
import { DEFAULT_PREVIEW_DOMAIN, loadPreviewKey } from '../../activities/service/preview';


const PREVIEW_DOMAIN = /^(?=.{1,200}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/;
import { apiClientFromEnv } from './sandbox';

const log = (line: string) => process.stderr.write(`${line}\n`);

export async function apiCommand(opts: {
  host: string;
  port: number;
  worker: boolean;
  http: boolean;
  reaperSeconds: number;
  watchSeconds: number;
  allowUnconfined?: boolean;
  maxFileMb?: number;
  rate?: number;
  previewDomain?: string | false;
  sshPort?: number;
  sshHost?: string;
  sshPublicHost?: string;
  sshMaxTokenMinutes?: number;
  tunnelUrl?: string;
}): Promise<number> {
  // Loaded when the service starts, not when the module is: `slipway api --help` need not load
  // the Temporal SDK and the billing database (ADR 0016, 3).
  const { BILLING_DIR, openBillingDb } = require('../../activities/billing/db') as typeof import('../../activities/billing/db');
  const { billingSocketPath, serveBillingSocket } = require('../../activities/billing/socket') as typeof import('../../activities/billing/socket');
  const { resolveTemporal } = require('../../workers/temporal') as typeof import('../../workers/temporal');
  const { installRuntimeLogging } = require('../../workers/logging') as typeof import('../../workers/logging');
  const { slipwayDataConverter } = require('../../workers/payload-codec') as typeof import('../../workers/payload-codec');
  const { probeBwrap, requireBwrap } = require('../../activities/sandbox/bubblewrap') as typeof import('../../activities/sandbox/bubblewrap');
  if (!opts.worker && !opts.http) throw new CliError('--no-worker and --no-http together leave nothing to run');
  const sshPort = opts.sshPort ?? (process.env.SLIPWAY_SSH_PORT ? portNumber('SLIPWAY_SSH_PORT')(process.env.SLIPWAY_SSH_PORT) : undefined);
  const previewDomain = opts.previewDomain === false ? undefined : (opts.previewDomain ?? DEFAULT_PREVIEW_DOMAIN).toLowerCase();
  if (previewDomain !== undefined && !PREVIEW_DOMAIN.test(previewDomain)) {
    throw new CliError(`--preview-domain: "${previewDomain}" is not a domain name (letters, digits, "-" and ".", e.g. preview.example.com)`);
  }
  const allowUnconfined = opts.allowUnconfined ?? false;
  if (allowUnconfined) {
    log(`WARNING: --allow-unconfined: profiles with confinement "none" run tenants' commands on this host as this user; use it only for a single-tenant setup`);
  } else {
    // Checked before anything starts: the service confines every tenant with bubblewrap.
    try {
      await probeBwrap(requireBwrap());
    } catch (e) {
      throw new CliError(`slipway api runs every tenant under bubblewrap: ${(e as Error).message} (or pass --allow-unconfined, ${ALLOW_UNCONFINED_ENV}=1, for a single-tenant setup)`, EXIT.runFailed);
    }
  }
  const tunnelUrl = opts.tunnelUrl ?? (process.env.SLIPWAY_API_TUNNEL_URL || undefined);
  if (tunnelUrl !== undefined && !/^https?:\/\/[^\s/]+(\/\S*)?$/.test(tunnelUrl)) {
    throw new CliError(`--tunnel-url: "${tunnelUrl}" is not an http(s) URL (where workers on other hosts reach this API, e.g. http://api.internal:8787)`, EXIT.badInput);
  }
  const settings = slipwaySettings();
  const dataConverter = slipwayDataConverter(); // checked before anything starts
  // This host's worker id (ADR 0013): owner of the sandboxes it creates; exec and files on another host's go through that owner.
  const workerId = await resolveWorkerId(settings.dataDir, settings.workerId).catch((e: Error) => {
    throw e instanceof WorkerIdError ? new CliError(e.message, EXIT.badInput) : e;
  });
  let target;
  try {
    target = await resolveTemporal(settings, { startIfMissing: true });
  } catch (e) {
    throw new CliError((e as Error).message, EXIT.runFailed);
  }
  if (target.server) log(`started the embedded Temporal server at ${target.address} (Web UI ${target.uiUrl})`);
  let db: Db;
  try {
    db = await openBillingDb({ databaseUrl: process.env.DATABASE_URL || undefined, dataDir: settings.dataDir });
  } catch (e) {
    await target.server?.stop();
    throw new CliError((e as Error).message, EXIT.runFailed);
  }
  // The operator's CLI reaches the embedded billing database through this process while it runs (socket.ts).
  let billingSocket: { close(): Promise<void> } | undefined;
  if (db.engine === 'pglite') {
    const socketPath = billingSocketPath(path.join(settings.dataDir, BILLING_DIR));
    billingSocket = await serveBillingSocket(db, socketPath).catch((e: Error) => {
      log(`WARNING: ${e.message}; \`slipway account\`, \`token\` and \`profile\` cannot reach the billing database while this runs`);
      return undefined;
    });
  }
  installRuntimeLogging();
  // Loaded here: the HTTP server and the worker are heavy, and other verbs do not need them.
  const { serviceLogger, startSandboxServiceHost } = require('../../workers/sandbox-service') as typeof import('../../workers/sandbox-service');
  const host = await startSandboxServiceHost({
    db,
    temporalAddress: target.address,
    namespace: target.namespace,
    taskQueue: settings.taskQueue,
    api: opts.http ? { host: opts.host, port: opts.port } : false,
    worker: opts.worker,
    reaper: { intervalMs: opts.reaperSeconds * 1000 },
    watchIntervalMs: opts.watchSeconds * 1000,
    logger: serviceLogger(),
    defaultMetrics: true,
    allowUnconfined,
    dataConverter,
    workerId,
    ownerGraceSeconds: settings.ownerGraceSeconds,
    shutdownGraceMs: settings.shutdownGraceMs,
    ...(tunnelUrl ? { tunnelUrl } : {}),
    ...(opts.maxFileMb !== undefined ? { fileLimitBytes: opts.maxFileMb * 1024 * 1024 } : {}),
    ...(opts.rate !== undefined ? { requestsPerSecond: opts.rate } : {}),
    ...(previewDomain !== undefined ? { preview: { key: await loadPreviewKey(settings.dataDir), domain: previewDomain } } : {}),
    ...(sshPort !== undefined
      ? {
          ssh: {
            host: opts.sshHost ?? opts.host,
            port: sshPort,
            hostKey: await (require('../../api/ssh-server') as typeof import('../../api/ssh-server')).loadSshHostKey(settings.dataDir),
            ...(opts.sshPublicHost ? { publicHost: opts.sshPublicHost } : {}),
            ...(opts.sshMaxTokenMinutes !== undefined ? { maxTokenMinutes: opts.sshMaxTokenMinutes } : {}),
          },
        }
      : {}),
  });
  if (host.sshPort !== undefined) log(`SSH broker on port ${host.sshPort} (tokens: POST /api/v1/sandboxes/{id}/ssh_tokens)`);
  if (host.url) log(`sandbox API on ${host.url} (OpenAPI ${host.url}/api/v1/openapi.json, MCP ${host.url}/mcp, metrics ${host.url}/metrics${previewDomain ? `, previews at <id>-<port>.${previewDomain}` : ''}); billing database: ${db.engine}`);
  else log(`sandbox service worker on task queue ${host.serviceTaskQueue} (no HTTP); billing database: ${db.engine}`);
  await new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
  log('shutting down');
  await host.close();
  await billingSocket?.close();
  await db.close();
  await target.server?.stop();
  return EXIT.ok;
}

export async function mcpStdioCommand(): Promise<number> {
  const { StdioServerTransport } = require('@modelcontextprotocol/sdk/server/stdio.js') as typeof import('@modelcontextprotocol/sdk/server/stdio.js');
  const { buildMcpServer } = require('../../api/mcp') as typeof import('../../api/mcp');
  const server = buildMcpServer(apiClientFromEnv());
  const transport = new StdioServerTransport();
  await server.connect(transport);
  await new Promise<void>((resolve) => {
    transport.onclose = () => resolve();
    process.stdin.once('end', () => resolve());
  });
  await server.close();
  return EXIT.ok;
}

export function registerApiCommands(program: Command, setExit: (code: number) => void): void {

  program
    .command('api')
    .description(GROUP_DESCRIPTIONS.api)
    .option('--host <host>', 'listen address', process.env.SLIPWAY_API_HOST || '127.0.0.1')
    .option('--port <port>', 'listen port', portNumber('--port'), Number(process.env.SLIPWAY_API_PORT || 8787))
    .option('--no-worker', 'serve HTTP only; sandbox workflows run on workers elsewhere')
    .option('--no-http', 'run only the service worker, watcher and reaper (scale-out with a remote provider)')
    .option('--reaper-seconds <n>', 'reaper schedule interval', wholeNumber('--reaper-seconds', { min: 1 }), 60)
    .option('--watch-seconds <n>', 'provider watcher interval (0: off)', wholeNumber('--watch-seconds'), 2)
    .option('--allow-unconfined', `serve profiles with confinement "none" (commands run on this host; single-tenant setups only; env ${ALLOW_UNCONFINED_ENV}=1)`, allowUnconfinedFromEnv())
    .option('--max-file-mb <n>', 'largest file the files API accepts or returns (MiB)', wholeNumber('--max-file-mb', { min: 1 }))
    .option('--rate <n>', 'requests per second per account, bursts of twice that (0: off; default 50)', wholeNumber('--rate'))
    .option('--preview-domain <domain>', `preview ports are served at <id>-<port>.<domain> on this listener (env SLIPWAY_PREVIEW_DOMAIN; default ${DEFAULT_PREVIEW_DOMAIN})`, process.env.SLIPWAY_PREVIEW_DOMAIN || undefined)
    .option('--no-preview-domain', 'turn preview ports off')
    .option('--ssh-port <port>', 'serve the SSH broker on this port (env SLIPWAY_SSH_PORT; off unless set)', portNumber('--ssh-port'))
    .option('--ssh-host <host>', 'listen address of the SSH broker (default: --host)')
    .option('--ssh-public-host <host>', 'the host name SSH clients are told to connect to (default: the API request\'s host)')
    .option('--tunnel-url <url>', 'where workers on other hosts reach this API to carry sessions and previews of their sandboxes (env SLIPWAY_API_TUNNEL_URL; default: the listen address)')
    .option('--ssh-max-token-minutes <n>', 'longest SSH token lifetime a caller may ask for (default 1440)', wholeNumber('--ssh-max-token-minutes', { min: 1 }))
    .action(async (opts) => setExit(await apiCommand(opts)));
  program
    .command('mcp')
    .description(GROUP_DESCRIPTIONS.mcp)
    .action(async () => setExit(await mcpStdioCommand()));
}
