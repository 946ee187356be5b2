/** The per-account request rate: a token bucket, 429 with Retry-After, other accounts unaffected. */
import { describe, expect, it } from 'vitest';
import { startServiceHarness } from './harness';
import { ApiError, SandboxService } from '../../api/service';

describe('per-account rate limit', () => {
  const service = new SandboxService({ requestsPerSecond: 2 } as ConstructorParameters<typeof SandboxService>[0]);

  it('lets a burst of twice the rate through, then answers 429 with Retry-After until tokens come back', () => {
    const t0 = 1_000_000;
    for (let i = 0; i < 4; i++) service.rateLimit('acct-a', t0);
    let refused: unknown;
    try {
      service.rateLimit('acct-a', t0);
    } catch (e) {
      refused = e;
    }
    expect(refused).toBeInstanceOf(ApiError);
    expect((refused as ApiError).status).toBe(429);
    expect((refused as ApiError).code).toBe('rate_limited');
    expect((refused as ApiError).retryAfterSeconds).toBeGreaterThanOrEqual(1);
    // Another account has its own bucket.
    expect(() => service.rateLimit('acct-b', t0)).not.toThrow();
    // Half a second later one token (2/s) is back: one request passes, the next does not.
    expect(() => service.rateLimit('acct-a', t0 + 500)).not.toThrow();
    expect(() => service.rateLimit('acct-a', t0 + 500)).toThrow(ApiError);
  });

  it('is off at 0', () => {
    const open = new SandboxService({ requestsPerSecond: 0 } as ConstructorParameters<typeof SandboxService>[0]);
    for (let i = 0; i < 1000; i++) open.rateLimit('acct-a', 0);
  });
});

describe('over HTTP', () => {
  it('answers 429 rate_limited with Retry-After past the burst, on any authenticated call', async () => {
    const h = await startServiceHarness({ requestsPerSecond: 2 });
    try {
      const a = await h.account();
      const answers = [];
      for (let i = 0; i < 8; i++) {
        answers.push(await fetch(new URL('/api/v1/sandboxes', h.url), { headers: { authorization: `Bearer ${a.token}` } }));
      }
      const limited = answers.filter((r) => r.status === 429);
      expect(limited.length).toBeGreaterThan(0);
      expect(Number(limited[0]!.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(((await limited[0]!.json()) as { error: { code: string } }).error.code).toBe('rate_limited');
      expect(answers[0]!.status).toBe(200);
    } finally {
      await h.stop();
    }
  });
});
