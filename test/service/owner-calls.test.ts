/**
 * Sandbox service calls through the owner (ADR 0013): an API process with its own worker id and
 * no service worker, and the sandboxes made by a separate `slipway api --no-http` process with
 * another worker id and SLIPWAY_HOME. Exec and the file calls run on the owner (the history shows
 * the activity on `<service queue>@<owner>`); bodies over the remote limit get 413; streams 501;
 * the owner killed => a 503 naming it, not a hang.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { getSandboxById } from '../../activities/billing/records';
import { ownerTaskQueue } from '../../core/ids';
import { REMOTE_OWNER_PAYLOAD_LIMIT_BYTES } from '../../core/routing';
import { BIN, waitFor } from '../helpers/cli';
import { codeOf, rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

const OWNER_ID = `owner-${randomBytes(3).toString('hex')}`;
const API_ID = `api-${randomBytes(3).toString('hex')}`;
let h: ServiceHarness;
let a: TestAccount;
let owner: { child: ChildProcess; output: () => string };
let sandboxId: string;

function startOwner(): { child: ChildProcess; output: () => string } {
  let output = '';
  const base = { ...process.env };
  delete base.SLIPWAY_WORKER_ID;
  const child = spawn(process.execPath, [BIN, 'api', '--no-http', '--reaper-seconds', '3600', '--watch-seconds', '0'], {
    env: {
      ...base,
      DATABASE_URL: h.database.url,
      TEMPORAL_ADDRESS: inject('temporalAddress'),
      SLIPWAY_TASK_QUEUE: h.taskQueue,
      SLIPWAY_WORKER_ID: OWNER_ID,
      SLIPWAY_HOME: mkdtempSync(path.join(os.tmpdir(), 'slipway-owner-home-')),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout!.on('data', (c) => (output += c));
  child.stderr!.on('data', (c) => (output += c));
  return { child, output: () => output };
}

beforeAll(async () => {
  // Calls through a remote owner carry tenant data through history: only with encrypted payloads
  // (routing.test.ts has the refusal without a key). This file's process and the owner share one key.
  process.env.SLIPWAY_PAYLOAD_KEY = randomBytes(32).toString('base64');
  // The API host: HTTP and its own queue only; every sandbox workflow runs on the owner process.
  h = await startServiceHarness({ worker: false, workerId: API_ID, ownerGraceSeconds: 5 });
  owner = startOwner();
  await waitFor(async () => owner.output().includes('sandbox service worker on task queue') || (owner.child.exitCode !== null && Promise.reject(new Error(owner.output()))), 'the owner process to poll', 120_000);
  a = await h.account({ limit: 2 });
  await a.profile({ name: 'linux' });
  sandboxId = (await a.api.create({ profile: 'linux' })).id;
  await h.waitFor(a.api, sandboxId, ['ready'], 120_000);
}, 240_000);

afterAll(async () => {
  if (owner && owner.child.exitCode === null) owner.child.kill('SIGKILL');
  await h?.stop();
});

/** The task queues of the activities the call workflows of this sandbox scheduled, from their histories. */
async function ownerCallQueues(op: string): Promise<string[]> {
  const ids = h.logs
    .map((l) => JSON.parse(l) as { msg?: string; op?: string; sandboxId?: string; workflowId?: string })
    .filter((l) => l.msg === 'call on the sandbox owner' && l.op === op && l.sandboxId === sandboxId)
    .map((l) => l.workflowId!);
  const queues: string[] = [];
  for (const id of ids) {
    const history = await h.host.client.workflow.getHandle(id).fetchHistory();
    for (const e of history.events ?? []) {
      const q = e.activityTaskScheduledEventAttributes?.taskQueue?.name;
      if (q) queues.push(q);
    }
  }
  return queues;
}

