/**
 * The real agent providers (claude-code, codex, opencode, pi): output parsers over recorded-format
 * transcripts in test/fixtures/agents/<provider>/*.jsonl, and the command lines they build.
 */
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createClaudeCodeProvider } from '../agents/claude-code';
import { codexResetAt, codexSessionToolCalls, createCodexProvider } from '../agents/codex';
import { copilotCredentialSources, createCopilotProvider } from '../agents/copilot';
import { createOpencodeProvider, opencodeResetAt } from '../agents/opencode';
import { createPiProvider, piResetAt } from '../agents/pi';
import type { AgentEvent, AgentInvocation, AgentProvider } from '../agents/provider';
import { agentProvider } from '../agents/registry';
import { runProcess } from '../activities/process';
import { AgentSchema, type AgentProviderKind } from '../core/objective-schema';

const FIXTURES = path.join(__dirname, 'fixtures', 'agents');
const NOW = new Date('2026-01-01T00:00:00.000Z');

type RealKind = Exclude<AgentProviderKind, 'script'>;
const FACTORIES: Record<RealKind, () => AgentProvider> = {
  'claude-code': createClaudeCodeProvider,
  codex: createCodexProvider,
  opencode: createOpencodeProvider,
  pi: createPiProvider,
  copilot: createCopilotProvider,
};
const KINDS = Object.keys(FACTORIES) as RealKind[];

function fixtureLines(kind: RealKind, name: string): string[] {
  return readFileSync(path.join(FIXTURES, kind, name), 'utf8').split('\n');
}

/** Parses a transcript with a fresh provider, as one agent run does. */
function parse(kind: RealKind, lines: string[], stream: 'stdout' | 'stderr' = 'stdout'): AgentEvent[] {
  const provider = FACTORIES[kind]();
  return lines.flatMap((line) => provider.parseLine(line, stream));
}

const parseFixture = (kind: RealKind, name: string) => parse(kind, fixtureLines(kind, name));

function invocation(kind: RealKind, spec: Record<string, unknown> = {}, extra: Partial<AgentInvocation> = {}): AgentInvocation {
  return {
    role: 'builder',
    spec: AgentSchema.parse({ provider: kind, ...spec }),
    prompt: 'Fix the rate limiter.',
    cwd: '/tmp/sandbox',
    env: {},
    ...extra,
  };
}

function sumUsage(events: AgentEvent[]) {
  const total = { inputTokens: 0, outputTokens: 0, cachedTokens: 0, costUsd: 0 };
  for (const e of events) {
    if (e.type !== 'usage') continue;
    total.inputTokens += e.inputTokens;
    total.outputTokens += e.outputTokens;
    total.cachedTokens += e.cachedTokens ?? 0;
    total.costUsd += e.costUsd ?? 0;
  }
  return total;
}

beforeEach(() => {
  vi.useFakeTimers({ toFake: ['Date'] });
  vi.setSystemTime(NOW);
});
afterEach(() => {
  vi.useRealTimers();
});

const CWD = '/repo/.slipway/worktrees/obj-limiter/api';

