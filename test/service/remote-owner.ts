/**
 * The pieces the "sandbox held by another host" tests share (owner-calls, owner-sessions): a
 * separate `slipway api --no-http` process as the owner, with its own worker id and SLIPWAY_HOME,
 * and a WebSocket to a sandbox's exec endpoint that keeps every frame.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';
import { inject } from 'vitest';
import { BIN, waitFor } from '../helpers/cli';
import type { ServiceHarness } from './harness';

export interface OwnerProcess {
  child: ChildProcess;
  output: () => string;
}

/** Starts the owner and waits until its service worker polls; `env` adds to (or overrides) its environment. */
export async function startOwnerProcess(h: ServiceHarness, ownerId: string, env: Record<string, string> = {}): Promise<OwnerProcess> {
  let output = '';
  const base = { ...process.env };
  delete base.SLIPWAY_WORKER_ID;
  const child = spawn(process.execPath, [BIN, 'api', '--no-http', '--reaper-seconds', '3600', '--watch-seconds', '0'], {
    env: {
      ...base,
      DATABASE_URL: h.database.url,
      TEMPORAL_ADDRESS: inject('temporalAddress'),
      SLIPWAY_TASK_QUEUE: h.taskQueue,
      SLIPWAY_WORKER_ID: ownerId,
      SLIPWAY_HOME: mkdtempSync(path.join(os.tmpdir(), 'slipway-owner-home-')),
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout!.on('data', (c) => (output += c));
  child.stderr!.on('data', (c) => (output += c));
  const owner = { child, output: () => output };
  await waitFor(async () => output.includes('sandbox service worker on task queue') || (child.exitCode !== null && Promise.reject(new Error(output))), 'the owner process to poll', 120_000);
  return owner;
}

export interface ExecFrame {
  type: string;
  data?: string;
  exit_code?: number | null;
  timed_out?: boolean;
  code?: string;
  message?: string;
  issues?: Array<{ path: string }>;
}

/** A WebSocket to the exec endpoint, with every frame it got. */
export async function openExecSocket(url: string, token: string, id: string): Promise<{ ws: WebSocket; got: ExecFrame[]; closed: Promise<number>; text: () => string }> {
  const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/api/v1/sandboxes/${id}/exec/ws`, { headers: { authorization: `Bearer ${token}` } });
  const got: ExecFrame[] = [];
  ws.on('message', (d) => got.push(JSON.parse(d.toString()) as ExecFrame));
  const closed = new Promise<number>((resolve) => ws.on('close', (code) => resolve(code)));
  await new Promise<void>((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('unexpected-response', (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    ws.once('error', reject);
  });
  const text = () =>
    got
      .filter((f) => f.type === 'stdout' || f.type === 'stderr')
      .map((f) => f.data)
      .join('');
  return { ws, got, closed, text };
}
