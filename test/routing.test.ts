/** Owner routing (core/routing.ts) and worker ids (lib/worker-id.ts). */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { DEFAULT_OWNER_GRACE_SECONDS, routeFor } from '../core/routing';
import { WORKER_ID_FILE, WorkerIdError, newWorkerId, resolveWorkerId } from '../lib/worker-id';
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