describe('claude-code parser', () => {
  it('maps a successful stream-json run', () => {
    const final = 'Fixed the off-by-one in RateLimiter.refill; all 6 limiter tests pass.\n<promise>COMPLETE</promise>';
    const events = parseFixture('claude-code', 'success.jsonl');
    // The running total in flight (hard limit): each API message once, however many lines repeat it
    // (msg_01HkV8sR3aZ9 is two lines): 17,000, then + 17,814, + 18,233, + the final answer's, which
    // ends equal to the result's own totals.
    expect(events.filter((e) => e.type === 'usage_so_far').map((e) => e.type === 'usage_so_far' && [e.inputTokens, e.outputTokens, e.cachedTokens])).toEqual([
      [17_000, 3, 11_876],
      [17_000, 3, 11_876],
      [34_814, 151, 28_872],
      [53_047, 239, 46_680],
      [71_515, 280, 64_908],
    ]);
    expect(events.filter((e) => e.type !== 'usage_so_far')).toEqual([
      { type: 'session', sessionId: '5f1c2a9e-8a44-4f0e-9d7b-2c61c3e0b7aa' },
      { type: 'text', text: "I'll start by reading the rate limiter and its test." },
      { type: 'tool_call', name: 'Read', input: { file_path: `${CWD}/src/limiter.ts` } },
      { type: 'text', text: 'The refill subtracts one extra millisecond. Fixing it.' },
      { type: 'tool_call', name: 'Edit', input: { file_path: `${CWD}/src/limiter.ts`, old_string: 'now - this.last - 1', new_string: 'now - this.last' } },
      { type: 'tool_call', name: 'Bash', input: { command: 'npm test -- limiter', description: 'Run the limiter tests' } },
      { type: 'text', text: final },
      // Only the result's totals: 19 + 6588 cache writes + 64908 cache reads.
      { type: 'usage', inputTokens: 71_515, outputTokens: 280, cachedTokens: 64_908, costUsd: 0.1834215 },
      { type: 'session_totals', totals: { costUsd: 0.1834215 } },
      { type: 'result', text: final },
    ]);
  });

  it('reports an API error once, with the result and its usage', () => {
    const message = 'API Error: 500 {"type":"error","error":{"type":"api_error","message":"Internal server error"},"request_id":"req_011CUq3kz9Y8"}';
    const events = parseFixture('claude-code', 'error.jsonl');
    // The synthetic error message's zeros are no usage.
    expect(events.filter((e) => e.type === 'usage_so_far')).toEqual([{ type: 'usage_so_far', inputTokens: 13_220, outputTokens: 22, cachedTokens: 9120 }]);
    expect(events.filter((e) => e.type !== 'usage_so_far')).toEqual([
      { type: 'session', sessionId: '9d3e7b21-5c04-4b8a-a2f6-7e1d0c5b9a34' },
      { type: 'tool_call', name: 'Glob', input: { pattern: 'src/**/*.ts' } },
      { type: 'text', text: message },
      { type: 'error', message },
      { type: 'usage', inputTokens: 13_220, outputTokens: 22, cachedTokens: 9120, costUsd: 0.0231 },
      { type: 'session_totals', totals: { costUsd: 0.0231 } },
      { type: 'result', text: message, isError: true },
    ]);
  });

  it('reports a rejected rate limit once, with its reset time', () => {
    const events = parseFixture('claude-code', 'rate-limit.jsonl');
    expect(events.filter((e) => e.type === 'rate_limit')).toEqual([
      { type: 'rate_limit', resetAt: '2026-01-01T05:00:00.000Z', message: 'Claude five_hour rate limit reached' },
    ]);
    expect(events).toContainEqual({ type: 'session', sessionId: 'c4a8e0f3-6d17-4b92-8e5a-1f3b7d9c2e68' });
    expect(events).toContainEqual({ type: 'error', message: 'Claude AI usage limit reached|1767243600' });
    expect(events.at(-1)).toEqual({ type: 'result', text: 'Claude AI usage limit reached|1767243600', isError: true });
  });

  it('reads the reset time from the legacy "usage limit reached|<epoch>" result alone', () => {
    const events = parse('claude-code', [
      JSON.stringify({ type: 'result', subtype: 'success', is_error: true, result: 'Claude AI usage limit reached|1753675200', session_id: 's1', total_cost_usd: 0, usage: { input_tokens: 0, output_tokens: 0 } }),
    ]);
    expect(events).toContainEqual({ type: 'rate_limit', resetAt: '2025-07-28T04:00:00.000Z', message: 'Claude AI usage limit reached|1753675200' });
    expect(events).toContainEqual({ type: 'session', sessionId: 's1' });
  });

  it('uses the errors list when an error result has no text, and ignores allowed rate-limit notices', () => {
    const events = parse('claude-code', [
      JSON.stringify({ type: 'rate_limit_event', rate_limit_info: { status: 'allowed', isUsingOverage: false } }),
      JSON.stringify({ type: 'result', subtype: 'error_max_turns', is_error: true, num_turns: 30, errors: ['Reached maximum number of turns (30)'], session_id: 's2', total_cost_usd: 1.25, usage: { input_tokens: 10, output_tokens: 5 } }),
    ]);
    expect(events).toEqual([
      { type: 'session', sessionId: 's2' },
      { type: 'usage', inputTokens: 10, outputTokens: 5, cachedTokens: 0, costUsd: 1.25 },
      { type: 'session_totals', totals: { costUsd: 1.25 } },
      { type: 'error', message: 'Reached maximum number of turns (30)' },
      { type: 'result', text: '', isError: true },
    ]);
  });

  it('on a resumed session, reports this run\'s cost: model_usage_since_last_result, else total_cost_usd minus the session\'s previous total', () => {
    const result = (extra: Record<string, unknown>) =>
      JSON.stringify({ type: 'result', subtype: 'success', is_error: false, result: 'ok', session_id: 's3', total_cost_usd: 0.024, usage: { input_tokens: 2000, output_tokens: 400 }, ...extra });
    const costOf = (events: AgentEvent[]) => events.find((e): e is Extract<AgentEvent, { type: 'usage' }> => e.type === 'usage')?.costUsd;
    const baseline = { costUsd: 0.012 };
    // CLI 2.1.x: the per-run figure it prints wins.
    const since = { model_usage_since_last_result: { 'claude-sonnet-4-5': { costUSD: 0.01 }, 'claude-haiku-4-5': { costUSD: 0.001 } } };
    expect(costOf(createClaudeCodeProvider({ baseline }).parseLine(result(since), 'stdout'))).toBeCloseTo(0.011, 12);
    // Older CLIs: the session total minus the previous run's.
    const events = createClaudeCodeProvider({ baseline }).parseLine(result({}), 'stdout');
    expect(costOf(events)).toBeCloseTo(0.012, 12);
    expect(events).toContainEqual({ type: 'session_totals', totals: { costUsd: 0.024 } });
    expect(costOf(createClaudeCodeProvider().parseLine(result({}), 'stdout'))).toBe(0.024);
  });

  it('reports each tool call its permission rules denied (permission_denials)', () => {
    const denial = (tool: string) => ({ tool_name: tool, tool_use_id: 't', tool_input: {} });
    const events = parse('claude-code', [JSON.stringify({ type: 'result', subtype: 'success', is_error: false, result: 'done', session_id: 's', permission_denials: [denial('Write'), denial('Bash'), { nonsense: 1 }] })]);
    expect(events.filter((e) => e.type === 'denied')).toEqual([{ type: 'denied', tool: 'Write' }, { type: 'denied', tool: 'Bash' }, { type: 'denied', tool: 'unknown' }]);
    // So its builder runs read the work before they start (the "changed nothing" check needs it).
    expect(createClaudeCodeProvider().reportsRefusals).toBe(true);
  });

  it('does not treat an agent talking about rate limits as a rate limit', () => {
    const events = parse('claude-code', [
      JSON.stringify({ type: 'assistant', message: { content: [{ type: 'text', text: 'I added a rate limit of 429 requests.' }] }, session_id: 's3' }),
    ]);
    expect(events.some((e) => e.type === 'rate_limit')).toBe(false);
  });
});

