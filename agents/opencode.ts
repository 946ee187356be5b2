/**
 * The `opencode` provider: OpenCode's non-interactive `run` command.
 *
 *   opencode run --format json [--model provider/model] [--session SESSION] [--auto]
 *                [...extra_args]                      (prompt on stdin, never in argv)
 *
 * `opencode run` reads piped stdin and uses it as the message when no message argument is given
 * (resolveRunInput in packages/opencode/src/cli/cmd/run.ts), so prompts of any size go there.
 *
 * Format followed: `opencode run --format json` of opencode 1.x (anomalyco/opencode, formerly
 * sst/opencode: packages/opencode/src/cli/cmd/run.ts, session/message-v2.ts; opencode.ai/docs/cli).
 * Every line is {type, timestamp, sessionID, ...}: `step_start` {part}, `text` {part.text} (emitted
 * once the part is complete), `reasoning` (only with --thinking), `tool_use` {part.tool,
 * part.state.input, part.state.status completed|error}, `step_finish` {part.reason, part.cost,
 * part.tokens {input, output, reasoning, cache {read, write}}}, `error` {error: {name, data:
 * {message, statusCode, isRetryable, responseHeaders}}} and, in recent versions, `done`.
 *
 * Usage and cost come from each `step_finish`: every step is one model call and reports only its
 * own tokens and cost, so the events add up without double counting. OpenCode's `tokens.input`
 * excludes the cache, so inputTokens = input + cache.read + cache.write (shared convention:
 * inputTokens includes cached tokens, cachedTokens = cache reads); outputTokens = output + reasoning,
 * as opencode counts reasoning separately.
 * The final answer (`result`) is the text of the last step, emitted when a step finishes for a
 * reason other than tool calls, or at `done` if that did not happen.
 */
import path from 'node:path';
import { permissionEntry, stdinCommand } from './command-line';
import { modelProviderKeys } from './credentials';
import { authFailure, durationUnitMs, isObject, isoAfter, jsonLineParser, num, rateLimitEvent, sessionReporter, str, usageEvent } from './parse-helpers';
import type { AgentEvent, AgentProvider } from './provider';

const RATE_LIMIT_TEXT = /rate[ _-]?limit|usage limit|hit your limit|too many requests|\b429\b|resource[ _]exhausted/i;
const STDERR_ERROR = /^\s*(error|fatal)\b/i;
const TOOL_STEP = /^tool[-_]calls?$/;

/** `permission_mode` values accepted for opencode. `auto` is opencode's own flag (1.18+); `bypassPermissions` uses the OPENCODE_PERMISSION override every version reads. */
const PERMISSIONS: Record<string, { args?: string[]; env?: Record<string, string> }> = {
  default: {},
  auto: { args: ['--auto'] },
  bypassPermissions: { env: { OPENCODE_PERMISSION: '{"*":"allow"}' } },
};

/** "1.5s", "6m0s", "250ms", "30" (seconds) -> milliseconds. */
function durationMs(text: string): number | undefined {
  const trimmed = text.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Number(trimmed) * 1000;
  let total = 0;
  let matched = false;
  for (const part of trimmed.matchAll(/(\d+(?:\.\d+)?)(ms|h|m|s)/g)) {
    matched = true;
    total += Number(part[1]) * durationUnitMs(part[2]);
  }
  return matched ? total : undefined;
}

/** When a rate limit resets, from the provider's response headers or message, as an ISO string. */
export function opencodeResetAt(headers: Record<string, string>, message: string): string | undefined {
  const inMs = (ms: number | undefined) => (ms !== undefined && Number.isFinite(ms) ? isoAfter(ms) : undefined);
  if (headers['retry-after-ms'] && /^\d+(\.\d+)?$/.test(headers['retry-after-ms'])) return inMs(Number(headers['retry-after-ms']));
  const retryAfter = headers['retry-after'];
  if (retryAfter) {
    if (/^\d+(\.\d+)?$/.test(retryAfter.trim())) return inMs(Number(retryAfter) * 1000);
    const date = Date.parse(retryAfter);
    if (!Number.isNaN(date)) return new Date(date).toISOString();
  }
  // Anthropic: anthropic-ratelimit-*-reset are RFC 3339 instants; OpenAI: x-ratelimit-reset-* are durations.
  const resets: number[] = [];
  for (const [name, value] of Object.entries(headers)) {
    if (/^anthropic-ratelimit-.*-reset$/.test(name)) {
      const date = Date.parse(value);
      if (!Number.isNaN(date)) resets.push(date);
    } else if (/^x-ratelimit-reset-/.test(name)) {
      const ms = durationMs(value);
      if (ms !== undefined) resets.push(Date.now() + ms);
    }
  }
  if (resets.length > 0) return new Date(Math.max(...resets)).toISOString();
  const inText = /try again in\s+(\d+(?:\.\d+)?)\s*(ms|s|seconds?)\b/i.exec(message);
  if (inText) return inMs(Number(inText[1]) * durationUnitMs(inText[2]));
  return undefined;
}

