/**
 * Daytona (ADR 0019): `network: false` reaches Daytona as networkBlockAll (objective and service
 * profile), and Daytona's errors map to the failure kinds. Against the fake, whose commands in a
 * sandbox created with networkBlockAll run in a network namespace of their own, so "no outbound"
 * is observed, not only recorded.
 */
import { promises as fs } from 'node:fs';
import net from 'node:net';
import { DaytonaError } from '@daytonaio/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { classifyDaytonaError, DaytonaProviderError, DaytonaSandboxProvider } from '../../activities/sandbox/daytona';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { defaultProviderFor } from '../../activities/service/providers';
import { canUnshareNet, FakeDaytona } from '../helpers/fake-daytona';
import { makeRepo, sandboxRequest, tempDir, waitFor } from './helpers';

const fake = new FakeDaytona();
let parent: string;
let repo: string;
let provider: DaytonaSandboxProvider;
let listener: net.Server;
let port: number;

beforeAll(async () => {
  await fake.start();
  parent = tempDir('daytona-network');
  ({ repo } = makeRepo(parent));
  provider = new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', maxRateLimitWaitMs: 5_000 });
  // Something on this host's loopback that a sandbox with a network reaches and one without does not.
  listener = net.createServer((c) => {
    c.on('error', () => undefined); // the client exits as soon as it has read
    c.end('hello\n');
  });
  await new Promise<void>((r) => listener.listen(0, '127.0.0.1', r));
  port = (listener.address() as net.AddressInfo).port;
});
afterAll(async () => {
  await fake.stop();
  await new Promise((r) => listener?.close(r));
  if (parent) await fs.rm(parent, { recursive: true, force: true });
});

const idOf = async (h: SandboxHandle) => (JSON.parse(await fs.readFile(`${h.root}.json`, 'utf8')) as { daytonaId: string }).daytonaId;
const connect = (p: number) =>
  `${process.execPath} -e "require('net').connect(${p}, '127.0.0.1').on('data', (d) => { process.stdout.write('connected ' + d); process.exit(0); }).on('error', (e) => { console.log('refused ' + e.code); process.exit(3); })"`;

