/**
 * Sandbox service calls through the owner (ADR 0013): an API process with its own worker id and
 * no service worker, and the sandboxes made by a separate `slipway api --no-http` process with
 * another worker id and SLIPWAY_HOME. Exec and the file calls run on the owner (the history shows
 * the activity on `<service queue>@<owner>`); big files in chunks (ADR 0026), over the files
 * limit 413; streamed exec output while the command runs; the owner killed => a 503 naming it,
 * not a hang. Interactive sessions and previews through the owner: owner-sessions.test.ts.
 */
import { mkdtempSync, readdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { getSandboxById } from '../../activities/billing/records';
import { ownerTaskQueue } from '../../core/ids';
import { REMOTE_OWNER_CHUNK_BYTES, REMOTE_OWNER_PAYLOAD_LIMIT_BYTES, REMOTE_OWNER_STREAM_LIMIT_BYTES } from '../../core/routing';
import { DEFAULT_FILE_LIMIT_BYTES } from '../../api/service';
import { waitFor } from '../helpers/cli';
import { codeOf, rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';
import { startOwnerProcess, type OwnerProcess } from './remote-owner';

const OWNER_ID = `owner-${randomBytes(3).toString('hex')}`;
const API_ID = `api-${randomBytes(3).toString('hex')}`;
let h: ServiceHarness;
let a: TestAccount;
let owner: OwnerProcess;
let sandboxId: string;
/** The owner process's TMPDIR: where it stages chunked uploads. */
const ownerTmp = mkdtempSync(path.join(os.tmpdir(), 'slipway-owner-tmp-'));

beforeAll(async () => {
  // Calls through a remote owner carry tenant data through history: only with encrypted payloads
  // (routing.test.ts has the refusal without a key). This file's process and the owner share one key.
  process.env.SLIPWAY_PAYLOAD_KEY = randomBytes(32).toString('base64');
  // The API host: HTTP and its own queue only; every sandbox workflow runs on the owner process.
  h = await startServiceHarness({ worker: false, workerId: API_ID, ownerGraceSeconds: 5 });
  owner = await startOwnerProcess(h, OWNER_ID, { TMPDIR: ownerTmp });
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
    for (const op of ['writeFile', 'readChunk', 'deleteFile']) {
      expect(new Set(await ownerCallQueues(op))).toEqual(new Set([ownerTaskQueue(h.host.serviceTaskQueue, OWNER_ID)]));
    }
  });

  it('carries a 5 MiB file both ways in chunks, byte for byte, and reads a big file made on the owner', async () => {
    const body = randomBytes(5 * 1024 * 1024 + 123);
    await a.api.writeFile(sandboxId, 'big/up.bin', body);
    // The owner's own view: the whole file arrived as one.
    const seen = await a.api.exec(sandboxId, { command: 'sh', args: ['-c', 'wc -c < big/up.bin; sha256sum big/up.bin | cut -d" " -f1; ls -A big'] });
    expect(seen.stdout.split('\n').slice(0, 3)).toEqual([String(body.length), createHash('sha256').update(body).digest('hex'), 'up.bin']);
    const back = await a.api.readFile(sandboxId, 'big/up.bin');
    expect(back.length).toBe(body.length);
    expect(back.equals(body)).toBe(true);
    // Several chunk calls, each on the owner's queue.
    expect((await ownerCallQueues('writeChunk')).length).toBeGreaterThanOrEqual(Math.ceil(body.length / REMOTE_OWNER_CHUNK_BYTES));
    expect(new Set(await ownerCallQueues('readChunk'))).toEqual(new Set([ownerTaskQueue(h.host.serviceTaskQueue, OWNER_ID)]));
    // Made on the owner by a command, over the single-payload limit.
    await a.api.exec(sandboxId, { command: 'sh', args: ['-c', `head -c ${3 * REMOTE_OWNER_PAYLOAD_LIMIT_BYTES + 7} /dev/urandom > big/made.bin`] });
    const made = await a.api.readFile(sandboxId, 'big/made.bin');
    const sum = await a.api.exec(sandboxId, { command: 'sha256sum', args: ['big/made.bin'] });
    expect(sum.stdout.split(' ')[0]).toBe(createHash('sha256').update(made).digest('hex'));
    expect(made.length).toBe(3 * REMOTE_OWNER_PAYLOAD_LIMIT_BYTES + 7);
  }, 180_000);

  it('drops the staged chunks when the commit is refused: nothing in the sandbox, nothing left on the owner', async () => {
    // `big` is a folder by now: a file cannot take its name.
    expect(await codeOf(a.api.writeFile(sandboxId, 'big', randomBytes(3 * REMOTE_OWNER_CHUNK_BYTES)))).toBe('400 is_a_directory');
    const staged = readdirSync(ownerTmp)
      .filter((d) => d.startsWith('slipway-uploads-'))
      .flatMap((d) => readdirSync(path.join(ownerTmp, d)));
    expect(staged).toEqual([]);
    expect(readdirSync(ownerTmp).some((d) => d.startsWith('slipway-uploads-'))).toBe(true); // the staging folder was used
    const left = await a.api.exec(sandboxId, { command: 'sh', args: ['-c', 'ls -A big'] });
    expect(left.stdout).toBe('made.bin\nup.bin\n');
  }, 120_000);

  it('refuses a 70 MiB write with 413 naming the limit, leaving nothing half-written', async () => {
    const put = await rawRequest(h.url, 'PUT', `/api/v1/sandboxes/${sandboxId}/files/big/huge.bin`, { token: a.token, body: Buffer.alloc(70 * 1024 * 1024, 'a'), headers: { 'content-type': 'application/octet-stream' } });
    expect(put.status).toBe(413);
    expect(JSON.stringify(await put.json())).toContain(String(DEFAULT_FILE_LIMIT_BYTES));
    expect(await codeOf(a.api.readFile(sandboxId, 'big/huge.bin'))).toBe('404 file_not_found');
    // No staged or temporary file anywhere in the sandbox.
    const left = await a.api.exec(sandboxId, { command: 'sh', args: ['-c', 'find . -path ./.git -prune -o -name "*huge*" -print'] });
    expect(left.stdout).toBe('');
  }, 120_000);

  it('streams an exec\'s output through the owner while the command runs', async () => {
    const frames: Array<[string, string]> = [];
    let exited = false;
    // Prints a line, then waits for a file only this test makes once it saw that line.
    const run = a.api
      .execStream(sandboxId, { command: 'sh', args: ['-c', 'echo first; echo err-line >&2; while [ ! -e go ]; do sleep 0.05; done; echo second; exit 4'] }, (stream, data) => {
        frames.push([stream, data]);
      })
      .finally(() => (exited = true));
    await waitFor(async () => frames.some(([st, d]) => st === 'stdout' && d.includes('first')), 'the first line before the command ends', 120_000);
    expect(exited).toBe(false);
    await a.api.writeFile(sandboxId, 'go', Buffer.from(''));
    const exit = await run;
    expect(exit).toMatchObject({ type: 'exit', exit_code: 4, timed_out: false });
    const text = (which: string) => frames.filter(([st]) => st === which).map(([, d]) => d).join('');
    expect(text('stdout')).toBe('first\nsecond\n');
    expect(text('stderr')).toBe('err-line\n');
    expect(new Set(await ownerCallQueues('execStream'))).toEqual(new Set([ownerTaskQueue(h.host.serviceTaskQueue, OWNER_ID)]));
    await a.api.deleteFile(sandboxId, 'go');
  }, 180_000);

  it('bounds a streamed exec\'s output through the owner and says what it dropped', async () => {
    let out = 0;
    let err = '';
    const exit = await a.api.execStream(sandboxId, { command: 'sh', args: ['-c', `head -c ${REMOTE_OWNER_STREAM_LIMIT_BYTES + 100_000} /dev/zero | tr '\\0' a; echo done >&2`], output_encoding: 'base64' }, (stream, data) => {
      if (stream === 'stdout') out += Buffer.from(data, 'base64').length;
      else err += Buffer.from(data, 'base64').toString();
    });
    expect(exit).toMatchObject({ exit_code: 0 });
    // What fits is delivered whole; stderr came after the limit was reached, so it is dropped too and the note names the limit.
    expect(out).toBe(REMOTE_OWNER_STREAM_LIMIT_BYTES);
    expect(err).toContain(`past ${REMOTE_OWNER_STREAM_LIMIT_BYTES} were dropped`);
  }, 240_000);

  it('answers a streamed exec in a missing cwd with 400, before any frame', async () => {
    expect(await codeOf(a.api.execStream(sandboxId, { command: 'true', cwd: 'no-such-dir' }, () => undefined))).toBe('400 invalid_cwd');
  }, 120_000);

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
