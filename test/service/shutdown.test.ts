/**
 * Stopping the service host (`slipway api` on SIGTERM) with commands still running for callers.
 * Fastify's close waits for every request in flight, and a streamed exec's default timeout is
 * 300 s (at most an hour): before the grace, a stop waited that long (the OpenAPI fuzzer's run
 * hung in its teardown). Now commands get the grace to finish, then are killed, and their
 * callers get the kill's answer. A preview connection to an app that outlives every command (a
 * detached server in a podman container) is cut at the same time, or it held the stop forever;
 * so is one through the tunnel of another worker holding the sandbox.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { getSandboxById } from '../../activities/billing/records';
import { containerName, engineEnv } from '../../activities/sandbox/container';
import { startOwnerProcess, type ExecFrame } from './remote-owner';
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

  /**
   * A podman sandbox whose app (detached from the exec that starts it, as a user's dev server)
   * writes an endless response; the preview is opened and read, then the host stops. `remote`:
   * the sandbox is held by another worker (a `slipway api --no-http` process), so the preview goes
   * through that owner's tunnel (ADR 0028), which the stop must cut as well.
   */
  const previewCutAtStop = async (remote: boolean) => {
    const ownerId = `owner-${randomBytes(3).toString('hex')}`;
    if (remote) process.env.SLIPWAY_PAYLOAD_KEY ??= randomBytes(32).toString('base64');
    const h = await startServiceHarness({
      shutdownGraceMs: 200,
      preview: { key: randomBytes(32), domain: 'localhost' },
      ...(remote ? { worker: false, workerId: `api-${randomBytes(3).toString('hex')}` } : {}),
    });
    let stopped = false;
    let owner: Awaited<ReturnType<typeof startOwnerProcess>> | undefined;
    let container: string | undefined;
    try {
      if (remote) owner = await startOwnerProcess(h, ownerId);
      const a = await h.account({ limit: 1 });
      await a.profile({ name: 'podman', provider: 'podman' });
      const id = (await a.api.create({ profile: 'podman' })).id;
      await h.waitFor(a.api, id, ['ready'], 120_000);
      container = containerName((await getSandboxById(h.database.db, id))!.root!);
      const app = "require('http').createServer((q, r) => { r.writeHead(200); r.write('tick\\n'); setInterval(() => r.write('tick\\n'), 1000); }).listen(3000, '127.0.0.1')";
      const started = await a.api.exec(id, { command: 'sh', args: ['-c', `nohup node -e "${app}" > /dev/null 2>&1 &`] });
      expect(started.exit_code).toBe(0);
      const opened = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/ports`, { token: a.token, body: JSON.stringify({ port: 3000 }) });
      expect(opened.status).toBe(201);
      const url = new URL(((await opened.json()) as { url: string }).url);
      // Connects (again, until the app listens) and resolves at the first bytes of the endless body; `ended` once the connection is gone.
      const stream = () =>
        new Promise<{ ended: Promise<string> }>((resolve, reject) => {
          const req = http.request({ host: '127.0.0.1', port: Number(new URL(h.url).port), path: '/', headers: { host: url.host, authorization: `Bearer ${a.token}` }, agent: false }, (res) => {
            if (res.statusCode !== 200) return reject(new Error(`preview answered ${res.statusCode}`)), res.resume();
            res.once('data', () => resolve({ ended: new Promise((done) => res.once('close', () => done(res.complete ? 'complete' : 'cut'))) }));
          });
          req.on('error', reject);
          req.end();
        });
      const open = await waitFor(() => stream().catch(() => undefined), 'the app in the container to answer through the preview', 60_000);
      stopped = true;
      await h.stop();
      expect(await open.ended).toBe('cut');
    } finally {
      if (!stopped) await h.stop().catch(() => undefined);
      owner?.child.kill('SIGKILL');
      // The stop leaves sandboxes as they are (a restart finds them): this one is the test's to remove.
      if (container) execFileSync('podman', ['rm', '-f', '-t', '0', container], { env: engineEnv(), stdio: 'ignore' });
    }
  };

  it('cuts a preview connection still open after the grace (an endless response from an app no command holds): the stop ends, the client sees the cut', () => previewCutAtStop(false), 240_000);

  it('cuts such a preview also when it goes through the tunnel of the worker holding the sandbox', () => previewCutAtStop(true), 240_000);
});