describe('daytona: network: false is networkBlockAll', () => {
  it('the fake can take a sandbox off the network here (unshare --net); without it these tests cannot prove anything', () => {
    expect(canUnshareNet(), 'unshare --net --map-current-user does not work on this machine').toBe(true);
  });

  it('an objective sandbox with network: false is created with networkBlockAll and cannot connect out; one with the network can', async () => {
    const blocked = await provider.create(sandboxRequest(repo, 'offline', { group: 'net', container: { network: false } }));
    const open = await provider.create(sandboxRequest(repo, 'online', { group: 'net', container: { network: true } }));
    expect(fake.sandboxes.get(await idOf(blocked))!.networkBlockAll).toBe(true);
    expect(fake.sandboxes.get(await idOf(open))!.networkBlockAll).toBe(false);
    const denied = await provider.exec(blocked, { command: connect(port), shell: true, timeoutMs: 60_000 });
    expect(denied.stdout).toMatch(/^refused /);
    expect(denied.exitCode).toBe(3);
    const allowed = await provider.exec(open, { command: connect(port), shell: true, timeoutMs: 60_000 });
    expect(allowed.stdout).toBe('connected hello\n');
    // An interactive session runs under the same setting.
    const session = await provider.openSession(blocked, { command: connect(port), shell: true, pty: { cols: 80, rows: 24 } });
    let text = '';
    session.stdout.on('data', (d: Buffer) => (text += d.toString()));
    expect((await session.exit).exitCode).toBe(3);
    expect(await waitFor(async () => text.includes('refused'), 30_000), text).toBe(true);
    await provider.destroy({ repository: repo, root: blocked.root });
    await provider.destroy({ repository: repo, root: open.root });
  });

  it('a service profile with network: false makes every sandbox with networkBlockAll, whatever the request says', async () => {
    const providerFor = defaultProviderFor({ daytona: { apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake' } });
    const offline = providerFor({ provider: 'daytona', confinement: 'none', network: false, copyIgnored: false });
    const online = providerFor({ provider: 'daytona', confinement: 'none', network: true, copyIgnored: false });
    expect(offline).not.toBe(online);
    const a = await offline.create(sandboxRequest(repo, 'profile-offline', { group: 'svc' }));
    const b = await online.create(sandboxRequest(repo, 'profile-online', { group: 'svc' }));
    expect(fake.sandboxes.get(await idOf(a))!.networkBlockAll).toBe(true);
    expect(fake.sandboxes.get(await idOf(b))!.networkBlockAll).toBe(false);
    expect((await offline.exec(a, { command: connect(port), shell: true, timeoutMs: 60_000 })).stdout).toMatch(/^refused /);
    await offline.destroy({ repository: repo, root: a.root });
    await online.destroy({ repository: repo, root: b.root });
  });
});

describe('daytona: errors mapped to failure kinds', () => {
  const now = Date.now();
  it.each([
    ['402 payment required', new DaytonaError('Payment required', 402), 'quota'],
    ['403 with a quota message', new DaytonaError('Total CPU quota exceeded', 403), 'quota'],
    ['403 otherwise', new DaytonaError('Forbidden', 403), 'unauthorized'],
    ['401', new DaytonaError('Unauthorized', 401), 'unauthorized'],
    ['404', new DaytonaError('Sandbox not found', 404), 'not_found'],
    ['500', new DaytonaError('Internal error', 500), 'transient'],
    ['503', new DaytonaError('Unavailable', 503), 'transient'],
    ['400', new DaytonaError('Bad request', 400), 'bad_request'],
    ['422', new DaytonaError('Unprocessable', 422), 'bad_request'],
    ['409', new DaytonaError('Conflict', 409), 'conflict'],
    ['no status (a network error)', new Error('socket hang up'), 'other'],
  ] as const)('%s', (_name, error, kind) => {
    expect(classifyDaytonaError(error).kind).toBe(kind);
  });

  it.each([
    ['Retry-After seconds', { 'retry-after': '7' }, 7_000],
    ['X-RateLimit-Reset as seconds from now', { 'x-ratelimit-reset': '30' }, 30_000],
    ['X-RateLimit-Reset as an epoch time', { 'x-ratelimit-reset': String(Math.floor(now / 1000) + 120) }, undefined],
  ] as const)('429 with %s: rate_limit with its reset', (_name, headers, fromNow) => {
    const err = classifyDaytonaError(new DaytonaError('Too many requests', 429, headers as never));
    expect(err.kind).toBe('rate_limit');
    if (fromNow !== undefined) expect(Math.abs(err.resetAt! - (Date.now() + fromNow))).toBeLessThan(5_000);
    else expect(err.resetAt).toBe((Math.floor(now / 1000) + 120) * 1000);
    expect(err.message).toContain(new Date(err.resetAt!).toISOString());
  });

  it('a sandbox deleted outside Slipway: exec fails as not_found at once (not retried)', async () => {
    const h = await provider.create(sandboxRequest(repo, 'deleted', { group: 'err' }));
    const id = await idOf(h);
    fake.setState(id, 'destroyed');
    const before = fake.requests.length;
    const err = await provider.exec(h, { command: 'true', shell: true }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaProviderError);
    expect((err as DaytonaProviderError).kind).toBe('not_found');
    expect(fake.requests.length - before).toBeLessThanOrEqual(2);
    await provider.destroy({ repository: repo, root: h.root });
  });

  it('a 5xx on create is retried and makes exactly one sandbox', async () => {
    const before = fake.sandboxes.size;
    fake.inject({ method: 'POST', path: /^\/api\/sandbox$/, status: 502, times: 2 });
    const h = await provider.create(sandboxRequest(repo, 'retried', { group: 'err' }));
    expect(fake.sandboxes.size).toBe(before + 1);
    expect(fake.requests.filter((r) => r === 'POST /api/sandbox').length).toBeGreaterThanOrEqual(3);
    await provider.destroy({ repository: repo, root: h.root });
  });

  it('a rate limit on create waits for its reset, then creates', async () => {
    fake.inject({ method: 'POST', path: /^\/api\/sandbox$/, status: 429, headers: { 'retry-after': '1' } });
    const h = await provider.create(sandboxRequest(repo, 'rate-limited', { group: 'err' }));
    expect(fake.sandboxes.get(await idOf(h))?.state).toBe('started');
    await provider.destroy({ repository: repo, root: h.root });
  });
});
