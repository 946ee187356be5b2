/**
 * The `claude-code` provider: Claude Code in headless print mode.
 *
 *   claude --print --output-format stream-json --verbose [--model M] [--permission-mode P]
 *          [--resume SESSION] [...extra_args]        (prompt on stdin, never in argv)
 *
 * Format followed: the Claude Code stream-json output of CLI 2.x, i.e. the Agent SDK message
 * types (system `init`, `assistant` with text / tool_use blocks and an optional `error` tag,
 * `user` tool results, one final `result` with `total_cost_usd`, `usage`, `is_error`, `errors`)
 * plus the `rate_limit_event` lines of CLI >= 2.1.45. Checked against: the headless-mode docs
 * (docs.claude.com/en/docs/claude-code/sdk/sdk-headless: `-p`, `--output-format stream-json`
 * needs `--verbose`, `--resume`, prompt read from stdin when no argument is given), the Agent SDK
 * TypeScript message reference (SDKResultMessage subtypes, SDKAssistantMessage.error), real
 * transcripts in anthropics/claude-code#733, #38673, #49640, and the rate-limit shapes reported
 * in paperclipai/paperclip#5776 (`rate_limit_info.resetsAt`, epoch seconds) and the legacy
 * "Claude AI usage limit reached|<epoch>" result text.
 *
 * Usage and cost come from the final `result` event. The `usage` on `assistant` lines is read only
 * for a running total while the run goes on (`usage_so_far`, for the hard limit in flight, ADR
 * 0017): one API message is split over several assistant lines that repeat the same usage, so
 * they are counted once per message id (the latest line of each), and the result's exact figures
 * replace that total. The result's `usage` totals this run, but its `total_cost_usd`
 * (like `modelUsage`) is the running total of the SESSION: after `--resume` it includes the earlier
 * runs. The run's cost is therefore the sum of `model_usage_since_last_result[*].costUSD` (CLI
 * 2.1.x prints it; one result per print-mode process), else `total_cost_usd` minus the total the
 * session's previous run ended with (`baseline`, session-usage.ts).
 * Token convention (shared by all providers): inputTokens counts every prompt token including
 * cache reads and cache writes; cachedTokens is the part read from the cache.
 */
import path from 'node:path';
import { permissionEntry, stdinCommand } from './command-line';
import {
  authFailure, epochToIso, errorReporter, isObject, type Json, jsonLineParser, num, rateLimitReporter, sessionReporter, str, usageEvent,
} from './parse-helpers';
import type { AgentEvent, AgentProvider, ProviderOptions } from './provider';

/** Legacy subscription limit text: "Claude AI usage limit reached|1753675200". */
const USAGE_LIMIT_EPOCH = /usage limit reached\|(\d{9,13})/i;
/** Rate-limit wording, only trusted on lines already known to be errors. */
const RATE_LIMIT_TEXT = /rate[ _-]?limit|usage limit|hit your limit|too many requests|\b429\b/i;
const STDERR_ERROR = /^\s*(error|fatal)\b/i;

/** `--permission-mode` choices of Claude Code 2.1 (`claude --help`), plus `default` of older releases: anything else the CLI rejects on every attempt, so it is refused at load. */
const PERMISSION_FLAGS: Record<string, string[]> = Object.fromEntries(
  ['default', 'acceptEdits', 'auto', 'bypassPermissions', 'manual', 'dontAsk', 'plan'].map((mode) => [mode, ['--permission-mode', mode]]),
);

/** Claude Code's own folder: sessions, settings, login. */
const claudeConfigDir = (env: Record<string, string | undefined>, home: string) => env.CLAUDE_CONFIG_DIR || path.join(home, '.claude');

function resetFromText(text: string): string | undefined {
  const match = USAGE_LIMIT_EPOCH.exec(text);
  return match ? epochToIso(match[1]) : undefined;
}

