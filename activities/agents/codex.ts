/**
 * The `codex` provider: OpenAI Codex CLI in non-interactive mode.
 *
 *   codex exec --json [--model M] [--sandbox MODE | --dangerously-bypass-approvals-and-sandbox]
 *              [...extra_args] [resume SESSION] -          (prompt on stdin, never in argv)
 *
 * `-` as the prompt makes `codex exec` (and `codex exec resume <id> -`) read the prompt from stdin.
 * Exec-level flags go before the `resume` subcommand, where every codex version accepts them.
 *
 * Format followed: the `codex exec --json` JSONL stream (codex-rs/exec, docs/exec.md and
 * developers.openai.com/codex/noninteractive; flags from codex-rs/exec/src/cli.rs): `thread.started`
 * {thread_id}, `turn.started`, `item.started|updated|completed` with item types agent_message,
 * reasoning, command_execution, file_change, mcp_tool_call, web_search, todo_list, error,
 * `turn.completed` {usage: input_tokens, cached_input_tokens, output_tokens}, `turn.failed`
 * {error.message} and top-level `error` {message}. Top-level `error` lines also carry transient
 * retries ("Reconnecting... 1/5 ..."), which are ignored. Usage-limit wording ("You've hit your
 * usage limit ... try again at Apr 28th, 2026 10:03 PM." / "... try again in 2 days 3 hours") is
 * from openai/codex issues and Th0rgal/sandboxed.sh#394; the backend JSON variant with
 * `resets_at` / `resets_in_seconds` from earendil-works/pi#4172.
 *
 * Usage comes from `turn.completed` (and `turn.failed` when it carries usage). Codex reports the
 * thread's running total there (openai/codex#17539), so each event is turned into the delta since
 * the previous one in this run. Limitation: on `resume` the first total also includes the earlier
 * runs of the thread; the stream carries no baseline to subtract. Codex reports no cost.
 * input_tokens already includes cached_input_tokens, which matches the shared convention.
 */
import { withExecutable } from './command-line';
import type { AgentEvent, AgentProvider } from './provider';

type Json = Record<string, unknown>;

const isObject = (value: unknown): value is Json => typeof value === 'object' && value !== null && !Array.isArray(value);
const str = (value: unknown): string | undefined => (typeof value === 'string' ? value : undefined);
const num = (value: unknown): number => (typeof value === 'number' && Number.isFinite(value) ? value : 0);

const RATE_LIMIT_TEXT = /rate[ _-]?limit|usage limit|usage_limit|hit your limit|too many requests|\b429\b/i;
const RETRYING = /^\s*(Reconnecting|Retrying)\b/i;
const STDERR_ERROR = /^\s*(error|fatal)\b|^\S+\s+ERROR\s/i;
const TOOL_ITEMS = new Set(['command_execution', 'file_change', 'mcp_tool_call', 'web_search']);

/** `permission_mode` values accepted for codex and the flags they become. */
const PERMISSION_FLAGS: Record<string, string[]> = {
  default: [],
  'read-only': ['--sandbox', 'read-only'],
  plan: ['--sandbox', 'read-only'],
  'workspace-write': ['--sandbox', 'workspace-write'],
  acceptEdits: ['--sandbox', 'workspace-write'],
  'danger-full-access': ['--sandbox', 'danger-full-access'],
  bypassPermissions: ['--dangerously-bypass-approvals-and-sandbox'],
  'dangerously-bypass-approvals-and-sandbox': ['--dangerously-bypass-approvals-and-sandbox'],
};

const DURATION_UNITS: Record<string, number> = { d: 86_400_000, h: 3_600_000, m: 60_000, s: 1_000, ms: 1 };

function unitMs(unit: string): number {
  const u = unit.toLowerCase();
  if (u === 'ms' || u.startsWith('milli')) return DURATION_UNITS.ms;
  if (u.startsWith('d')) return DURATION_UNITS.d;
  if (u.startsWith('h')) return DURATION_UNITS.h;
  if (u.startsWith('m')) return DURATION_UNITS.m;
  return DURATION_UNITS.s;
}

