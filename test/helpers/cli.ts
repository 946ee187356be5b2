/** Runs the real `slipway` CLI as a child process. */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { PROJECT_ROOT } from './repo';

/** The CLI run from source (see slipway-from-source.cjs); the published bin/slipway.cjs runs dist/. */
export const BIN = path.join(PROJECT_ROOT, 'test', 'helpers', 'slipway-from-source.cjs');

export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function slipway(args: string[], env: NodeJS.ProcessEnv = {}, cwd = PROJECT_ROOT): Promise<CliRun> {
  return new Promise((resolve) => {
    const base = { ...process.env };
    delete base.TEMPORAL_ADDRESS;
    const child = spawn(process.execPath, [BIN, ...args], { cwd, env: { ...base, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** Polls `probe` until it returns a truthy value. */
export async function waitFor<T>(probe: () => Promise<T | undefined | false>, what: string, timeoutMs = 60_000, intervalMs = 250): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const value = await probe();
      if (value) return value;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
}
