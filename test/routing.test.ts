/** Owner routing (core/routing.ts) and worker ids (lib/worker-id.ts). */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { DEFAULT_OWNER_GRACE_SECONDS, MAX_SANDBOX_REPLACEMENTS, afterOwnerGone, routeFor, serviceCallRoute } from '../core/routing';
import { POLLER_FRESH_MS, ownerPolls } from '../activities/owners';
import { WORKER_ID_FILE, WorkerIdError, newWorkerId, resolveWorkerId } from '../lib/worker-id';
import { slipway } from './helpers/cli';
import { tempDir } from './helpers/repo';

describe('routeFor', () => {
  const grace = DEFAULT_OWNER_GRACE_SECONDS * 1000;
  it.each([
    ['no owner recorded (0.1.0 sandboxes)', undefined, {}, {}],
    ['no owner, agent run', undefined, { agents: true }, { taskQueue: 'q-agents' }],
    ['any worker (remote provider)', 'any', {}, {}],
    ['any worker, agent run', 'any', { agents: true }, { taskQueue: 'q-agents' }],
    ['a worker', 'w1', {}, { taskQueue: 'q@w1', scheduleToStartTimeoutMs: grace }],
    ['a worker, agent run', 'w1', { agents: true }, { taskQueue: 'q@w1-agents', scheduleToStartTimeoutMs: grace }],
    ['a worker, own grace', 'w1', { graceSeconds: 20 }, { taskQueue: 'q@w1', scheduleToStartTimeoutMs: 20_000 }],
    ['the merger: waits for its owner', 'w1', { waitForOwner: true }, { taskQueue: 'q@w1' }],
    ['the planner in the merger', 'w1', { waitForOwner: true, agents: true }, { taskQueue: 'q@w1-agents' }],
  ] as const)('%s', (_name, owner, opts, expected) => {
    expect(routeFor('q', owner, opts)).toEqual(expected);
  });
});

describe('serviceCallRoute', () => {
  it.each([
    ['no owner recorded', undefined, 'api', 'exec', 'direct'],
    ['any host reaches it (remote provider)', 'any', 'api', 'session', 'direct'],
    ['the API host owns it: exec', 'api', 'api', 'exec', 'direct'],
    ['the API host owns it: file', 'api', 'api', 'file', 'direct'],
    ['the API host owns it: session', 'api', 'api', 'session', 'direct'],
    ['another owner: exec', 'w1', 'api', 'exec', 'owner'],
    ['another owner: API without an id', 'w1', undefined, 'exec', 'owner'],
    // Any size up to the files API's limit: bodies travel in chunks (ADR 0026).
    ['another owner: file', 'w1', 'api', 'file', 'owner'],
    ['another owner: streamed exec', 'w1', 'api', 'stream', 'owner'],
    // Bytes over the owner's tunnel (ADR 0028).
    ['another owner: interactive session, SSH or preview', 'w1', 'api', 'session', 'owner'],
  ] as const)('%s', (_name, owner, local, call, expected) => {
    const route = serviceCallRoute({ owner, localWorkerId: local, call, historyEncrypted: true });
    if (expected === 'direct') expect(route).toEqual({ kind: 'direct' });
    else if (expected === 'owner') expect(route).toEqual({ kind: 'owner', owner });
    else {
      expect(route).toMatchObject({ kind: 'refuse', status: expected, code: 'remote_owner_stream' });
      if (route.kind !== 'refuse') throw new Error('unreachable');
      expect(route.message).toContain(`"${owner}"`);
    }
  });
});

describe('serviceCallRoute without payload encryption', () => {
  it.each([
    ['the API host owns it', 'api', 'direct'],
    ['any host reaches it', 'any', 'direct'],
    ['another owner: exec', 'w1', 'remote_owner_needs_payload_key'],
  ] as const)('%s', (_name, owner, expected) => {
    const route = serviceCallRoute({ owner, localWorkerId: 'api', call: 'exec', historyEncrypted: false });
    if (expected === 'direct') expect(route).toEqual({ kind: 'direct' });
    else {
      expect(route).toMatchObject({ kind: 'refuse', status: 501, code: expected });
      if (route.kind !== 'refuse') throw new Error('unreachable');
      expect(route.message).toContain('SLIPWAY_PAYLOAD_KEY');
    }
  });
  it('a file call too: its contents would sit in history', () => {
    expect(serviceCallRoute({ owner: 'w1', localWorkerId: 'api', call: 'file', historyEncrypted: false })).toMatchObject({ kind: 'refuse', code: 'remote_owner_needs_payload_key' });
  });
  it('a session too: its command and environment sit in history, and its tunnel is keyed from the payload key', () => {
    expect(serviceCallRoute({ owner: 'w1', localWorkerId: 'api', call: 'session', historyEncrypted: false })).toMatchObject({ kind: 'refuse', code: 'remote_owner_needs_payload_key' });
  });
});

