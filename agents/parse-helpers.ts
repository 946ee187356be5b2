/**
 * Helpers shared by the output parsers of the real agent providers (claude-code, codex, opencode,
 * pi): reading untrusted JSON lines and fields, time conversions for rate-limit resets, and the
 * small per-run reporters that keep a parser from repeating itself.
 *
 * What differs between agents stays in the provider: which wording means a rate limit or an error,
 * which reset hints a message may carry, and how each one counts its tokens into the shared convention.
 */
import type { AgentEvent, AgentProvider } from './provider';

export type Json = Record<string, unknown>;

export const isObject = (value: unknown): value is Json => typeof value === 'object' && value !== null && !Array.isArray(value);
export const str = (value: unknown): string | undefined => (typeof value === 'string' ? value : undefined);
/** A token count or cost: a finite number, else 0. */
export const num = (value: unknown): number => (typeof value === 'number' && Number.isFinite(value) ? value : 0);

/** A line that is a JSON object, plain text, or neither (malformed JSON, a JSON non-object, blank). */
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

/**
 * `parseLine` for a JSON-lines agent: stderr lines go to `stderr`, stdout JSON objects to `event`,
 * plain stdout text passes through as a text event, blank or malformed lines yield nothing, and
 * nothing a handler throws escapes (the provider contract: never throw).
 */
export function jsonLineParser(handlers: {
  stderr(line: string): AgentEvent[];
  event(event: Json): AgentEvent[];
}): AgentProvider['parseLine'] {
  return (line, stream) => {
    try {
      if (stream === 'stderr') return handlers.stderr(line);
      const decoded = decode(line);
      if (!decoded) return [];
      if ('text' in decoded) return [{ type: 'text', text: decoded.text }];
      return handlers.event(decoded.json);
    } catch {
      return [];
    }
  };
}

/** Epoch seconds or milliseconds (a number or a string of digits) as an ISO string. */
export function epochToIso(value: unknown): string | undefined {
  const n = typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isFinite(n) || n <= 0) return undefined;
  const date = new Date(n < 1e12 ? n * 1000 : n);
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString();
}

/** The instant `ms` milliseconds from now (rounded up to a whole millisecond), as an ISO string. */
export function isoAfter(ms: number): string {
  return new Date(Date.now() + Math.ceil(ms)).toISOString();
}

/**
 * Milliseconds in one duration unit as written in a reset hint: ms / milli..., d..., h..., m...
 * (minutes), anything else seconds. Which units a message may use is up to each provider's pattern.
 */
export function durationUnitMs(unit: string): number {
  const u = unit.toLowerCase();
  if (u === 'ms' || u.startsWith('milli')) return 1;
  if (u.startsWith('d')) return 86_400_000;
  if (u.startsWith('h')) return 3_600_000;
  if (u.startsWith('m')) return 60_000;
  return 1_000;
}

/**
 * Wording of a permanent credentials failure, in the agents' own error messages: a 401/403 from
 * the model API, "Not logged in", a missing or invalid API key (Claude Code, Codex, Pi, OpenCode).
 */
const AUTH_FAILURE =
  /\b(401|403)\b[^\n]*(unauthori[sz]ed|forbidden|authenticat|api[ _-]?key)|^(401|403)\b|authentication[_ ]failed|authentication_error|invalid[ _-]?(x-)?api[ _-]?key|not logged in|please run \/login|missing environment variable|no api key|api key (is )?(missing|not (set|found))/i;

/** A configuration error for a message that says the credentials are missing or rejected; nothing otherwise. */
export function authFailure(message: string): AgentEvent[] {
  return AUTH_FAILURE.test(message) ? [{ type: 'config_error', message }] : [];
}

export function rateLimitEvent(message: string, resetAt?: string): AgentEvent {
  return resetAt ? { type: 'rate_limit', resetAt, message } : { type: 'rate_limit', message };
}

/**
 * A usage event in the token convention shared by all providers: inputTokens counts every prompt
 * token including cache reads and cache writes; cachedTokens is the part read from the cache.
 * The cost is kept only when it is a number.
 */
export function usageEvent(usage: { input: number; cacheRead: number; cacheWrite: number; output: number; cost: unknown }): AgentEvent {
  return {
    type: 'usage',
    inputTokens: usage.input + usage.cacheRead + usage.cacheWrite,
    outputTokens: usage.output,
    cachedTokens: usage.cacheRead,
    ...(typeof usage.cost === 'number' ? { costUsd: usage.cost } : {}),
  };
}

/** Reports each new session id once (one reporter per run). */
export function sessionReporter(): (id: unknown) => AgentEvent[] {
  let sessionId: string | undefined;
  return (id) => {
    if (typeof id !== 'string' || !id || id === sessionId) return [];
    sessionId = id;
    return [{ type: 'session', sessionId: id }];
  };
}

/** Reports an error unless it repeats the last one reported (agents often echo a fatal error). */
export function errorReporter(): (message: string) => AgentEvent[] {
  let lastError: string | undefined;
  return (message) => {
    if (message === lastError) return [];
    lastError = message;
    return [{ type: 'error', message }];
  };
}

/** Reports a rate limit once, unless a later report adds the reset time the first one lacked. */
export function rateLimitReporter(): (message: string, resetAt?: string) => AgentEvent[] {
  let reported: 'with-reset' | 'without-reset' | undefined;
  return (message, resetAt) => {
    if (reported === 'with-reset' || (reported && !resetAt)) return [];
    reported = resetAt ? 'with-reset' : 'without-reset';
    return [rateLimitEvent(message, resetAt)];
  };
}
