/**
 * One real Temporal dev server for the whole test run (own port, own SQLite file) and one
 * workflow bundle, shared by every test file through `inject`.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startDevServer, type DevServer } from '../workers/dev-server';
import { testPort } from './helpers/ports';
import { bundleWorkflows } from '../workers/worker';

declare module 'vitest' {
  export interface ProvidedContext {
    temporalAddress: string;
    workflowBundlePath: string;
  }
}

let server: DevServer | undefined;
let dir: string | undefined;

/** `project` is vitest's TestProject; typed structurally because vitest/node is ESM-only. */
export async function setup(project: { provide(key: 'temporalAddress' | 'workflowBundlePath', value: string): void }) {
  dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-test-temporal-'));
  const [port, bundle] = await Promise.all([
    testPort(),
    bundleWorkflows(),
  ]);
  server = await startDevServer({ dataDir: dir, port, headless: true, startTimeoutMs: 120_000 });
  const bundlePath = path.join(dir, 'workflow-bundle.js');
  writeFileSync(bundlePath, bundle.code);
  project.provide('temporalAddress', server.address);
  project.provide('workflowBundlePath', bundlePath);
}

export async function teardown() {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
}