describe('worker ids', () => {
  it('a new home gets an id that is kept across restarts', async () => {
    const home = path.join(tempDir(), 'home');
    const first = await resolveWorkerId(home);
    expect(first).toMatch(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/);
    expect(readFileSync(path.join(home, WORKER_ID_FILE), 'utf8')).toBe(`${first}\n`);
    expect(await resolveWorkerId(home)).toBe(first);
  });

  it('workers starting together on one home agree on one id', async () => {
    const home = path.join(tempDir(), 'home');
    const ids = await Promise.all(Array.from({ length: 8 }, () => resolveWorkerId(home)));
    expect(new Set(ids).size).toBe(1);
  });

  it('the override wins and is checked; a bad kept id names the file', async () => {
    const home = tempDir();
    expect(await resolveWorkerId(home, 'host-b.2')).toBe('host-b.2');
    await expect(resolveWorkerId(home, 'a/b')).rejects.toThrow(/SLIPWAY_WORKER_ID: worker id "a\/b" is not valid/);
    await expect(resolveWorkerId(home, 'a/b')).rejects.toBeInstanceOf(WorkerIdError);
    mkdirSync(home, { recursive: true });
    writeFileSync(path.join(home, WORKER_ID_FILE), 'bad id\n');
    await expect(resolveWorkerId(home)).rejects.toThrow(`${path.join(home, WORKER_ID_FILE)}: worker id "bad id" is not valid`);
  });

  it('new ids from a host name differ and are valid', () => {
    const a = newWorkerId('Host_Name.example.com');
    expect(a).toMatch(/^Host-Name\.example\.com-[0-9a-f]{8}$/);
    expect(newWorkerId('x')).not.toBe(newWorkerId('x'));
    expect(newWorkerId('___')).toMatch(/^worker-[0-9a-f]{8}$/);
  });
});

describe('afterOwnerGone', () => {
  it.each([
    [0, 'recreate'],
    [MAX_SANDBOX_REPLACEMENTS - 1, 'recreate'],
    [MAX_SANDBOX_REPLACEMENTS, 'give_up'],
    [MAX_SANDBOX_REPLACEMENTS + 5, 'give_up'],
  ] as const)('after %i replacements: %s', (n, expected) => {
    expect(afterOwnerGone(n)).toBe(expected);
  });
});

describe('ownerPolls', () => {
  const now = 1_000_000_000_000;
  const at = (msAgo: number) => ({ seconds: Math.floor((now - msAgo) / 1000), nanos: ((now - msAgo) % 1000) * 1e6 });
  const long = (n: number) => ({ toNumber: () => n });
  it.each([
    ['a fresh poller of the worker', [{ identity: '12@h/w1', lastAccessTime: at(5_000) }], true],
    ['Long seconds, as the client gives them', [{ identity: '12@h/w1', lastAccessTime: { seconds: long(Math.floor((now - 1000) / 1000)), nanos: 0 } }], true],
    ['a stale poller of the worker', [{ identity: '12@h/w1', lastAccessTime: at(POLLER_FRESH_MS + 1) }], false],
    ['another worker only', [{ identity: '12@h/w2', lastAccessTime: at(1_000) }], false],
    ['a worker whose id ends the same', [{ identity: '12@h/xw1', lastAccessTime: at(1_000) }], false],
    ['no access time', [{ identity: '12@h/w1' }], false],
    ['nobody', [], false],
    ['one stale, one fresh', [{ identity: '1@h/w1', lastAccessTime: at(600_000) }, { identity: '2@h/w1', lastAccessTime: at(100) }], true],
  ])('%s', (_name, pollers, expected) => {
    expect(ownerPolls(pollers, 'w1', now)).toBe(expected);
  });
});

describe('slipway worker: a bad worker id', () => {
  it.each([
    ['the flag', ['worker', '--id', 'a/b'], {}, '--id: worker id "a/b" is not valid'],
    ['the environment', ['worker'], { SLIPWAY_WORKER_ID: 'a b' }, 'SLIPWAY_WORKER_ID: worker id "a b" is not valid'],
  ])('from %s: exit 2 naming it, nothing started', async (_name, args, env, message) => {
    const home = tempDir();
    // An address nothing listens on: the id is checked before any connection is tried.
    const run = await slipway(args, { ...env, SLIPWAY_HOME: home, TEMPORAL_ADDRESS: '127.0.0.1:1' });
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(message);
    expect(existsSync(path.join(home, WORKER_ID_FILE))).toBe(false);
  });
});
