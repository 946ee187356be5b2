/**
 * A provider without interactive sessions (SandboxProvider.sessions === false): the API answers
 * 501 sessions_unsupported for a streaming exec before anything starts in the sandbox, and keeps
 * serving plain exec. The provider is the real local one; only its `sessions` field is set false
 * (as slowCreates wraps creates), since every provider Slipway ships has sessions.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultProviderFor } from '../../activities/service/providers';
import { rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

let h: ServiceHarness;
let a: TestAccount;
let sandboxId: string;
const opened: string[] = [];

beforeAll(async () => {
  const inner = defaultProviderFor();
  h = await startServiceHarness({
    providerFor: (policy) =>
      new Proxy(inner(policy), {
        get(target, prop, receiver) {
          if (prop === 'sessions') return false;
          if (prop === 'openSession') return (...args: unknown[]) => (opened.push(String(args[0])), Reflect.apply(target.openSession, target, args));
          const value = Reflect.get(target, prop, receiver);
          return typeof value === 'function' ? value.bind(target) : value;
        },
      }),
  });
  a = await h.account({ limit: 1 });
  await a.profile({ name: 'linux' });
  sandboxId = (await a.api.create({ profile: 'linux' })).id;
  await h.waitFor(a.api, sandboxId, ['ready']);
});
afterAll(async () => {
  await h?.stop();
});

describe('a provider without sessions', () => {
  it('streaming exec is a 501 naming the provider; nothing is opened; plain exec still runs', async () => {
    const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sandboxId}/exec`, { token: a.token, body: JSON.stringify({ stream: true, command: 'true' }) });
    expect(res.status).toBe(501);
    const body = (await res.json()) as { error?: { code?: string; message?: string }; code?: string; message?: string };
    expect(JSON.stringify(body)).toContain('sessions_unsupported');
    expect(JSON.stringify(body)).toMatch(/the local provider has no interactive sessions/);
    expect(opened).toEqual([]);
    // The exec slot and the admission were released on the refusal: a plain exec runs.
    const plain = await a.api.exec(sandboxId, { command: 'echo', args: ['still'] });
    expect(plain.stdout).toBe('still\n');
  });
});