function epochToIso(value: unknown): string | undefined {
  const n = typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isFinite(n) || n <= 0) return undefined;
  const date = new Date(n < 1e12 ? n * 1000 : n);
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString();
}

/** "Apr 28th, 2026 10:03 PM" (local time, as codex prints it) or a bare "10:03 PM" (next occurrence). */
function absoluteToIso(text: string): string | undefined {
  const cleaned = text.replace(/(\d+)(st|nd|rd|th)\b/gi, '$1').trim();
  const time = /^(\d{1,2}):(\d{2})\s*(AM|PM)?$/i.exec(cleaned);
  if (time) {
    let hours = Number(time[1]) % (time[3] ? 12 : 24);
    if (time[3]?.toUpperCase() === 'PM') hours += 12;
    const at = new Date();
    at.setHours(hours, Number(time[2]), 0, 0);
    if (at.getTime() <= Date.now()) at.setDate(at.getDate() + 1);
    return at.toISOString();
  }
  const parsed = Date.parse(cleaned);
  return Number.isNaN(parsed) ? undefined : new Date(parsed).toISOString();
}

/** Extracts when a usage/rate limit resets from codex's message text, as an ISO string. */
export function codexResetAt(message: string): string | undefined {
  const resetsAt = /resets_at"?\s*[:=]\s*(\d{9,13})/i.exec(message);
  if (resetsAt) return epochToIso(resetsAt[1]);
  const resetsIn = /resets_in_seconds"?\s*[:=]\s*(\d+)/i.exec(message);
  if (resetsIn) return new Date(Date.now() + Number(resetsIn[1]) * 1000).toISOString();
  const at = /try again at\s+(.+?)\.?\s*$/i.exec(message);
  if (at) {
    const iso = absoluteToIso(at[1]);
    if (iso) return iso;
  }
  const inMatch = /try again in\s+((?:\d+(?:\.\d+)?\s*[a-z]+[\s,]*(?:and\s+)?)+)/i.exec(message);
  if (inMatch) {
    let ms = 0;
    for (const part of inMatch[1].matchAll(/(\d+(?:\.\d+)?)\s*(ms|milliseconds?|d|days?|h|hours?|m|mins?|minutes?|s|secs?|seconds?)\b/gi)) {
      ms += Number(part[1]) * unitMs(part[2]);
    }
    if (ms > 0) return new Date(Date.now() + Math.ceil(ms)).toISOString();
  }
  return undefined;
}

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

interface Totals {
  input: number;
  cached: number;
  output: number;
}

function toolCall(item: Json): AgentEvent {
  switch (item.type) {
    case 'command_execution':
      return { type: 'tool_call', name: 'command_execution', input: { command: item.command } };
    case 'file_change':
      return { type: 'tool_call', name: 'file_change', input: { changes: item.changes } };
    case 'mcp_tool_call':
      return { type: 'tool_call', name: `mcp__${str(item.server) ?? 'unknown'}__${str(item.tool) ?? 'unknown'}`, input: item.arguments };
    default:
      return { type: 'tool_call', name: String(item.type), input: { query: item.query } };
  }
}

