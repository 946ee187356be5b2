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
 * Usage and cost come ONLY from the final `result` event, which totals the whole run. The
 * `usage` on `assistant` lines is ignored: one API message is split over several assistant lines
 * that repeat the same usage, so summing them would double count.
 * Token convention (shared by all providers): inputTokens counts every prompt token including
 * cache reads and cache writes; cachedTokens is the part read from the cache.
 */
import { withExecutable } from './command-line';
import type { AgentEvent, AgentProvider } from './provider';

type Json = Record<string, unknown>;

const isObject = (value: unknown): value is Json => typeof value === 'object' && value !== null && !Array.isArray(value);
const str = (value: unknown): string | undefined => (typeof value === 'string' ? value : undefined);
const num = (value: unknown): number => (typeof value === 'number' && Number.isFinite(value) ? value : 0);

/** Legacy subscription limit text: "Claude AI usage limit reached|1753675200". */
const USAGE_LIMIT_EPOCH = /usage limit reached\|(\d{9,13})/i;
/** Rate-limit wording, only trusted on lines already known to be errors. */
const RATE_LIMIT_TEXT = /rate[ _-]?limit|usage limit|hit your limit|too many requests|\b429\b/i;
const STDERR_ERROR = /^\s*(error|fatal)\b/i;

function epochToIso(value: unknown): string | undefined {
  const n = typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isFinite(n) || n <= 0) return undefined;
  const date = new Date(n < 1e12 ? n * 1000 : n);
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString();
}

function resetFromText(text: string): string | undefined {
  const match = USAGE_LIMIT_EPOCH.exec(text);
  return match ? epochToIso(match[1]) : undefined;
}

/** A line that is JSON, plain text, or neither (malformed JSON, blank). */
function decode(line: string): { json: Json } | { text: string } | undefined {
  const trimmed = line.trim();
  if (!trimmed) return undefined;
  if (trimmed[0] !== '{' && trimmed[0] !== '[') return { text: line };
  try {
    const value: unknown = JSON.parse(trimmed);
    return isObject(value) ? { json: value } : undefined;
  } catch {
    return undefined;
  }
}

/** One provider instance per agent run (see registry.ts): the parser remembers the session and rate limit it reported. */
export function createClaudeCodeProvider(): AgentProvider {
  let sessionId: string | undefined;
  let rateLimit: 'with-reset' | 'without-reset' | undefined;
  let lastError: string | undefined;

  const session = (id: unknown): AgentEvent[] => {
    if (typeof id !== 'string' || !id || id === sessionId) return [];
    sessionId = id;
    return [{ type: 'session', sessionId: id }];
  };

  /** Reports a rate limit once, unless a later line adds the reset time the first one lacked. */
  const limited = (message: string, resetAt?: string): AgentEvent[] => {
    if (rateLimit === 'with-reset' || (rateLimit && !resetAt)) return [];
    rateLimit = resetAt ? 'with-reset' : 'without-reset';
    return [resetAt ? { type: 'rate_limit', resetAt, message } : { type: 'rate_limit', message }];
  };

  /** Reports an error once: the synthetic assistant message and the result repeat the same text. */
  const failed = (message: string): AgentEvent[] => {
    if (message === lastError) return [];
    lastError = message;
    return [{ type: 'error', message }];
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
    }
    return out;
  };

  const result = (event: Json): AgentEvent[] => {
    const out: AgentEvent[] = [];
    if (isObject(event.usage) || typeof event.total_cost_usd === 'number') {
      const usage = isObject(event.usage) ? event.usage : {};
      const cacheRead = num(usage.cache_read_input_tokens);
      out.push({
        type: 'usage',
        inputTokens: num(usage.input_tokens) + cacheRead + num(usage.cache_creation_input_tokens),
        outputTokens: num(usage.output_tokens),
        cachedTokens: cacheRead,
        ...(typeof event.total_cost_usd === 'number' ? { costUsd: event.total_cost_usd } : {}),
      });
    }
    const text = str(event.result) ?? '';
    const isError = event.is_error === true || (typeof event.subtype === 'string' && event.subtype.startsWith('error'));
    if (isError) {
      const errors = Array.isArray(event.errors) ? event.errors.filter((e): e is string => typeof e === 'string') : [];
      const message = text || errors.join('; ') || str(event.subtype) || 'Claude Code reported an error';
      if (RATE_LIMIT_TEXT.test(message)) out.push(...limited(message, resetFromText(message)));
      out.push(...failed(message));
    }
    out.push(isError ? { type: 'result', text, isError: true } : { type: 'result', text });
    return out;
  };

  return {
    kind: 'claude-code',
    buildCommand(invocation) {
      const { spec } = invocation;
      const args = ['--print', '--output-format', 'stream-json', '--verbose'];
      if (spec.model) args.push('--model', spec.model);
      if (spec.permission_mode) args.push('--permission-mode', spec.permission_mode);
      if (invocation.resumeSessionId) args.push('--resume', invocation.resumeSessionId);
      args.push(...spec.extra_args);
      return {
        ...withExecutable(spec.command, 'claude', args),
        stdin: invocation.prompt,
        env: Object.keys(invocation.env).length > 0 ? { ...invocation.env } : undefined,
      };
    },
    parseLine(line, stream) {
      try {
        if (stream === 'stderr') {
          if (RATE_LIMIT_TEXT.test(line)) return limited(line.trim(), resetFromText(line));
          return STDERR_ERROR.test(line) ? [{ type: 'error', message: line.trim() }] : [];
        }
        const decoded = decode(line);
        if (!decoded) return [];
        if ('text' in decoded) return [{ type: 'text', text: decoded.text }];
        const event = decoded.json;
        const out = session(event.session_id);
        switch (event.type) {
          case 'assistant':
            out.push(...assistant(event));
            break;
          case 'result':
            out.push(...result(event));
            break;
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
      } catch {
        return [];
      }
    },
  };
}
