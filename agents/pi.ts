/**
 * The `pi` provider: the pi coding agent (earendil-works/pi, formerly badlogic/pi-mono,
 * packages/coding-agent) in single-shot JSON mode.
 *
 *   pi -p --mode json [--model M] [--session SESSION] [--tools read,grep,find,ls]
 *      [...extra_args]                                (prompt on stdin, never in argv)
 *
 * Outside RPC mode pi reads piped stdin and uses it as the first prompt (docs/cli.md "Piped stdin";
 * src/cli/initial-message.ts), so prompts of any size go there. `--mode json` selects the event
 * stream and one-shot execution; `-p` is kept for older releases. `--session <id>` reopens a session
 * by id (docs/sessions.md). pi has no approval prompts, so `permission_mode` only narrows the tools.
 *
 * Format followed: docs/json.md (JSON Event Stream Mode) and docs/cli.md of pi 0.7x+: a `session`
 * header {id, version, cwd}, then AgentSessionEvent records: agent_start/agent_end {messages,
 * willRetry}, turn_start/turn_end, message_start/message_update (deltas)/message_end {message},
 * tool_execution_start {toolName, args}/_update/_end {isError}, auto_retry_start/auto_retry_end
 * {success, finalError}, compaction_*, queue_update, agent_settled. Assistant messages follow
 * pi-ai's AssistantMessage: content text/thinking/toolCall blocks, usage {input, output, cacheRead,
 * cacheWrite, totalTokens, cost {total}}, stopReason stop|length|toolUse|error|aborted, errorMessage.
 *
 * Usage and cost come from `message_end` of assistant messages: each is one model response with
 * its own usage. `message_update.usage` (running snapshot of the message in flight), `turn_end` and
 * `agent_end` (which repeat finished messages) are ignored, so nothing is counted twice.
 * pi's `input` excludes cache reads and writes, so inputTokens = input + cacheRead + cacheWrite and
 * cachedTokens = cacheRead (shared convention).
 * Tool calls come from `tool_execution_start` (not from the toolCall blocks, to count each once).
 * The final answer is the last assistant message at an `agent_end` that will not be retried; a
 * rate limit is only reported then (or at a failed `auto_retry_end`), never for an attempt pi retries.
 */
import path from 'node:path';
import { permissionEntry, stdinCommand } from './command-line';
import { modelProviderKeys } from './credentials';
import {
  authFailure, durationUnitMs, epochToIso, errorReporter, isObject, isoAfter, type Json, jsonLineParser, num, rateLimitEvent, sessionReporter, str, usageEvent,
} from './parse-helpers';
import type { AgentEvent, AgentProvider } from './provider';

const RATE_LIMIT_TEXT = /rate[ _-]?limit|usage limit|usage_limit|hit your limit|too many requests|\b429\b|resource[ _]exhausted/i;
const STDERR_ERROR = /^\s*(error|fatal)\b/i;
const piAgentDir = (env: Record<string, string | undefined>, home: string) => env.PI_CODING_AGENT_DIR || path.join(home, '.pi', 'agent');
const READ_ONLY_TOOLS = ['--tools', 'read,grep,find,ls'];

/** `permission_mode` values accepted for pi. */
const PERMISSION_FLAGS: Record<string, string[]> = {
  default: [],
  bypassPermissions: [],
  'read-only': READ_ONLY_TOOLS,
  plan: READ_ONLY_TOOLS,
};

/**
 * When a limit resets, from the provider error pi passes through: `resets_at` (epoch seconds, the
 * ChatGPT/Codex backend), `resets_in_seconds`, "retry after N seconds" or "try again in Ns".
 */
export function piResetAt(message: string): string | undefined {
  const at = /resets_?at"?\s*[:=]\s*(\d{9,13})/i.exec(message);
  if (at) return epochToIso(at[1]);
  const inSeconds = /resets_in_seconds"?\s*[:=]\s*(\d+)/i.exec(message);
  if (inSeconds) return isoAfter(Number(inSeconds[1]) * 1000);
  const relative = /(?:retry after|try again in)\s+(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)?\b/i.exec(message);
  if (relative) return isoAfter(Number(relative[1]) * durationUnitMs(relative[2] ?? 's'));
  return undefined;
}

function textOf(message: Json): string {
  const content = message.content;
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .filter((block): block is Json => isObject(block) && block.type === 'text' && typeof block.text === 'string')
    .map((block) => block.text as string)
    .join('\n');
}