/** One provider instance per agent run (see registry.ts): the parser keeps the session id and the text of the current step. */
export function createOpencodeProvider(): AgentProvider {
  let stepText: string[] = [];
  let resultSent = false;
  let rateLimited = false;
  const session = sessionReporter();

  const answer = (): AgentEvent[] => {
    if (resultSent || stepText.length === 0) return [];
    resultSent = true;
    return [{ type: 'result', text: stepText.join('\n') }];
  };

  const error = (raw: unknown): AgentEvent[] => {
    const err = isObject(raw) ? raw : {};
    const data = isObject(err.data) ? err.data : {};
    const name = str(err.name) ?? 'Error';
    const message = str(data.message) ?? str(err.message) ?? name;
    const out: AgentEvent[] = [];
    const status = typeof data.statusCode === 'number' ? data.statusCode : undefined;
    if (!rateLimited && (status === 429 || RATE_LIMIT_TEXT.test(message))) {
      rateLimited = true;
      const headers: Record<string, string> = {};
      if (isObject(data.responseHeaders)) {
        for (const [key, value] of Object.entries(data.responseHeaders)) {
          if (typeof value === 'string') headers[key.toLowerCase()] = value;
        }
      }
      const resetAt = opencodeResetAt(headers, message);
      out.push(rateLimitEvent(message, resetAt));
    }
    const full = name !== 'Error' && !message.startsWith(name) ? `${name}: ${message}` : message;
    out.push({ type: 'error', message: full });
    if (status === 401 || status === 403 || /auth/i.test(name)) out.push({ type: 'config_error', message: full });
    else out.push(...authFailure(full));
    return out;
  };

  return {
    kind: 'opencode',
    setupHint: 'Set the API key of the model\'s provider (ANTHROPIC_API_KEY, OPENAI_API_KEY, ..., or log in with `opencode auth login` as the worker\'s user) in the worker\'s environment or in <repository>/.slipway/.env',
    // 1.18 keeps every session in one SQLite database, `<data>/opencode/opencode.db` (left in WAL mode:
    // the `-wal` file holds recent turns; `-shm` is an index SQLite rebuilds). The database is carried
    // whole as bytes, never opened by Slipway; it holds every session of that data dir (under Slipway's
    // agent home, only that sandbox's). auth.json, beside it, is never part of it. OPENCODE_DB moves
    // the database elsewhere: then nothing is carried (a resume falls back).
    sessionLocation: (_id, { env, home }) => ({
      root: path.join(env.XDG_DATA_HOME || path.join(home, '.local', 'share'), 'opencode'),
      belongs: (rel) => !env.OPENCODE_DB && (rel === 'opencode.db' || rel === 'opencode.db-wal'),
      place: (rel) => rel,
    }),
    // OPENCODE_CONFIG names a file of its own: bind it with `sandbox.readable:`.
    configFiles: [
      ...['opencode.json', 'opencode.jsonc', 'config.json'].map((name) => ({ path: `.config/opencode/${name}`, overriddenBy: 'XDG_CONFIG_HOME' })),
      { path: '.local/share/opencode/auth.json', overriddenBy: 'XDG_DATA_HOME' },
    ],
    // `opencode auth login` writes auth.json; a config file may declare a provider with its own key.
    credentialSources: (spec, { env, home }) => {
      const config = path.join(env.XDG_CONFIG_HOME || path.join(home, '.config'), 'opencode');
      return {
        env: modelProviderKeys(spec.model),
        files: [
          path.join(env.XDG_DATA_HOME || path.join(home, '.local', 'share'), 'opencode', 'auth.json'),
          ...(env.OPENCODE_CONFIG ? [env.OPENCODE_CONFIG] : []),
          ...['opencode.json', 'opencode.jsonc', 'config.json'].map((name) => path.join(config, name)),
        ],
      };
    },
    buildCommand(invocation) {
      const { spec } = invocation;
      const args = ['run', '--format', 'json'];
      if (spec.model) {
        if (!/^[^/\s]+\/\S+$/.test(spec.model)) throw new Error(`opencode needs model as "provider/model", got "${spec.model}"`);
        args.push('--model', spec.model);
      }
      if (invocation.resumeSessionId) args.push('--session', invocation.resumeSessionId);
      const env: Record<string, string> = { ...invocation.env };
      const mode = permissionEntry('opencode', PERMISSIONS, spec.permission_mode);
      if (mode) {
        args.push(...(mode.args ?? []));
        Object.assign(env, mode.env);
      }
      args.push(...spec.extra_args);
      return stdinCommand(invocation, 'opencode', args, env);
    },
    parseLine: jsonLineParser({
      stderr(line) {
        if (RATE_LIMIT_TEXT.test(line) && !rateLimited) {
          rateLimited = true;
          return [rateLimitEvent(line.trim())];
        }
        return STDERR_ERROR.test(line) ? [{ type: 'error', message: line.trim() }] : [];
      },
      event(event) {
        const part = isObject(event.part) ? event.part : {};
        const out = session(event.sessionID ?? part.sessionID);
        switch (event.type) {
          case 'step_start':
            stepText = [];
            resultSent = false;
            break;
          case 'text':
            if (typeof part.text === 'string' && part.text.trim()) {
              stepText.push(part.text);
              out.push({ type: 'text', text: part.text });
            }
            break;
          case 'tool_use': {
            const state = isObject(part.state) ? part.state : {};
            if (typeof part.tool === 'string') out.push({ type: 'tool_call', name: part.tool, input: state.input });
            break;
          }
          case 'step_finish': {
            const tokens = isObject(part.tokens) ? part.tokens : undefined;
            if (tokens || typeof part.cost === 'number') {
              const t = tokens ?? {};
              const cache = isObject(t.cache) ? t.cache : {};
              out.push(usageEvent({
                input: num(t.input),
                cacheRead: num(cache.read),
                cacheWrite: num(cache.write),
                output: num(t.output) + num(t.reasoning),
                cost: part.cost,
              }));
            }
            if (!TOOL_STEP.test(str(part.reason) ?? '')) out.push(...answer());
            break;
          }
          case 'done':
            out.push(...answer());
            break;
          case 'error':
            out.push(...error(event.error));
            break;
          // reasoning and future event types: nothing beyond the session.
        }
        return out;
      },
    }),
  };
}