describe('a sandbox held by another worker', () => {
  it('records the worker that made it as its owner', async () => {
    expect((await getSandboxById(h.database.db, sandboxId))?.owner).toBe(OWNER_ID);
  });

  it('runs exec on the owner: output, exit code, cwd check, and the activity on the owner queue', async () => {
    const run = await a.api.exec(sandboxId, { command: 'sh', args: ['-c', 'cat; echo "$GREETING"; echo oops >&2; exit 3'], stdin: 'in\n', env: { GREETING: 'hi' } });
    expect(run).toMatchObject({ exit_code: 3, stdout: 'in\nhi\n', stderr: 'oops\n', timed_out: false });
    expect(await codeOf(a.api.exec(sandboxId, { command: 'true', cwd: '../..' }))).toBe('400 path_refused');
    expect(await codeOf(a.api.exec(sandboxId, { command: 'true', cwd: 'no-such-dir' }))).toBe('400 invalid_cwd');
    const queues = await ownerCallQueues('exec');
    expect(queues.length).toBeGreaterThanOrEqual(1);
    expect(new Set(queues)).toEqual(new Set([ownerTaskQueue(h.host.serviceTaskQueue, OWNER_ID)]));
  });

  it('writes, reads and deletes files on the owner with the same path checks', async () => {
    await a.api.writeFile(sandboxId, 'notes/owner.txt', Buffer.from('through the owner\n'));
    expect((await a.api.readFile(sandboxId, 'notes/owner.txt')).toString()).toBe('through the owner\n');
    expect((await a.api.exec(sandboxId, { command: 'cat', args: ['notes/owner.txt'] })).stdout).toBe('through the owner\n');
    await a.api.deleteFile(sandboxId, 'notes/owner.txt');
    expect(await codeOf(a.api.readFile(sandboxId, 'notes/owner.txt'))).toBe('404 file_not_found');
    expect(await codeOf(a.api.readFile(sandboxId, '.git/config'))).toMatch(/^400 /);
    expect(await codeOf(a.api.writeFile(sandboxId, '../escape.txt', Buffer.from('x')))).toBe('400 path_refused');
    for (const op of ['writeFile', 'readFile', 'deleteFile']) {
      expect(new Set(await ownerCallQueues(op))).toEqual(new Set([ownerTaskQueue(h.host.serviceTaskQueue, OWNER_ID)]));
    }
  });

  it('refuses a body over the remote limit with 413 naming it, and reads of big files too', async () => {
    const big = Buffer.alloc(REMOTE_OWNER_PAYLOAD_LIMIT_BYTES + 1, 'a');
    const put = await rawRequest(h.url, 'PUT', `/api/v1/sandboxes/${sandboxId}/files/big.txt`, { token: a.token, body: big, headers: { 'content-type': 'application/octet-stream' } });
    expect(put.status).toBe(413);
    expect(JSON.stringify(await put.json())).toContain(String(REMOTE_OWNER_PAYLOAD_LIMIT_BYTES));
    // Made on the owner by a command: reading it back would not fit in history.
    await a.api.exec(sandboxId, { command: 'sh', args: ['-c', `head -c ${REMOTE_OWNER_PAYLOAD_LIMIT_BYTES + 1} /dev/zero > big.bin`] });
    expect(await codeOf(a.api.readFile(sandboxId, 'big.bin'))).toBe('413 file_too_large');
  });

  it('refuses a streaming exec with 501 naming the owner', async () => {
    const err = await a.api.execStream(sandboxId, { command: 'true' }, () => undefined).then(
      () => undefined,
      (e: Error) => e,
    );
    expect(String(err)).toMatch(/remote_owner_stream|on another host/);
  });

  it('answers 503 naming the owner once it is gone, instead of hanging', async () => {
    owner.child.kill('SIGKILL');
    await new Promise((r) => owner.child.once('exit', r));
    const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sandboxId}/exec`, { token: a.token, body: JSON.stringify({ command: 'true' }) });
    expect(res.status).toBe(503);
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe('owner_unavailable');
    expect(body.error.message).toContain(OWNER_ID);
  }, 120_000);
});