/** One provider instance per agent run (see registry.ts): the parser keeps the session id, last error and rate-limit state. */
export function createPiProvider(): AgentProvider {
  let lastAssistant: Json | undefined;
  let rateLimited = false;
  const session = sessionReporter();
  const error = errorReporter();

  /** A rate limit, reported once per run and only when the wording says so. */
  const limited = (message: string): AgentEvent[] => {
    if (rateLimited || !RATE_LIMIT_TEXT.test(message)) return [];
    rateLimited = true;
    return [rateLimitEvent(message, piResetAt(message))];
  };

  const messageEnd = (message: Json): AgentEvent[] => {
    if (message.role !== 'assistant') return [];
    lastAssistant = message;
    const out: AgentEvent[] = [];
    for (const block of Array.isArray(message.content) ? message.content : []) {
      if (isObject(block) && block.type === 'text' && typeof block.text === 'string' && block.text.trim()) {
        out.push({ type: 'text', text: block.text });
      }
    }
    if (isObject(message.usage)) {
      const usage = message.usage;
      out.push(usageEvent({
        input: num(usage.input),
        cacheRead: num(usage.cacheRead),
        cacheWrite: num(usage.cacheWrite),
        output: num(usage.output),
        cost: isObject(usage.cost) ? usage.cost.total : undefined,
      }));
    }
    if (message.stopReason === 'error' || message.stopReason === 'aborted') {
      const why = str(message.errorMessage) ?? `pi request ${message.stopReason}`;
      out.push(...error(why), ...authFailure(why));
    }
    return out;
  };

  const agentEnd = (event: Json): AgentEvent[] => {
    if (event.willRetry === true) return [];
    const messages = Array.isArray(event.messages) ? event.messages.filter(isObject) : [];
    const final = [...messages].reverse().find((m) => m.role === 'assistant') ?? lastAssistant;
    if (!final) return [];
    if (final.stopReason === 'error' || final.stopReason === 'aborted') {
      const message = str(final.errorMessage) ?? `pi request ${final.stopReason}`;
      return [...limited(message), ...error(message)];
    }
    return [{ type: 'result', text: textOf(final) }];
  };

  return {
    kind: 'pi',
    setupHint: 'Set the API key of the model\'s provider (ANTHROPIC_API_KEY, OPENAI_API_KEY, ..., or the apiKey of a custom provider in $PI_CODING_AGENT_DIR/models.json) in the worker\'s environment or in <repository>/.slipway/.env',
    // auth.json holds `pi` /login sessions and stored keys; models.json declares custom providers with their own apiKey.
    // `<agent dir>/sessions/--<cwd with / and : as ->--/<time>_<session>.jsonl`; `--session` looks only in the cwd's folder.
    sessionLocation: (id, { env, home }) => ({
      root: path.join(piAgentDir(env, home), 'sessions'),
      belongs: (rel) => /^--[^/]*--\/[^/]+$/.test(rel) && rel.endsWith(`_${id}.jsonl`),
      place: (rel, cwd) => `--${cwd.replace(/^[/\\]/, '').replace(/[/\\:]/g, '-')}--/${rel.split('/').slice(1).join('/')}`,
    }),
    configFiles: ['models.json', 'auth.json', 'settings.json'].map((name) => ({ path: `.pi/agent/${name}`, overriddenBy: 'PI_CODING_AGENT_DIR' })),
    credentialSources: (spec, { env, home }) => {
      const dir = piAgentDir(env, home);
      return { env: modelProviderKeys(spec.model), files: [path.join(dir, 'auth.json'), path.join(dir, 'models.json')] };
    },
    buildCommand(invocation) {
      const { spec } = invocation;
      const args = ['-p', '--mode', 'json'];
      if (spec.model) args.push('--model', spec.model);
      if (invocation.resumeSessionId) args.push('--session', invocation.resumeSessionId);
      args.push(...(permissionEntry('pi', PERMISSION_FLAGS, spec.permission_mode) ?? []));
      args.push(...spec.extra_args);
      return stdinCommand(invocation, 'pi', args);
    },
    parseLine: jsonLineParser({
      stderr(line) {
        if (RATE_LIMIT_TEXT.test(line)) return limited(line.trim());
        return STDERR_ERROR.test(line) ? error(line.trim()) : [];
      },
      event(event) {
        switch (event.type) {
          case 'session':
            return session(event.id);
          case 'message_end':
            return isObject(event.message) ? messageEnd(event.message) : [];
          case 'tool_execution_start':
            return typeof event.toolName === 'string' ? [{ type: 'tool_call', name: event.toolName, input: event.args }] : [];
          case 'agent_end':
            return agentEnd(event);
          case 'auto_retry_end': {
            if (event.success !== false) return [];
            const message = str(event.finalError) ?? 'pi gave up retrying';
            return [...limited(message), ...error(message)];
          }
          default:
            return []; // agent_start, turn_*, message_start/update, tool_execution_update/end, compaction_*, queue_update, agent_settled, ...
        }
      },
    }),
  };
}
