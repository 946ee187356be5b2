/**
 * Stopping the service host (`slipway api` on SIGTERM) with commands still running for callers.
 * Fastify's close waits for every request in flight, and a streamed exec's default timeout is
 * 300 s (at most an hour): before the grace, a stop waited that long (the OpenAPI fuzzer's run
 * hung in its teardown). Now commands get the grace to finish, then are killed, and their
 * callers get the kill's answer.
 */
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { getSandboxById } from '../../activities/billing/records';
import type { ExecFrame } from './remote-owner';
import { waitFor } from '../helpers/cli';
import { processesWith } from '../sandbox/helpers';
import { rawRequest, startServiceHarness } from './harness';

/** Processes whose command line carries `marker` (the commands run under bubblewrap, visible from here). */
const running = async (marker: string) => (await processesWith(marker)).length;

const frames = async (res: Response) =>
  (await res.text())
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as ExecFrame);

async function readyHarness(shutdownGraceMs: number) {
  const h = await startServiceHarness({ shutdownGraceMs });
  const a = await h.account({ limit: 1 });
  await a.profile({ name: 'linux' });
  const id = (await a.api.create({ profile: 'linux' })).id;
  await h.waitFor(a.api, id, ['ready']);
  const exec = (body: Record<string, unknown>) => rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/exec`, { token: a.token, body: JSON.stringify(body) });
  const root = (await getSandboxById(h.database.db, id))!.root!;
  return { h, exec, root };
}

describe('stopping the service host', () => {
  it('kills the commands still running after the grace: a streamed exec ends with its exit frame, a plain exec gets its result, nothing is left', async () => {
    const { h, exec } = await readyHarness(200);
    const marker = `slipway-stop-${randomBytes(6).toString('hex')}`;
    // The response's head comes once the command has started.
    const streamed = await exec({ stream: true, command: 'sh', args: ['-c', `: ${marker}-streamed; echo started; sleep 3600`], timeout_seconds: 3600 });
    expect(streamed.status).toBe(200);
    const plain = exec({ command: 'sh', args: ['-c', `: ${marker}-plain; sleep 3600`], timeout_seconds: 3600 });
    await waitFor(async () => (await running(`${marker}-plain`)) > 0, 'the plain exec running', 30_000, 20);
    await h.stop();
    const got = await frames(streamed);
    expect(got[0]).toMatchObject({ type: 'stdout', data: 'started\n' });
    expect(got.at(-1)).toMatchObject({ type: 'exit', timed_out: false });
    expect((got.at(-1) as { exit_code: number | null }).exit_code).not.toBe(0);
    const answer = await plain;
    expect(answer.status).toBe(200);
    expect(await answer.json()).toMatchObject({ timed_out: false });
    await waitFor(async () => (await running(marker)) === 0, 'no command left behind', 30_000, 20);
  });

  it('lets a command that ends within the grace finish: its caller gets the whole output and exit code 0', async () => {
    const { h, exec, root } = await readyHarness(120_000);
    const marker = `slipway-stop-${randomBytes(6).toString('hex')}`;
    // It ends once the file `go` exists in its workspace, which the test makes after the stop has begun.
    const streamed = await exec({ stream: true, command: 'sh', args: ['-c', `: ${marker}; echo started; while [ ! -e go ]; do sleep 0.05; done; echo finished`], timeout_seconds: 3600 });
    expect(streamed.status).toBe(200);
    let stopped = false;
    const stopping = h.stop().then(() => (stopped = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(stopped).toBe(false);
    expect(await running(marker)).toBeGreaterThan(0);
    writeFileSync(path.join(root, 'go'), '');
    await stopping;
    const got = await frames(streamed);
    expect(got.filter((f) => f.type === 'stdout').map((f) => f.data).join('')).toBe('started\nfinished\n');
    expect(got.at(-1)).toMatchObject({ type: 'exit', exit_code: 0 });
  });
});
