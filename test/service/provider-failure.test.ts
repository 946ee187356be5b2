/** The service API's answer to each kind of remote provider failure (api/service.ts providerFailure). */
import { describe, expect, it } from 'vitest';
import { providerFailure } from '../../api/service';
import { SandboxProviderError, type ProviderFailureKind } from '../../activities/sandbox/provider';
import { DaytonaProviderError, classifyDaytonaError } from '../../activities/sandbox/daytona';

describe('providerFailure', () => {
  const now = 1_000_000;
  it.each<[ProviderFailureKind, number | undefined, number, string, number | undefined]>([
    ['not_found', undefined, 409, 'sandbox_ended', undefined],
    ['rate_limit', now + 12_500, 503, 'provider_unavailable', 13],
    ['rate_limit', now - 1_000, 503, 'provider_unavailable', 1],
    ['rate_limit', undefined, 503, 'provider_unavailable', 1],
    ['transient', undefined, 503, 'provider_unavailable', 5],
    ['quota', undefined, 503, 'provider_unavailable', 60],
    ['unauthorized', undefined, 502, 'provider_error', undefined],
    ['other', undefined, 502, 'provider_error', undefined],
  ])('%s (reset %s) -> %i %s, Retry-After %s', (kind, resetAt, status, code, retryAfter) => {
    const answer = providerFailure(new SandboxProviderError('Daytona: secret detail at https://internal.example', kind, undefined, resetAt), 'sbx-1', now);
    expect([answer.status, answer.code, answer.retryAfterSeconds]).toEqual([status, code, retryAfter]);
    // The provider's own message (hosts, ids) stays in the server's log, not in the answer.
    expect(answer.message).not.toContain('internal.example');
  });

  it("a refused request is 400 with the provider's reason and the file; a conflict 409", () => {
    const refused = providerFailure(new SandboxProviderError('writing a.txt: Daytona: invalid path /w/a.txt', 'bad_request', 400, undefined, 'invalid path /w/a.txt'), 'sbx-1', now, 'a.txt');
    expect([refused.status, refused.code, refused.message]).toEqual([400, 'provider_refused', 'the sandbox provider refused the call on "a.txt": invalid path /w/a.txt']);
    const conflict = providerFailure(new SandboxProviderError('Daytona: busy', 'conflict', 409, undefined, 'sandbox is busy'), 'sbx-1', now);
    expect([conflict.status, conflict.code, conflict.message]).toEqual([409, 'provider_conflict', 'the sandbox provider cannot do this now: sandbox is busy']);
  });

  it.each<[number, string]>([
    [400, 'bad_request'],
    [422, 'bad_request'],
    [404, 'not_found'],
    [409, 'conflict'],
    [429, 'rate_limit'],
    [402, 'quota'],
    [401, 'unauthorized'],
    [503, 'transient'],
    [418, 'other'],
  ])('Daytona %i is classified %s', (statusCode, kind) => {
    expect(classifyDaytonaError(Object.assign(new Error('m'), { statusCode })).kind).toBe(kind);
  });

  it('takes a Daytona error as classified from the SDK', () => {
    const e = classifyDaytonaError(Object.assign(new Error('Sandbox not found'), { statusCode: 404 }));
    expect(e).toBeInstanceOf(DaytonaProviderError);
    expect(e).toBeInstanceOf(SandboxProviderError);
    expect(providerFailure(e, 'sbx-1').status).toBe(409);
  });
});
