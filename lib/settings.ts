/** Process-level settings from the environment, read in one place. */
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_TASK_QUEUE } from '../core/ids';
import { DEFAULT_OWNER_GRACE_SECONDS } from '../core/routing';

export interface SlipwaySettings {
  /** Set when TEMPORAL_ADDRESS is given: connect there and start nothing. */
  temporalAddress?: string;
  /**
   * TEMPORAL_HTTP_ADDRESS: the HTTP API of the server at TEMPORAL_ADDRESS (`host:port` or a URL),
   * which lets `status` and `list` answer without loading the Temporal SDK (ADR 0024).
   */
  temporalHttpAddress?: string;
  namespace: string;
  /** Port of the embedded server (and where `run` looks for a running `slipway dev`). */
  embeddedPort: number;
  uiPort: number;
  dataDir: string;
  taskQueue: string;
  agentConcurrency: number;
  activityConcurrency: number;
  workflowTaskConcurrency: number;
  shutdownGraceMs: number;
  /** SLIPWAY_WORKER_ID: this worker's id, instead of the one kept under dataDir (lib/worker-id.ts). */
  workerId?: string;
  /** How long a sandbox's owner may be unreachable before its sandboxes are given up (SLIPWAY_OWNER_GRACE_SECONDS). */
  ownerGraceSeconds: number;
}

/**
 * Workflow tasks a worker runs at once. With 4, a 16-stream objective's tasks waited 390 s in all
 * for a slot, with 16 81 s (bench/orchestration.ts, ADR 0018): they are short and mostly wait on
 * the server, so more of them in flight use the cores better.
 */
export const DEFAULT_WORKFLOW_TASK_CONCURRENCY = 16;
/** How long a stopping worker or API lets running work go on before it is killed (SLIPWAY_SHUTDOWN_GRACE_MS). */
export const DEFAULT_SHUTDOWN_GRACE_MS = 10_000;

const int = (value: string | undefined, fallback: number, name: string): number => {
  if (value === undefined || value === '') return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`${name} must be a positive integer, got "${value}"`);
  return n;
};

/** `$SLIPWAY_HOME`, else `$XDG_DATA_HOME/slipway`, else `~/.local/share/slipway`: Slipway's data folder. */
export function slipwayHome(env: NodeJS.ProcessEnv = process.env): string {
  return env.SLIPWAY_HOME || path.join(env.XDG_DATA_HOME || path.join(os.homedir(), '.local', 'share'), 'slipway');
}

export function slipwaySettings(env: NodeJS.ProcessEnv = process.env): SlipwaySettings {
  return {
    temporalAddress: env.TEMPORAL_ADDRESS || undefined,
    temporalHttpAddress: env.TEMPORAL_HTTP_ADDRESS || undefined,
    namespace: env.TEMPORAL_NAMESPACE || 'default',
    embeddedPort: int(env.SLIPWAY_TEMPORAL_PORT, 7233, 'SLIPWAY_TEMPORAL_PORT'),
    uiPort: int(env.SLIPWAY_UI_PORT, 8233, 'SLIPWAY_UI_PORT'),
    dataDir: slipwayHome(env),
    taskQueue: env.SLIPWAY_TASK_QUEUE || DEFAULT_TASK_QUEUE,
    agentConcurrency: int(env.SLIPWAY_AGENT_CONCURRENCY, 2, 'SLIPWAY_AGENT_CONCURRENCY'),
    activityConcurrency: int(env.SLIPWAY_ACTIVITY_CONCURRENCY, 4, 'SLIPWAY_ACTIVITY_CONCURRENCY'),
    workflowTaskConcurrency: int(env.SLIPWAY_WORKFLOW_TASK_CONCURRENCY, DEFAULT_WORKFLOW_TASK_CONCURRENCY, 'SLIPWAY_WORKFLOW_TASK_CONCURRENCY'),
    shutdownGraceMs: int(env.SLIPWAY_SHUTDOWN_GRACE_MS, DEFAULT_SHUTDOWN_GRACE_MS, 'SLIPWAY_SHUTDOWN_GRACE_MS'),
    workerId: env.SLIPWAY_WORKER_ID || undefined,
    ownerGraceSeconds: int(env.SLIPWAY_OWNER_GRACE_SECONDS, DEFAULT_OWNER_GRACE_SECONDS, 'SLIPWAY_OWNER_GRACE_SECONDS'),
  };
}

/**
 * Where the embedded server's addresses are kept while it runs (`{ address, httpAddress }`), beside
 * its SQLite file: the CLI reads the HTTP API's port there (ADR 0024).
 */
export const temporalEndpointsFile = (dataDir: string) => path.join(dataDir, 'temporal-endpoints.json');
