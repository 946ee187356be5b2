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
 * thread's running total there (openai/codex#17539, also on `exec resume`, checked with codex
 * 0.169), so each event is turned into the delta since the previous one: in this run, or for the
 * first one after `resume`, since the total the thread's previous run ended with (`baseline`,
 * session-usage.ts). Codex reports no cost.
 * input_tokens already includes cached_input_tokens, which matches the shared convention.
 */
import path from 'node:path';
import { permissionEntry, stdinCommand } from './command-line';
import {
  authFailure, durationUnitMs, epochToIso, errorReporter, isObject, isoAfter, type Json, jsonLineParser, num, rateLimitReporter, sessionReporter, str,
} from './parse-helpers';
import type { AgentEvent, AgentProvider, CredentialSources, ProviderOptions, SessionToolCalls } from './provider';

const RATE_LIMIT_TEXT = /rate[ _-]?limit|usage limit|usage_limit|hit your limit|too many requests|\b429\b/i;
const RETRYING = /^\s*(Reconnecting|Retrying)\b/i;
/** A top-level `error` event whose message is a retry: `{"type":"error","message":"Reconnecting... 2/5 ..."}`. */
const RETRY_EVENT = /^\s*\{\s*"type"\s*:\s*"error"\s*,\s*"message"\s*:\s*"(Reconnecting|Retrying)\b/i;
const STDERR_ERROR = /^\s*(error|fatal)\b|^\S+\s+ERROR\s/i;
/**
 * Codex's own command sandbox could not start (`bwrap: execvp codex-linux-sandbox`, e.g. with
 * CODEX_HOME under the temp folder, or no user namespaces): every command fails, yet the turn
 * "succeeds". Permanent for this setup.
 */
const OWN_SANDBOX_BROKEN = /bwrap: execvp [^\n]*codex-linux-sandbox|codex-linux-sandbox[^\n]*(No such file|not found|Permission denied)|bwrap: (setting up uid map|No permissions to creat|Creating new namespace failed)/i;
const TOOL_ITEMS = new Set(['command_execution', 'file_change', 'mcp_tool_call', 'web_search']);

// smol-toml ships CommonJS too, but its types are ESM-only, which this CommonJS project cannot import by name.
const { parse: parseToml } = require('smol-toml') as { parse(text: string): Record<string, unknown> };

const codexHomeDir = (env: Record<string, string | undefined>, home: string) => env.CODEX_HOME || path.join(home, '.codex');

/** Codex's built-in model providers that run a local model and need no key. */
const KEYLESS_PROVIDERS = new Set(['oss', 'ollama', 'lmstudio']);

/**
 * Where codex finds its key: `model_provider` of `$CODEX_HOME/config.toml` (default openai: OPENAI_API_KEY,
 * CODEX_API_KEY or the `codex login` file auth.json); a custom provider's `env_key`, or none at all.
 */
export function codexCredentialSources(env: Record<string, string | undefined>, home: string, readText: (file: string) => string | undefined): CredentialSources {
  const codexHome = codexHomeDir(env, home);
  const login = { env: ['OPENAI_API_KEY', 'CODEX_API_KEY'], files: [path.join(codexHome, 'auth.json')] };
  const text = readText(path.join(codexHome, 'config.toml'));
  let config: Record<string, unknown>;
  try {
    config = text === undefined ? {} : parseToml(text);
  } catch {
    return login; // codex names the syntax error itself
  }
  const provider = typeof config.model_provider === 'string' ? config.model_provider : 'openai';
  if (provider === 'openai') return login;
  if (KEYLESS_PROVIDERS.has(provider)) return { env: [], files: [], keyless: true };
  const custom = isObject(config.model_providers) && isObject(config.model_providers[provider]) ? config.model_providers[provider] : undefined;
  const envKey = custom && typeof custom.env_key === 'string' ? custom.env_key : undefined;
  if (envKey) return { env: [envKey], files: [] };
  return custom?.requires_openai_auth === true ? login : { env: [], files: [], keyless: true };
}

const SESSION_TOOL_ITEMS = new Set(['CommandExecution', 'FileChange', 'McpToolCall', 'WebSearch']);
/** How `exec_command`'s output says its process had not ended when the call returned (codex 0.169). */
const STILL_RUNNING = /^Process running with session ID (\d+)$/m;

/**
 * This run's tool calls from a codex rollout file (`sessions/.../rollout-*.jsonl`): the
 * `item_completed` events after the last `task_started` (one `exec` run is one task; a resumed
 * thread's file holds the earlier runs before it). codex 0.169 records a command its own sandbox
 * could not run there (`status: "failed"`, `exit_code: -1`, written as it shuts down) and nowhere in
 * `exec --json`. Failed means the call could not run (declined, or failed without an exit code of
 * its own); a command that ran and exited non-zero (a failing test) is the agent's business.
 *
 * A call whose output said its process was still running never finished within the run: codex
 * kills it as it ends. Its record then says exit -1, or 137 when the kill of the run's process group
 * got there first, or is missing (codex exited before writing it). Whichever, it counts as a call
 * that could not run, reported as "still running when codex ended".
 */
export function codexSessionToolCalls(text: string): SessionToolCalls {
  const events: Json[] = [];
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    try {
      const parsed: unknown = JSON.parse(line);
      if (isObject(parsed) && isObject(parsed.payload)) events.push(parsed.payload);
    } catch {
      /* a torn last line */
    }
  }
  let start = -1;
  events.forEach((e, i) => {
    if (e.type === 'task_started') start = i;
  });
  const run = events.slice(start + 1);
  const items: Json[] = run.flatMap((e) => (e.type === 'item_completed' && isObject(e.item) && typeof e.item.type === 'string' && SESSION_TOOL_ITEMS.has(e.item.type) ? [e.item] : []));
  // A call is known by its id and by its process (the session ID its output named), should a codex version number them apart.
  const keysOf = (id: unknown, processId: unknown): unknown[] => [id, ...(processId !== undefined ? [`process ${String(processId)}`] : [])];
  const recorded = new Set(items.flatMap((it) => keysOf(it.id, it.process_id)));
  // Each call's output header (before `Output:`, so the command's own output cannot pass for it).
  const outputs = new Map(run.flatMap((e) => (e.type === 'function_call_output' && typeof e.call_id === 'string' ? [[e.call_id, (str(e.output) ?? '').split('\nOutput:')[0]!] as const] : [])));
  /** Calls (by id and by process) still running when their output came back. */
  const stillRunning = new Set<unknown>();
  for (const e of run) {
    if (e.type !== 'function_call' || e.name !== 'exec_command' || typeof e.call_id !== 'string') continue;
    const running = STILL_RUNNING.exec(outputs.get(e.call_id) ?? '');
    if (!running) continue;
    const keys = keysOf(e.call_id, running[1]);
    for (const k of keys) stillRunning.add(k);
    if (keys.some((k) => recorded.has(k))) continue;
    let cmd = '';
    try {
      const args: unknown = JSON.parse(str(e.arguments) ?? '');
      if (isObject(args) && typeof args.cmd === 'string') cmd = args.cmd;
    } catch {
      /* arguments that are not JSON: the call is still counted, without its command */
    }
    items.push({ type: 'CommandExecution', id: e.call_id, command: [cmd], status: 'failed' });
  }
  let calls = 0;
  const failed: string[] = [];
  for (const it of items) {
    calls += 1;
    const status = str(it.status);
    const exit = typeof it.exit_code === 'number' ? it.exit_code : undefined;
    const unfinished = status === 'failed' && it.type === 'CommandExecution' && keysOf(it.id, it.process_id).some((k) => stillRunning.has(k));
    const couldNotRun = status === 'declined' || (status === 'failed' && (exit === undefined || exit < 0)) || unfinished;
    if (!couldNotRun) continue;
    const command = Array.isArray(it.command) ? String(it.command.at(-1) ?? '') : '';
    const output = str(it.aggregated_output)?.trim().split('\n').at(-1);
    const why = unfinished ? ' (still running when codex ended)' : exit !== undefined ? ` (exit ${exit})` : '';
    failed.push(`${it.type}${command ? ` \`${command.slice(0, 120)}\`` : ''} ${status ?? 'failed'}${why}${output ? `: ${output.slice(0, 200)}` : ''}`);
  }
  return {
    calls,
    failed,
    hint: "set agents.<role>.permission_mode: bypassPermissions inside a sandbox Slipway confines (codex's own command sandbox cannot run nested, nor with CODEX_HOME under the temp folder)",
  };
}

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
  if (resetsIn) return isoAfter(Number(resetsIn[1]) * 1000);
  const at = /try again at\s+(.+?)\.?\s*$/i.exec(message);
  if (at) {
    const iso = absoluteToIso(at[1]);
    if (iso) return iso;
  }
  const inMatch = /try again in\s+((?:\d+(?:\.\d+)?\s*[a-z]+[\s,]*(?:and\s+)?)+)/i.exec(message);
  if (inMatch) {
    let ms = 0;
    for (const part of inMatch[1].matchAll(/(\d+(?:\.\d+)?)\s*(ms|milliseconds?|d|days?|h|hours?|m|mins?|minutes?|s|secs?|seconds?)\b/gi)) {
      ms += Number(part[1]) * durationUnitMs(part[2]);
    }
    if (ms > 0) return isoAfter(ms);
  }
  return undefined;
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
export function createCodexProvider({ baseline }: ProviderOptions = {}): AgentProvider {
  let lastAgentMessage: string | undefined;
  let lastTotals: Totals | undefined = baseline
    ? { input: baseline.inputTokens ?? 0, cached: baseline.cachedTokens ?? 0, output: baseline.outputTokens ?? 0 }
    : undefined;
  const seenItems = new Set<string>();
  let sandboxBroken = false;
  const session = sessionReporter();
  const reportRateLimit = rateLimitReporter();
  const reportError = errorReporter();

  const limited = (message: string): AgentEvent[] => reportRateLimit(message, codexResetAt(message));

  /** A fatal error message: reported once, plus a rate limit when the wording says so. */
  const failure = (message: string): AgentEvent[] => [
    ...(RATE_LIMIT_TEXT.test(message) ? limited(message) : []),
    ...reportError(message),
    ...authFailure(message),
  ];

  const usage = (raw: unknown): AgentEvent[] => {
    if (!isObject(raw)) return [];
    const totals: Totals = { input: num(raw.input_tokens), cached: num(raw.cached_input_tokens), output: num(raw.output_tokens) };
    const base = lastTotals ?? { input: 0, cached: 0, output: 0 };
    lastTotals = totals;
    return [
      {
        type: 'usage',
        inputTokens: Math.max(0, totals.input - base.input),
        outputTokens: Math.max(0, totals.output - base.output),
        cachedTokens: Math.max(0, totals.cached - base.cached),
      },
      { type: 'session_totals', totals: { inputTokens: totals.input, cachedTokens: totals.cached, outputTokens: totals.output } },
    ];
  };

  const item = (event: Json): AgentEvent[] => {
    const it = isObject(event.item) ? event.item : undefined;
    if (!it) return [];
    if (it.type === 'agent_message') {
      if (event.type !== 'item.completed' || typeof it.text !== 'string') return [];
      lastAgentMessage = it.text;
      return [{ type: 'text', text: it.text }];
    }
    if (it.type === 'command_execution' && event.type === 'item.completed' && typeof it.aggregated_output === 'string') {
      const broken = OWN_SANDBOX_BROKEN.exec(it.aggregated_output);
      if (broken && !sandboxBroken) {
        sandboxBroken = true;
        const message = `codex's own command sandbox cannot run commands here (${broken[0]})`;
        const out: AgentEvent[] = [...reportError(message), { type: 'config_error', message: `${message}; use permission_mode: bypassPermissions inside a sandbox Slipway confines, or keep CODEX_HOME out of the temp folder` }];
        const id = str(it.id);
        if (!id || !seenItems.has(id)) out.unshift(toolCall(it));
        if (id) seenItems.add(id);
        return out;
      }
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
    isRetryNoise: (line, stream) => (stream === 'stderr' ? RETRYING.test(line) : RETRY_EVENT.test(line)),
    setupHint: 'Set OPENAI_API_KEY (or the env_key of the model provider in $CODEX_HOME/config.toml, or log in with `codex login` as the worker\'s user) in the worker\'s environment or in <repository>/.slipway/.env',
    configFiles: [
      { path: '.codex/config.toml', overriddenBy: 'CODEX_HOME' },
      { path: '.codex/auth.json', overriddenBy: 'CODEX_HOME' },
    ],
    credentialSources: (_spec, { env, home, readText }) => codexCredentialSources(env, home, readText),
    sessionToolCalls: codexSessionToolCalls,
    // `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread>.jsonl`, whatever the cwd; `exec resume` finds the thread there.
    sessionLocation: (id, { env, home }) => ({
      root: path.join(codexHomeDir(env, home), 'sessions'),
      belongs: (rel) => /^\d{4}\/\d{2}\/\d{2}\/rollout-[^/]+$/.test(rel) && rel.endsWith(`-${id}.jsonl`),
      place: (rel) => rel,
    }),
    buildCommand(invocation) {
      const { spec } = invocation;
      const args = ['exec', '--json'];
      if (spec.model) args.push('--model', spec.model);
      args.push(...(permissionEntry('codex', PERMISSION_FLAGS, spec.permission_mode) ?? []));
      args.push(...spec.extra_args);
      if (invocation.resumeSessionId) args.push('resume', invocation.resumeSessionId);
      args.push('-');
      return stdinCommand(invocation, 'codex', args);
    },
    parseLine: jsonLineParser({
      stderr(line) {
        if (RETRYING.test(line)) return [];
        if (RATE_LIMIT_TEXT.test(line)) return limited(line.trim());
        return STDERR_ERROR.test(line) ? [{ type: 'error', message: line.trim() }] : [];
      },
      event(event) {
        switch (event.type) {
          case 'thread.started':
            return session(event.thread_id);
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
      },
    }),
  };
}