/** One provider instance per agent run (see registry.ts): the parser keeps the thread id, tool items seen and the last usage total. */
export function createCodexProvider(): AgentProvider {
  let threadId: string | undefined;
  let lastAgentMessage: string | undefined;
  let lastTotals: Totals | undefined;
  let lastError: string | undefined;
  let rateLimit: 'with-reset' | 'without-reset' | undefined;
  const seenItems = new Set<string>();

  const limited = (message: string): AgentEvent[] => {
    const resetAt = codexResetAt(message);
    if (rateLimit === 'with-reset' || (rateLimit && !resetAt)) return [];
    rateLimit = resetAt ? 'with-reset' : 'without-reset';
    return [resetAt ? { type: 'rate_limit', resetAt, message } : { type: 'rate_limit', message }];
  };

  /** A fatal error message: reported once, plus a rate limit when the wording says so. */
  const failure = (message: string): AgentEvent[] => {
    const out: AgentEvent[] = RATE_LIMIT_TEXT.test(message) ? limited(message) : [];
    if (message !== lastError) out.push({ type: 'error', message });
    lastError = message;
    return out;
  };

  const usage = (raw: unknown): AgentEvent[] => {
    if (!isObject(raw)) return [];
    const totals: Totals = { input: num(raw.input_tokens), cached: num(raw.cached_input_tokens), output: num(raw.output_tokens) };
    const base = lastTotals ?? { input: 0, cached: 0, output: 0 };
    lastTotals = totals;
    return [{
      type: 'usage',
      inputTokens: Math.max(0, totals.input - base.input),
      outputTokens: Math.max(0, totals.output - base.output),
      cachedTokens: Math.max(0, totals.cached - base.cached),
    }];
  };

  const item = (event: Json): AgentEvent[] => {
    const it = isObject(event.item) ? event.item : undefined;
    if (!it) return [];
    if (it.type === 'agent_message') {
      if (event.type !== 'item.completed' || typeof it.text !== 'string') return [];
      lastAgentMessage = it.text;
      return [{ type: 'text', text: it.text }];
    }
    if (typeof it.type === 'string' && TOOL_ITEMS.has(it.type)) {
      const id = str(it.id);
      // Started and completed events share the item id: one tool call per item.
      if (id ? seenItems.has(id) : event.type !== 'item.completed') return [];
      if (id) seenItems.add(id);
      return [toolCall(it)];
    }
    return []; // reasoning, todo_list, error items (non-fatal warnings)
  };

  return {
    kind: 'codex',
    buildCommand(invocation) {
      const { spec } = invocation;
      const args = ['exec', '--json'];
      if (spec.model) args.push('--model', spec.model);
      if (spec.permission_mode !== undefined) {
        const flags = PERMISSION_FLAGS[spec.permission_mode];
        if (!flags) {
          throw new Error(`codex does not know permission_mode "${spec.permission_mode}" (use one of: ${Object.keys(PERMISSION_FLAGS).join(', ')})`);
        }
        args.push(...flags);
      }
      args.push(...spec.extra_args);
      if (invocation.resumeSessionId) args.push('resume', invocation.resumeSessionId);
      args.push('-');
      return {
        ...withExecutable(spec.command, 'codex', args),
        stdin: invocation.prompt,
        env: Object.keys(invocation.env).length > 0 ? { ...invocation.env } : undefined,
      };
    },
    parseLine(line, stream) {
      try {
        if (stream === 'stderr') {
          if (RETRYING.test(line)) return [];
          if (RATE_LIMIT_TEXT.test(line)) return limited(line.trim());
          return STDERR_ERROR.test(line) ? [{ type: 'error', message: line.trim() }] : [];
        }
        const decoded = decode(line);
        if (!decoded) return [];
        if ('text' in decoded) return [{ type: 'text', text: decoded.text }];
        const event = decoded.json;
        switch (event.type) {
          case 'thread.started': {
            const id = str(event.thread_id);
            if (!id || id === threadId) return [];
            threadId = id;
            return [{ type: 'session', sessionId: id }];
          }
          case 'item.started':
          case 'item.updated':
          case 'item.completed':
            return item(event);
          case 'turn.completed':
            return [...usage(event.usage), { type: 'result', text: lastAgentMessage ?? '' }];
          case 'turn.failed': {
            const error = isObject(event.error) ? str(event.error.message) : undefined;
            return [...usage(event.usage), ...failure(error ?? 'codex turn failed')];
          }
          case 'error': {
            const message = str(event.message);
            if (!message || RETRYING.test(message)) return [];
            return failure(message);
          }
          default:
            return []; // turn.started and future event types
        }
      } catch {
        return [];
      }
    },
  };
}