describe('codex parser', () => {
  it('maps a successful exec --json run', () => {
    const final = 'Fixed the off-by-one in `RateLimiter.refill`; the 6 limiter tests pass.\n<promise>COMPLETE</promise>';
    expect(parseFixture('codex', 'success.jsonl')).toEqual([
      { type: 'session', sessionId: '0199a213-81c0-7800-8aa1-bbab2a035a53' },
      { type: 'tool_call', name: 'command_execution', input: { command: "bash -lc 'rg -n \"class RateLimiter\" src'" } },
      { type: 'tool_call', name: 'file_change', input: { changes: [{ path: `${CWD}/src/limiter.ts`, kind: 'update' }] } },
      { type: 'tool_call', name: 'mcp__docs__search', input: { query: 'token bucket refill' } },
      { type: 'tool_call', name: 'command_execution', input: { command: "bash -lc 'npm test -- limiter'" } },
      { type: 'text', text: final },
      { type: 'usage', inputTokens: 48_213, outputTokens: 1877, cachedTokens: 39_936 },
      { type: 'session_totals', totals: { inputTokens: 48_213, outputTokens: 1877, cachedTokens: 39_936 } },
      { type: 'result', text: final },
    ]);
  });

  it('ignores reconnect retries and reports the fatal error once', () => {
    expect(parseFixture('codex', 'error.jsonl')).toEqual([
      { type: 'session', sessionId: '0199b4c7-2e19-7a31-9d04-5c8e7f1a2b36' },
      { type: 'error', message: 'stream disconnected before completion: error sending request for url (https://chatgpt.com/backend-api/codex/responses)' },
    ]);
  });

  it('reports a usage limit with the reset time from "try again in ..."', () => {
    const message = "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing) or try again in 1 day 2 hours 5 minutes.";
    expect(parseFixture('codex', 'rate-limit.jsonl')).toEqual([
      { type: 'session', sessionId: '0199c0d1-7f42-7b08-a6e3-9e2d4c1f8a57' },
      { type: 'rate_limit', resetAt: '2026-01-02T02:05:00.000Z', message },
      { type: 'error', message },
    ]);
  });

  it('reads absolute and structured reset times', () => {
    expect(codexResetAt("You've hit your usage limit. Visit https://chatgpt.com/codex/settings/usage to purchase more credits or try again at Apr 28th, 2026 10:03 PM."))
      .toBe(new Date(2026, 3, 28, 22, 3).toISOString());
    expect(codexResetAt('{"error":{"type":"usage_limit_reached","resets_at":1767243600,"resets_in_seconds":18000}}')).toBe('2026-01-01T05:00:00.000Z');
    expect(codexResetAt('Rate limit reached for gpt-5 in organization org-x on tokens per min. Please try again in 1.5s.')).toBe('2026-01-01T00:00:01.500Z');
    expect(codexResetAt('exceeded retry limit, last status: 429 Too Many Requests')).toBeUndefined();
  });

  it('reports usage totals as deltas when a run has several turns', () => {
    const events = parse('codex', [
      JSON.stringify({ type: 'turn.completed', usage: { input_tokens: 1000, cached_input_tokens: 800, output_tokens: 50 } }),
      JSON.stringify({ type: 'turn.completed', usage: { input_tokens: 2500, cached_input_tokens: 2000, output_tokens: 90 } }),
    ]);
    expect(events.filter((e) => e.type === 'usage')).toEqual([
      { type: 'usage', inputTokens: 1000, outputTokens: 50, cachedTokens: 800 },
      { type: 'usage', inputTokens: 1500, outputTokens: 40, cachedTokens: 1200 },
    ]);
  });

  it('tells retry noise (which must not hold off the idle timeout) from progress', () => {
    const codex = createCodexProvider();
    expect(codex.isRetryNoise?.('{"type":"error","message":"Reconnecting... 2/5 (stream disconnected before completion)"}', 'stdout')).toBe(true);
    expect(codex.isRetryNoise?.('Reconnecting... 3/5', 'stderr')).toBe(true);
    expect(codex.isRetryNoise?.('{"type":"error","message":"unexpected status 500"}', 'stdout')).toBe(false);
    expect(codex.isRetryNoise?.('{"type":"item.completed","item":{"type":"agent_message","text":"Reconnecting... is what I saw"}}', 'stdout')).toBe(false);
    const claude = createClaudeCodeProvider();
    expect(claude.isRetryNoise?.('{"type":"system","subtype":"api_retry","attempt":1,"error_status":529}', 'stdout')).toBe(true);
    expect(claude.isRetryNoise?.('{"type":"system","subtype":"init","session_id":"s"}', 'stdout')).toBe(false);
  });

  it('on a resumed thread, reports this run\'s usage: the thread totals minus those its previous run ended with', () => {
    const turn = JSON.stringify({ type: 'turn.completed', usage: { input_tokens: 4000, cached_input_tokens: 1000, output_tokens: 800 } });
    const resumed = createCodexProvider({ baseline: { inputTokens: 2000, cachedTokens: 600, outputTokens: 400 } }).parseLine(turn, 'stdout');
    expect(resumed).toContainEqual({ type: 'usage', inputTokens: 2000, outputTokens: 400, cachedTokens: 400 });
    expect(resumed).toContainEqual({ type: 'session_totals', totals: { inputTokens: 4000, cachedTokens: 1000, outputTokens: 800 } });
  });
});