/** One provider instance per agent run (see registry.ts): the parser remembers the session and rate limit it reported. */
export function createClaudeCodeProvider({ baseline }: ProviderOptions = {}): AgentProvider {
  const session = sessionReporter();
  const limited = rateLimitReporter();
  /** Reports an error once: the synthetic assistant message and the result repeat the same text. */
  const failed = errorReporter();
  /** Usage per API message id this run (see the header). */
  const messageUsage = new Map<string, { input: number; cacheRead: number; cacheWrite: number; output: number }>();

  /** The running total after an assistant line that carries its message's usage. */
  const soFar = (message: Json): AgentEvent[] => {
    const id = str(message.id);
    // `<synthetic>`: Claude Code's own message for an API error, with zeros.
    if (!id || !isObject(message.usage) || message.model === '<synthetic>') return [];
    const u = message.usage;
    messageUsage.set(id, { input: num(u.input_tokens), cacheRead: num(u.cache_read_input_tokens), cacheWrite: num(u.cache_creation_input_tokens), output: num(u.output_tokens) });
    const sum = { input: 0, cacheRead: 0, cacheWrite: 0, output: 0, cost: undefined };
    for (const m of messageUsage.values()) {
      sum.input += m.input;
      sum.cacheRead += m.cacheRead;
      sum.cacheWrite += m.cacheWrite;
      sum.output += m.output;
    }
    return [{ ...(usageEvent(sum) as Extract<AgentEvent, { type: 'usage' }>), type: 'usage_so_far' }];
  };

  const assistant = (event: Json): AgentEvent[] => {
    const out: AgentEvent[] = [];
    const message = isObject(event.message) ? event.message : {};
    const content = Array.isArray(message.content) ? message.content : [];
    const texts: string[] = [];
    for (const block of content) {
      if (!isObject(block)) continue;
      if (block.type === 'text' && typeof block.text === 'string') {
        texts.push(block.text);
        out.push({ type: 'text', text: block.text });
      } else if (block.type === 'tool_use' && typeof block.name === 'string') {
        out.push({ type: 'tool_call', name: block.name, input: block.input });
      }
    }
    const text = texts.join('\n');
    // A synthetic assistant message carries the API error after Claude Code gave up retrying.
    const error = str(event.error);
    if (error === 'rate_limit' || USAGE_LIMIT_EPOCH.test(text) || /^API Error: 429\b/.test(text)) {
      out.push(...limited(text || 'rate limited', resetFromText(text)));
    } else if (error) {
      out.push(...failed(text || error));
      out.push(...(error === 'authentication_failed' ? [{ type: 'config_error' as const, message: text || error }] : authFailure(text)));
    }
    out.push(...soFar(message));
    return out;
  };

  const result = (event: Json): AgentEvent[] => {
    const out: AgentEvent[] = [];
    const total = typeof event.total_cost_usd === 'number' && Number.isFinite(event.total_cost_usd) ? event.total_cost_usd : undefined;
    if (isObject(event.usage) || total !== undefined) {
      const usage = isObject(event.usage) ? event.usage : {};
      out.push(usageEvent({
        input: num(usage.input_tokens),
        cacheRead: num(usage.cache_read_input_tokens),
        cacheWrite: num(usage.cache_creation_input_tokens),
        output: num(usage.output_tokens),
        cost: runCost(event, total),
      }));
    }
    if (total !== undefined) out.push({ type: 'session_totals', totals: { costUsd: total } });
    const text = str(event.result) ?? '';
    const isError = event.is_error === true || (typeof event.subtype === 'string' && event.subtype.startsWith('error'));
    if (isError) {
      const errors = Array.isArray(event.errors) ? event.errors.filter((e): e is string => typeof e === 'string') : [];
      const message = text || errors.join('; ') || str(event.subtype) || 'Claude Code reported an error';
      if (RATE_LIMIT_TEXT.test(message)) out.push(...limited(message, resetFromText(message)));
      out.push(...failed(message), ...authFailure(message));
    }
    // Print mode cannot ask: a tool call its permission mode does not allow is refused, and the run goes on.
    for (const denial of Array.isArray(event.permission_denials) ? event.permission_denials : []) {
      out.push({ type: 'denied', tool: (isObject(denial) && str(denial.tool_name)) || 'unknown' });
    }
    out.push(isError ? { type: 'result', text, isError: true } : { type: 'result', text });
    return out;
  };

  /** This run's cost: see the header. */
  const runCost = (event: Json, total: number | undefined): number | undefined => {
    const since = event.model_usage_since_last_result;
    if (isObject(since)) {
      const costs = Object.values(since).map((m) => (isObject(m) ? m.costUSD : undefined));
      if (costs.length > 0 && costs.every((c) => typeof c === 'number' && Number.isFinite(c))) return (costs as number[]).reduce((a, b) => a + b, 0);
    }
    if (total === undefined) return undefined;
    // Rounded to 1e-10 dollars: the difference of two totals should not read 0.012500000000000004.
    return Math.max(0, Math.round((total - (baseline?.costUsd ?? 0)) * 1e10) / 1e10);
  };

  return {
    kind: 'claude-code',
    reportsRefusals: true,
    // `{"type":"system","subtype":"api_retry",...}`: Claude Code waiting to retry a failed API call.
    isRetryNoise: (line, stream) => stream === 'stdout' && /^\s*\{\s*"type"\s*:\s*"system"\s*,\s*"subtype"\s*:\s*"api_retry"/.test(line),
    setupHint: 'Set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN, or log in with `claude` as the worker\'s user) in the worker\'s environment or in <repository>/.slipway/.env',
    // `<config>/projects/<cwd with every non-alphanumeric as "-">/<session>.jsonl` (plus `<session>/` for subagents and large tool results).
    sessionLocation: (id, { env, home }) => ({
      root: path.join(claudeConfigDir(env, home), 'projects'),
      belongs: (rel) => {
        const [project, name, ...rest] = rel.split('/');
        return Boolean(project) && (name === `${id}.jsonl` ? rest.length === 0 : name === id && rest.length > 0);
      },
      place: (rel, cwd) => [cwd.replace(/[^a-zA-Z0-9]/g, '-'), ...rel.split('/').slice(1)].join('/'),
    }),
    // Claude Code's login (`claude` /login) is `.credentials.json` in its config folder on Linux; Bedrock and Vertex bring their own cloud credentials.
    // The login file and settings. Not ~/.claude.json: Claude Code rewrites it on every start (its
    // state, not only config), so a read-only copy would break it; it is made afresh in the agent home.
    configFiles: [
      { path: '.claude/.credentials.json', overriddenBy: 'CLAUDE_CONFIG_DIR' },
      { path: '.claude/settings.json', overriddenBy: 'CLAUDE_CONFIG_DIR' },
    ],
    credentialSources: (_spec, { env, home }) => ({
      env: ['ANTHROPIC_API_KEY', 'ANTHROPIC_AUTH_TOKEN', 'CLAUDE_CODE_OAUTH_TOKEN', 'CLAUDE_CODE_USE_BEDROCK', 'CLAUDE_CODE_USE_VERTEX'],
      files: [path.join(claudeConfigDir(env, home), '.credentials.json')],
    }),
    buildCommand(invocation) {
      const { spec } = invocation;
      const args = ['--print', '--output-format', 'stream-json', '--verbose'];
      if (spec.model) args.push('--model', spec.model);
      if (spec.permission_mode) args.push(...(permissionEntry('claude-code', PERMISSION_FLAGS, spec.permission_mode) ?? []));
      if (invocation.resumeSessionId) args.push('--resume', invocation.resumeSessionId);
      args.push(...spec.extra_args);
      return stdinCommand(invocation, 'claude', args);
    },
    parseLine: jsonLineParser({
      stderr(line) {
        if (RATE_LIMIT_TEXT.test(line)) return limited(line.trim(), resetFromText(line));
        return STDERR_ERROR.test(line) ? [{ type: 'error', message: line.trim() }] : [];
      },
      event(event) {
        const out = session(event.session_id);
        switch (event.type) {
          case 'assistant':
            out.push(...assistant(event));
            break;
          case 'result':
            out.push(...result(event));
            break;
          case 'system': {
            // Claude Code retries a rejected key up to 10 times with backoff (minutes): the first rejection settles it.
            const status = typeof event.error_status === 'number' ? event.error_status : undefined;
            if (event.subtype === 'api_retry' && (event.error === 'authentication_failed' || status === 401 || status === 403)) {
              out.push({ type: 'config_error', message: `the model API rejected the credentials (HTTP ${status ?? '?'}, ${str(event.error) ?? 'authentication_failed'})` });
            }
            break;
          }
          case 'rate_limit_event': {
            const info = isObject(event.rate_limit_info) ? event.rate_limit_info : {};
            if (info.status === 'rejected') {
              const kind = str(info.rateLimitType);
              out.push(...limited(`Claude ${kind ? `${kind} ` : ''}rate limit reached`, epochToIso(info.resetsAt)));
            }
            break;
          }
          // system (init, status, compact_boundary, ...), user (tool results), stream_event: nothing beyond the session.
        }
        return out;
      },
    }),
  };
}