describe('codex session file: the tool calls of the run that just ended', () => {
  // Shapes from codex 0.169 rollout files (sessions/YYYY/MM/DD/rollout-*.jsonl), trimmed.
  const ev = (payload: Record<string, unknown>) => JSON.stringify({ timestamp: '2026-11-23T16:13:51.453Z', type: 'event_msg', payload });
  const command = (cmd: string, status: string, exit: number, output = '') =>
    ev({ type: 'item_completed', item: { type: 'CommandExecution', id: `call_${cmd.length}`, command: ['/bin/bash', '-lc', cmd], status, exit_code: exit, aggregated_output: output } });
  const started = ev({ type: 'task_started', turn_id: 't' });
  const message = ev({ type: 'item_completed', item: { type: 'AgentMessage', content: [{ type: 'Text', text: 'done' }] } });

  it('counts only the items after the last task_started (a resumed thread holds earlier runs); a call that could not run is a failure, a command that exited non-zero is not', () => {
    const earlier = [started, command('printf x > a.txt', 'failed', -1)];
    const now = [started, message, command('ls', 'completed', 0), command('cat missing', 'completed', 1, 'cat: missing: No such file'), ev({ type: 'task_complete' }), command('printf y > b.txt', 'failed', -1)];
    const calls = codexSessionToolCalls([...earlier, ...now, '{"torn'].join('\n'));
    expect(calls.calls).toBe(3);
    expect(calls.failed).toEqual(['CommandExecution `printf y > b.txt` failed (exit -1)']);
    expect(codexSessionToolCalls([started, command('false', 'failed', 1, 'oops')].join('\n')).failed).toEqual([]);
    expect(calls.hint).toMatch(/bypassPermissions/);
  });

  it('a command still running when codex ended is the failed call codex records for it, also when that record (written as codex shuts down) is missing', () => {
    // Recorded from codex 0.169 under workspace-write here (its own sandbox cannot run the command), trimmed.
    const lines = fixtureLines('codex', 'session-still-running.jsonl').filter((l) => l.trim());
    const expected = { calls: 1, failed: ["CommandExecution `printf '%s\\n' 'written by the agent for hello.txt' > hello.txt` failed (still running when codex ended)"] };
    expect(JSON.parse(lines.at(-1)!).payload.item).toMatchObject({ type: 'CommandExecution', status: 'failed', exit_code: -1 });
    expect(codexSessionToolCalls(lines.join('\n'))).toMatchObject(expected);
    // Recorded with 137 (the kill of the run's process group got there before codex's own; seen in CI): the same answer.
    const killed = [...lines.slice(0, -1), lines.at(-1)!.replace('"exit_code":-1', '"exit_code":137')];
    expect(killed.at(-1)).toContain('"exit_code":137');
    expect(codexSessionToolCalls(killed.join('\n'))).toMatchObject(expected);
    // Without the shutdown record (codex exited before writing it): the same answer, not "no calls".
    expect(codexSessionToolCalls(lines.slice(0, -1).join('\n'))).toMatchObject(expected);
    // Its record under another id but the same process: counted once.
    const renamed = [...lines.slice(0, -1), lines.at(-1)!.replace(/"id":"call_[^"]+"/, '"id":"item_other"')];
    expect(renamed.at(-1)).toContain('"id":"item_other"');
    expect(codexSessionToolCalls(renamed.join('\n'))).toMatchObject(expected);
    // A still-running call from an earlier run of a resumed thread is not this run's.
    expect(codexSessionToolCalls([...lines.slice(0, -1), started, message].join('\n'))).toMatchObject({ calls: 0, failed: [] });
    // The command's own output saying so does not count: only the header before `Output:`.
    const echoed = lines.slice(0, -1).map((l) => l.replace(/Process running with session ID \d+/, 'Process exited with code 0').replace(/Output:\\n/, 'Output:\\nProcess running with session ID 7\\n'));
    expect(echoed.join('\n')).toContain('Output:\\nProcess running with session ID 7');
    expect(codexSessionToolCalls(echoed.join('\n'))).toMatchObject({ calls: 0, failed: [] });
    // A call whose process exited when it returned, without a record: not a failure (codex records those as they end).
    const exited = lines.slice(0, -1).map((l) => l.replace(/Process running with session ID \d+/, 'Process exited with code 0'));
    expect(codexSessionToolCalls(exited.join('\n'))).toMatchObject({ calls: 0, failed: [] });
  });

  it('a declined patch is a failure; a run without tool calls has none', () => {
    const declined = ev({ type: 'item_completed', item: { type: 'FileChange', id: 'p', status: 'declined' } });
    expect(codexSessionToolCalls([started, declined].join('\n'))).toMatchObject({ calls: 1, failed: ['FileChange declined'] });
    expect(codexSessionToolCalls([started, message].join('\n'))).toMatchObject({ calls: 0, failed: [] });
    expect(codexSessionToolCalls('')).toMatchObject({ calls: 0, failed: [] });
  });
});

describe('opencode parser', () => {
  it('maps a successful run --format json run', () => {
    const final = 'Fixed the off-by-one in RateLimiter.refill; the 6 limiter tests pass.\n<promise>COMPLETE</promise>';
    const events = parseFixture('opencode', 'success.jsonl');
    expect(events).toEqual([
      { type: 'session', sessionId: 'ses_4f9b2c1d7ffeYq8Rk3sLmN0aBc' },
      { type: 'text', text: "I'll read the limiter first." },
      { type: 'tool_call', name: 'read', input: { filePath: `${CWD}/src/limiter.ts` } },
      { type: 'usage', inputTokens: 4122, outputTokens: 74, cachedTokens: 0, costUsd: 0.0161 },
      { type: 'tool_call', name: 'edit', input: { filePath: `${CWD}/src/limiter.ts`, oldString: 'now - this.last - 1', newString: 'now - this.last' } },
      { type: 'tool_call', name: 'bash', input: { command: 'npm test -- limiter', description: 'Run limiter tests' } },
      { type: 'usage', inputTokens: 4441, outputTokens: 188, cachedTokens: 4110, costUsd: 0.0089 },
      { type: 'text', text: final },
      { type: 'usage', inputTokens: 4535, outputTokens: 51, cachedTokens: 4432, costUsd: 0.0042 },
      { type: 'result', text: final },
    ]);
    const total = sumUsage(events);
    expect(total).toMatchObject({ inputTokens: 13_098, outputTokens: 313, cachedTokens: 8542 });
    expect(total.costUsd).toBeCloseTo(0.0292, 10);
  });

  it('reports the API error with its name', () => {
    expect(parseFixture('opencode', 'error.jsonl')).toEqual([
      { type: 'session', sessionId: 'ses_4f9a8e2b3ffeP0wQ7tY5uI1oZx' },
      { type: 'tool_call', name: 'bash', input: { command: 'cat missing.txt', description: 'Read notes' } },
      { type: 'usage', inputTokens: 2965, outputTokens: 52, cachedTokens: 0, costUsd: 0.0113 },
      { type: 'error', message: 'APIError: prompt is too long: 215004 tokens > 200000 maximum' },
    ]);
  });

  it('reports a 429 with the reset time from retry-after', () => {
    const message = 'This request would exceed the rate limit for your organization of 30,000 input tokens per minute.';
    expect(parseFixture('opencode', 'rate-limit.jsonl')).toEqual([
      { type: 'session', sessionId: 'ses_4f9a1c7e5ffeL2kJ9hG4fD6sA8' },
      { type: 'rate_limit', resetAt: '2026-01-01T00:00:42.000Z', message },
      { type: 'error', message: `APIError: ${message}` },
    ]);
  });

  it('reads reset headers when retry-after is missing', () => {
    expect(opencodeResetAt({ 'anthropic-ratelimit-requests-reset': '2026-01-01T00:00:30Z', 'anthropic-ratelimit-tokens-reset': '2026-01-01T00:02:00Z' }, '')).toBe('2026-01-01T00:02:00.000Z');
    expect(opencodeResetAt({ 'x-ratelimit-reset-tokens': '6m0s' }, '')).toBe('2026-01-01T00:06:00.000Z');
    expect(opencodeResetAt({ 'retry-after-ms': '1500' }, '')).toBe('2026-01-01T00:00:01.500Z');
    expect(opencodeResetAt({}, 'Rate limit reached. Please try again in 20s.')).toBe('2026-01-01T00:00:20.000Z');
    expect(opencodeResetAt({}, 'Too many requests')).toBeUndefined();
  });

  it('gives the final answer at done when no step finished with stop', () => {
    const events = parse('opencode', [
      JSON.stringify({ type: 'step_start', sessionID: 'ses_1', part: { type: 'step-start' } }),
      JSON.stringify({ type: 'text', sessionID: 'ses_1', part: { type: 'text', text: 'Done.' } }),
      JSON.stringify({ type: 'done', sessionID: 'ses_1', reason: 'idle' }),
    ]);
    expect(events).toEqual([
      { type: 'session', sessionId: 'ses_1' },
      { type: 'text', text: 'Done.' },
      { type: 'result', text: 'Done.' },
    ]);
  });
});

describe('pi parser', () => {
  it('maps a successful --mode json run', () => {
    const final = 'Fixed the off-by-one in RateLimiter.refill; the 6 limiter tests pass.\n<promise>COMPLETE</promise>';
    const events = parseFixture('pi', 'success.jsonl');
    expect(events).toEqual([
      { type: 'session', sessionId: '0b6c4f7e-3c1d-4a5e-9f2a-6d8e1b2c3a4f' },
      { type: 'text', text: "I'll read the limiter first." },
      { type: 'usage', inputTokens: 4213, outputTokens: 61, cachedTokens: 0, costUsd: 0.0167115 },
      { type: 'tool_call', name: 'read', input: { path: 'src/limiter.ts' } },
      { type: 'usage', inputTokens: 4603, outputTokens: 142, cachedTokens: 4210, costUsd: 0.004863 },
      { type: 'tool_call', name: 'edit', input: { path: 'src/limiter.ts', oldText: 'now - this.last - 1', newText: 'now - this.last' } },
      { type: 'tool_call', name: 'bash', input: { command: 'npm test -- limiter' } },
      { type: 'text', text: final },
      { type: 'usage', inputTokens: 4722, outputTokens: 37, cachedTokens: 4598, costUsd: 0.0023964 },
      { type: 'result', text: final },
    ]);
    expect(sumUsage(events).costUsd).toBeCloseTo(0.0239709, 10);
  });

  it('reports a provider error without a result', () => {
    expect(parseFixture('pi', 'error.jsonl')).toEqual([
      { type: 'session', sessionId: '7e2d9a1c-4b6f-4c3e-8a1d-2f5b9c7e0d13' },
      { type: 'usage', inputTokens: 0, outputTokens: 0, cachedTokens: 0, costUsd: 0 },
      { type: 'error', message: '400 {"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215004 tokens > 200000 maximum"}}' },
    ]);
  });

  it('reports a rate limit only once pi stops retrying, with resets_at', () => {
    const message = 'Codex error: {"type":"error","error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":1767243600,"eligible_promo":null,"resets_in_seconds":18000},"status_code":429}';
    const lines = fixtureLines('pi', 'rate-limit.jsonl');
    const provider = createPiProvider();
    const perLine = lines.map((line) => provider.parseLine(line, 'stdout'));
    const retried = lines.findIndex((line) => line.includes('"willRetry":true'));
    expect(perLine.slice(0, retried + 1).flat().some((e) => e.type === 'rate_limit')).toBe(false);
    expect(perLine.flat().filter((e) => e.type !== 'usage')).toEqual([
      { type: 'session', sessionId: 'a91f3c5e-7d2b-4e8a-b6c0-3d1e5f7a9b24' },
      { type: 'error', message },
      { type: 'rate_limit', resetAt: '2026-01-01T05:00:00.000Z', message },
    ]);
  });

  it('reads relative reset hints', () => {
    expect(piResetAt('429 Too Many Requests: retry after 30 seconds')).toBe('2026-01-01T00:00:30.000Z');
    expect(piResetAt('Resource exhausted. Please try again in 2m')).toBe('2026-01-01T00:02:00.000Z');
    expect(piResetAt('429 rate_limit_error')).toBeUndefined();
  });
});

describe('copilot parser', () => {
  const final = 'Wrote fixed.txt. <promise>COMPLETE</promise>';
  it('maps a real --output-format json run (1.0.102, resumed): tool call, answer, session id at the end, no usage event', () => {
    expect(parseFixture('copilot', 'success.jsonl')).toEqual([
      { type: 'tool_call', name: 'bash', input: { command: "printf '%s' 'written by the agent for fixed.txt' > fixed.txt", description: 'write the file' } },
      { type: 'text', text: final },
      { type: 'session', sessionId: 'e4c3f1cb-e9b5-42dd-b2fd-0353795e1fcf' },
      { type: 'result', text: final },
    ]);
    // Its `result` holds premium requests and durations, no tokens: the provider says so, run-agent records usage unknown.
    expect(createCopilotProvider().reportsNoTokens).toBe(true);
  });

  it('a rejected key (a real 401 from the endpoint) is a configuration error, and the failed run gives no result', () => {
    const events = parseFixture('copilot', 'error.jsonl');
    expect(events.filter((e) => e.type === 'config_error')).toEqual([
      { type: 'config_error', message: expect.stringMatching(/^Authentication failed with provider at http:\/\/127\.0\.0\.1:4100\/v1 \(HTTP 401\)/) },
    ]);
    expect(events.filter((e) => e.type === 'result')).toEqual([]);
    expect(events.filter((e) => e.type === 'session')).toHaveLength(1);
  });

  it('a session error that is not about credentials is an error, a 429 a rate limit, neither a configuration error', () => {
    const line = (data: unknown) => JSON.stringify({ type: 'session.error', data });
    expect(parse('copilot', [line({ errorType: 'query', message: 'model returned 500', statusCode: 500 })])).toEqual([{ type: 'error', message: 'model returned 500' }]);
    expect(parse('copilot', [line({ errorType: 'rate_limit', message: 'Too many requests (429)', statusCode: 429 })]).map((e) => e.type)).toEqual(['rate_limit', 'error']);
    expect(parse('copilot', [line({ errorType: 'authentication', statusCode: 401 })])).toEqual([
      { type: 'error', message: 'copilot session error (authentication)' },
      { type: 'config_error', message: 'copilot session error (authentication)' },
    ]);
  });

  it('a failed model call (retried inside the CLI) is retry noise, not progress; other events are progress', () => {
    const provider = createCopilotProvider();
    const failure = fixtureLines('copilot', 'error.jsonl').find((l) => l.startsWith('{"type":"model.call_failure"'));
    expect(failure).toBeDefined();
    expect(provider.isRetryNoise!(failure!, 'stdout')).toBe(true);
    for (const line of fixtureLines('copilot', 'success.jsonl')) expect(provider.isRetryNoise!(line, 'stdout'), line.slice(0, 60)).toBe(false);
  });

  it('credential sources: a GitHub token, else the bring-your-own-key endpoint\'s key, none for a local endpoint', () => {
    expect(copilotCredentialSources({})).toEqual({ env: ['COPILOT_GITHUB_TOKEN', 'GH_TOKEN', 'GITHUB_TOKEN'], files: [] });
    expect(copilotCredentialSources({ COPILOT_PROVIDER_BASE_URL: 'https://models.example.com/v1' })).toEqual({ env: ['COPILOT_PROVIDER_API_KEY', 'COPILOT_PROVIDER_BEARER_TOKEN'], files: [] });
    expect(copilotCredentialSources({ COPILOT_PROVIDER_BASE_URL: 'http://127.0.0.1:11434/v1' })).toMatchObject({ keyless: true });
    expect(copilotCredentialSources({ COPILOT_PROVIDER_BASE_URL: 'http://localhost.evil.com/v1' })).not.toMatchObject({ keyless: true });
  });

  it('buildCommand: JSON output, prompt on stdin, --resume=ID, permission modes; an unknown mode names the known ones', () => {
    const provider = createCopilotProvider();
    expect(provider.buildCommand(invocation('copilot', { model: 'gpt-4.1', permission_mode: 'bypassPermissions' }, { resumeSessionId: 'abc', prompt: 'do it' }))).toMatchObject({
      command: 'copilot',
      args: ['--output-format', 'json', '--model', 'gpt-4.1', '--resume=abc', '--allow-all'],
      stdin: 'do it',
    });
    expect(() => provider.buildCommand(invocation('copilot', { permission_mode: 'yolo' }))).toThrow('copilot does not know permission_mode "yolo" (use one of: default, bypassPermissions, allow-all)');
  });
});

describe.each(KINDS)('%s parser robustness', (kind) => {
  it('never throws and ignores malformed JSON and unknown events', () => {
    const garbage = [
      '', '   ', '{', '{"type":', '[1,2', 'null', '{}', '[]', '{"type":42}', '{"type":"future.event","x":1}',
      '{"type":"assistant","message":null}', '{"type":"result","usage":"lots"}', '{"type":"item.completed","item":[]}',
      '{"type":"step_finish","part":{"tokens":{"cache":null}}}', '{"type":"message_end","message":{"role":"assistant","content":"x"}}',
      '{"type":"error","error":null}', '{"type":"tool_execution_start"}', '{"type":"text","part":{"text":7}}',
      `{"type":"${'x'.repeat(100_000)}`, '\u0000\u0001', '{"__proto__":{"polluted":true},"type":"result"}',
    ];
    const provider = FACTORIES[kind]();
    for (const line of garbage) {
      for (const stream of ['stdout', 'stderr'] as const) {
        expect(() => provider.parseLine(line, stream)).not.toThrow();
        expect(Array.isArray(provider.parseLine(line, stream))).toBe(true);
      }
    }
    expect(parse(kind, ['{"type":"future.event","x":1}', '{"type":"assistant","message":{"content":[{"type":"text","text":"cut'])).toEqual([]);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('passes plain non-JSON stdout through as text, and keeps quiet stderr quiet', () => {
    expect(parse(kind, ['Warning: something plain'])).toEqual([{ type: 'text', text: 'Warning: something plain' }]);
    expect(parse(kind, ['Reading prompt from stdin...', 'debug: loaded 3 plugins'], 'stderr')).toEqual([]);
  });

  it('flags rate limits and errors on stderr', () => {
    const events = parse(kind, ['Error: 429 Too Many Requests'], 'stderr');
    expect(events.filter((e) => e.type === 'rate_limit')).toHaveLength(1);
    expect(parse(kind, ['Error: could not find credentials'], 'stderr')).toEqual([{ type: 'error', message: 'Error: could not find credentials' }]);
  });

  it('handles a line with a text field over 1 MB', () => {
    const big = `${'lorem ipsum '.repeat(100_000)}END`;
    expect(big.length).toBeGreaterThan(1_000_000);
    const line = {
      'claude-code': { type: 'assistant', message: { content: [{ type: 'text', text: big }] }, session_id: 's' },
      codex: { type: 'item.completed', item: { id: 'item_9', type: 'agent_message', text: big } },
      opencode: { type: 'text', sessionID: 's', part: { type: 'text', text: big } },
      pi: { type: 'message_end', message: { role: 'assistant', content: [{ type: 'text', text: big }], stopReason: 'stop' } },
      copilot: { type: 'assistant.message', data: { content: big, toolRequests: [] } },
    }[kind];
    const texts = parse(kind, [JSON.stringify(line)]).filter((e) => e.type === 'text');
    expect(texts).toHaveLength(1);
    expect(texts[0].type === 'text' && texts[0].text).toBe(big);
    // The same line cut short (as a line-length limit would) is malformed: no events.
    expect(parse(kind, [JSON.stringify(line).slice(0, 600_000)])).toEqual([]);
  });

  it('reports each session id once', () => {
    const events = parseFixture(kind, 'success.jsonl');
    expect(events.filter((e) => e.type === 'session')).toHaveLength(1);
    expect(events.filter((e) => e.type === 'result')).toHaveLength(1);
  });
});

describe('configuration errors (permanent: retrying cannot help)', () => {
  const configErrors = (kind: RealKind, lines: unknown[]) =>
    parse(kind, lines.map((l) => JSON.stringify(l))).filter((e) => e.type === 'config_error');

  it('claude-code: the first 401 retry, "Not logged in", an authentication_failed message', () => {
    expect(configErrors('claude-code', [{ type: 'system', subtype: 'api_retry', attempt: 1, max_retries: 10, error_status: 401, error: 'authentication_failed', session_id: 's' }])).toEqual([
      { type: 'config_error', message: 'the model API rejected the credentials (HTTP 401, authentication_failed)' },
    ]);
    expect(configErrors('claude-code', [{ type: 'result', subtype: 'success', is_error: true, result: 'Not logged in · Please run /login', session_id: 's', total_cost_usd: 0 }])).toHaveLength(1);
    expect(configErrors('claude-code', [{ type: 'assistant', message: { content: [{ type: 'text', text: 'Invalid API key · Fix external API key' }] }, error: 'authentication_failed', session_id: 's' }])).toHaveLength(1);
    // A server error, a retry for 529: transient.
    expect(configErrors('claude-code', [{ type: 'system', subtype: 'api_retry', attempt: 1, error_status: 529, error: 'overloaded', session_id: 's' }])).toEqual([]);
    expect(configErrors('claude-code', [{ type: 'result', subtype: 'success', is_error: true, result: 'API Error: 500 Internal server error', session_id: 's' }])).toEqual([]);
  });

  it('codex: its own command sandbox failing (the turn still "succeeds")', () => {
    const item = { id: 'item_1', type: 'command_execution', command: 'bash -lc ls', aggregated_output: 'bwrap: execvp /tmp/codex-home/tmp/arg0/codex-linux-sandbox: No such file or directory\n', exit_code: 1, status: 'failed' };
    const events = configErrors('codex', [{ type: 'item.started', item: { ...item, aggregated_output: '', status: 'in_progress' } }, { type: 'item.completed', item }, { type: 'item.completed', item: { ...item, id: 'item_2' } }]);
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({ message: expect.stringMatching(/codex's own command sandbox cannot run commands here \(bwrap: execvp .*codex-linux-sandbox\).*bypassPermissions/) });
    expect(configErrors('codex', [{ type: 'item.completed', item: { ...item, aggregated_output: 'ls: cannot access x: No such file or directory' } }])).toEqual([]);
  });

  it('codex: 401 and a missing env_key variable', () => {
    expect(configErrors('codex', [{ type: 'error', message: 'unexpected status 401 Unauthorized: invalid x-api-key, url: http://127.0.0.1:4100/v1/responses' }])).toHaveLength(1);
    expect(configErrors('codex', [{ type: 'turn.failed', error: { message: 'Missing environment variable: `OPENAI_API_KEY`.' } }])).toHaveLength(1);
    expect(configErrors('codex', [{ type: 'turn.failed', error: { message: 'stream disconnected before completion' } }])).toEqual([]);
  });

  it('pi: a 401 from the provider (exit code 0)', () => {
    const message = { role: 'assistant', content: [], usage: { input: 0, output: 0 }, stopReason: 'error', errorMessage: '401 {"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}' };
    expect(configErrors('pi', [{ type: 'message_end', message }])).toHaveLength(1);
    expect(configErrors('pi', [{ type: 'message_end', message: { ...message, errorMessage: '500 internal error' } }])).toEqual([]);
  });

  it('opencode: a 401 status or an auth error', () => {
    expect(configErrors('opencode', [{ type: 'error', error: { name: 'APIError', data: { message: 'Unauthorized', statusCode: 401 } } }])).toHaveLength(1);
    expect(configErrors('opencode', [{ type: 'error', error: { name: 'ProviderAuthError', data: { message: 'no credentials for anthropic' } } }])).toHaveLength(1);
    expect(configErrors('opencode', [{ type: 'error', error: { name: 'APIError', data: { message: 'Overloaded', statusCode: 529 } } }])).toEqual([]);
  });

  it('claude-code: an unknown permission_mode is refused when the command line is built (at load)', () => {
    const spec = AgentSchema.parse({ provider: 'claude-code', permission_mode: 'yolo' });
    expect(() => agentProvider('claude-code').buildCommand({ role: 'builder', spec, prompt: 'p', cwd: '/', env: {} })).toThrow(/claude-code does not know permission_mode "yolo" \(use one of: default, acceptEdits, auto, bypassPermissions/);
  });
});

describe('buildCommand', () => {
  const BIG = `${'Refactor the limiter. '.repeat(10_000)}<end>`; // ~220 KB

  it('claude-code: print mode, stream-json, prompt on stdin', () => {
    const provider = createClaudeCodeProvider();
    expect(provider.buildCommand(invocation('claude-code'))).toEqual({
      command: 'claude',
      args: ['--print', '--output-format', 'stream-json', '--verbose'],
      stdin: 'Fix the rate limiter.',
      env: undefined,
    });
    const cmd = provider.buildCommand(invocation('claude-code', {
      command: '/opt/fake/claude', model: 'claude-opus-4-1', permission_mode: 'acceptEdits', extra_args: ['--max-turns', '40'],
    }, { resumeSessionId: 'sess-123' }));
    expect(cmd.command).toBe('/opt/fake/claude');
    expect(cmd.args).toEqual([
      '--print', '--output-format', 'stream-json', '--verbose', '--model', 'claude-opus-4-1',
      '--permission-mode', 'acceptEdits', '--resume', 'sess-123', '--max-turns', '40',
    ]);
    expect(cmd.shell).toBeFalsy();
  });

  it('codex: exec --json reading the prompt from stdin, resume subcommand last', () => {
    const provider = createCodexProvider();
    expect(provider.buildCommand(invocation('codex'))).toEqual({
      command: 'codex', args: ['exec', '--json', '-'], stdin: 'Fix the rate limiter.', env: undefined,
    });
    const cmd = provider.buildCommand(invocation('codex', {
      command: './fake-codex', model: 'gpt-5.1-codex', permission_mode: 'workspace-write', extra_args: ['--skip-git-repo-check'],
    }, { resumeSessionId: '0199a213-81c0-7800-8aa1-bbab2a035a53' }));
    expect(cmd.command).toBe('./fake-codex');
    expect(cmd.args).toEqual([
      'exec', '--json', '--model', 'gpt-5.1-codex', '--sandbox', 'workspace-write', '--skip-git-repo-check',
      'resume', '0199a213-81c0-7800-8aa1-bbab2a035a53', '-',
    ]);
    expect(provider.buildCommand(invocation('codex', { permission_mode: 'bypassPermissions' })).args)
      .toEqual(['exec', '--json', '--dangerously-bypass-approvals-and-sandbox', '-']);
    expect(provider.buildCommand(invocation('codex', { permission_mode: 'read-only' })).args).toEqual(['exec', '--json', '--sandbox', 'read-only', '-']);
    expect(() => provider.buildCommand(invocation('codex', { permission_mode: 'yes-please' }))).toThrow(/permission_mode "yes-please"/);
  });

  it('opencode: run --format json, provider/model, session, permissions', () => {
    const provider = createOpencodeProvider();
    expect(provider.buildCommand(invocation('opencode'))).toEqual({
      command: 'opencode', args: ['run', '--format', 'json'], stdin: 'Fix the rate limiter.', env: undefined,
    });
    const cmd = provider.buildCommand(invocation('opencode', {
      model: 'anthropic/claude-sonnet-4-5', permission_mode: 'auto', extra_args: ['--agent', 'build'],
    }, { resumeSessionId: 'ses_4f9b2c1d7ffeYq8Rk3sLmN0aBc', env: { SLIPWAY_STREAM: 'api' } }));
    expect(cmd.args).toEqual([
      'run', '--format', 'json', '--model', 'anthropic/claude-sonnet-4-5', '--session', 'ses_4f9b2c1d7ffeYq8Rk3sLmN0aBc', '--auto', '--agent', 'build',
    ]);
    expect(cmd.env).toEqual({ SLIPWAY_STREAM: 'api' });
    const bypass = provider.buildCommand(invocation('opencode', { permission_mode: 'bypassPermissions' }));
    expect(bypass.args).toEqual(['run', '--format', 'json']);
    expect(bypass.env).toEqual({ OPENCODE_PERMISSION: '{"*":"allow"}' });
    expect(() => provider.buildCommand(invocation('opencode', { model: 'gpt-5' }))).toThrow(/provider\/model/);
    expect(() => provider.buildCommand(invocation('opencode', { permission_mode: 'plan' }))).toThrow(/permission_mode "plan"/);
  });

  it('pi: -p --mode json, model, session, read-only tools', () => {
    const provider = createPiProvider();
    expect(provider.buildCommand(invocation('pi'))).toEqual({
      command: 'pi', args: ['-p', '--mode', 'json'], stdin: 'Fix the rate limiter.', env: undefined,
    });
    const cmd = provider.buildCommand(invocation('pi', {
      command: 'fake-pi', model: 'anthropic/claude-sonnet-4-5', permission_mode: 'read-only', extra_args: ['--thinking', 'high'],
    }, { resumeSessionId: '0b6c4f7e-3c1d-4a5e-9f2a-6d8e1b2c3a4f' }));
    expect(cmd.command).toBe('fake-pi');
    expect(cmd.args).toEqual([
      '-p', '--mode', 'json', '--model', 'anthropic/claude-sonnet-4-5', '--session', '0b6c4f7e-3c1d-4a5e-9f2a-6d8e1b2c3a4f',
      '--tools', 'read,grep,find,ls', '--thinking', 'high',
    ]);
    expect(() => provider.buildCommand(invocation('pi', { permission_mode: 'acceptEdits' }))).toThrow(/permission_mode "acceptEdits"/);
  });

  it.each(KINDS)('%s: a prompt over 100 KB goes to stdin, never argv', (kind) => {
    const cmd = FACTORIES[kind]().buildCommand(invocation(kind, { model: kind === 'opencode' ? 'openai/gpt-5' : 'm' }, { prompt: BIG, resumeSessionId: 's-1' }));
    expect(BIG.length).toBeGreaterThan(100 * 1024);
    expect(cmd.stdin).toBe(BIG);
    expect(cmd.args.join(' ').length).toBeLessThan(200);
    expect(cmd.args.some((arg) => arg.includes('Refactor the limiter'))).toBe(false);
    expect(cmd.shell).toBeFalsy();
  });
});

describe('registry', () => {
  it('gives every kind its own provider instance per run', () => {
    for (const kind of ['script', ...KINDS] as AgentProviderKind[]) {
      expect(agentProvider(kind).kind).toBe(kind);
    }
    for (const kind of KINDS) expect(agentProvider(kind)).not.toBe(agentProvider(kind));
  });
});

describe('with a fake agent executable', () => {
  let dir: string;
  beforeEach(() => {
    vi.useRealTimers();
    dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-fake-agent-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it.each(KINDS)('%s: runs the built command, feeds the prompt on stdin and parses the output', async (kind) => {
    const fake = path.join(dir, `fake-${kind}`);
    const record = path.join(dir, 'record.json');
    writeFileSync(fake, [
      '#!/usr/bin/env node',
      "const fs = require('node:fs');",
      "const stdin = fs.readFileSync(0, 'utf8');",
      'fs.writeFileSync(process.env.FAKE_RECORD, JSON.stringify({ argv: process.argv.slice(2), stdinLength: stdin.length, tail: stdin.slice(-5) }));',
      "process.stdout.write(fs.readFileSync(process.env.FAKE_FIXTURE, 'utf8'));",
      "process.stderr.write('fake agent: done\\n');",
    ].join('\n'));
    chmodSync(fake, 0o755);
    const prompt = `${'Write the tests first. '.repeat(20_000)}<end>`; // ~460 KB
    const provider = agentProvider(kind);
    const cmd = provider.buildCommand(invocation(kind, { command: fake }, { prompt }));
    const events: AgentEvent[] = [];
    const run = await runProcess({
      command: cmd.command,
      args: cmd.args,
      stdin: cmd.stdin,
      cwd: dir,
      env: { ...process.env, ...cmd.env, FAKE_RECORD: record, FAKE_FIXTURE: path.join(FIXTURES, kind, 'success.jsonl') },
      timeoutMs: 30_000,
      onLine: (stream, line) => events.push(...provider.parseLine(line, stream)),
    });
    expect(run.exitCode).toBe(0);
    const seen = JSON.parse(readFileSync(record, 'utf8'));
    expect(seen).toEqual({ argv: cmd.args, stdinLength: prompt.length, tail: '<end>' });
    expect(events).toEqual(parseFixture(kind, 'success.jsonl'));
  });
});
