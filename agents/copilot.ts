/**
 * The `copilot` provider: GitHub's Copilot CLI (npm `@github/copilot`) in non-interactive mode.
 *
 *   copilot --output-format json [--model M] [--resume=SESSION] [--allow-all] [...extra_args]
 *                                                      (prompt on stdin, never in argv)
 *
 * Piped stdin without `-p` runs one prompt and exits (checked with 1.0.102, ADR 0011 decision 12).
 * Its own model or a bring-your-own-key endpoint come from the environment: COPILOT_GITHUB_TOKEN /
 * GH_TOKEN / GITHUB_TOKEN, or COPILOT_PROVIDER_BASE_URL + COPILOT_PROVIDER_TYPE +
 * COPILOT_PROVIDER_API_KEY (+ COPILOT_MODEL, COPILOT_OFFLINE).
 *
 * Format followed (JSONL, as 1.0.102 prints it): `user.message`, `assistant.turn_start|turn_end`,
 * `assistant.message` {content, toolRequests}, `tool.execution_start` {toolName, arguments},
 * `tool.execution_complete` {success}, `session.error` {errorType, message, statusCode},
 * `assistant.idle`, many ephemeral progress events (`model.call_*`, `session.background_tasks_changed`,
 * deltas), and a final `result` {sessionId, exitCode, usage}. That usage holds premium requests and
 * durations, no tokens: Copilot runs report no usage event, and run-agent records them as
 * usage unknown (never an estimate without tokens).
 * Sessions: `$COPILOT_HOME/session-state/<id>/` (default `~/.copilot`), carried like the others.
 */
import path from 'node:path';
import { permissionEntry, stdinCommand } from './command-line';
import { authFailure, errorReporter, isObject, type Json, jsonLineParser, rateLimitReporter, sessionReporter, str } from './parse-helpers';
import type { AgentEvent, AgentProvider, CredentialSources } from './provider';

const RATE_LIMIT_TEXT = /rate[ _-]?limit|quota|too many requests|\b429\b/i;
const STDERR_ERROR = /^\s*(error|fatal)\b/i;
/** A failed model call (Copilot retries it, `retryAttempt`): not progress for `idle_timeout_minutes`. */
const RETRY_EVENT = /^\s*\{\s*"type"\s*:\s*"model\.call_failure"/;

/** `permission_mode` values accepted for copilot: its tools ask for approval unless allowed. */
const PERMISSION_FLAGS: Record<string, string[]> = {
  default: [],
  bypassPermissions: ['--allow-all'],
  'allow-all': ['--allow-all'],
};

const copilotHome = (env: Record<string, string | undefined>, home: string) => env.COPILOT_HOME || path.join(home, '.copilot');

const LOCAL_HOST = /^https?:\/\/(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?(\/|$)/i;

/**
 * Where copilot finds its credentials: a bring-your-own-key endpoint's key (none for a local one),
 * else a GitHub token. A `copilot login` lives in the system keychain, which no check can see.
 */
export function copilotCredentialSources(env: Record<string, string | undefined>): CredentialSources {
  const base = env.COPILOT_PROVIDER_BASE_URL;
  if (base) {
    if (LOCAL_HOST.test(base)) return { env: [], files: [], keyless: true };
    return { env: ['COPILOT_PROVIDER_API_KEY', 'COPILOT_PROVIDER_BEARER_TOKEN'], files: [] };
  }
  return { env: ['COPILOT_GITHUB_TOKEN', 'GH_TOKEN', 'GITHUB_TOKEN'], files: [] };
}

/** One provider instance per agent run (see registry.ts): the parser keeps the last answer, session id and reported errors. */
export function createCopilotProvider(): AgentProvider {
  let lastAnswer = '';
  const session = sessionReporter();
  const reportError = errorReporter();
  const reportRateLimit = rateLimitReporter();

  const failure = (message: string, authentication: boolean): AgentEvent[] => [
    ...(RATE_LIMIT_TEXT.test(message) ? reportRateLimit(message) : []),
    ...reportError(message),
    ...(authentication ? [{ type: 'config_error' as const, message }] : authFailure(message)),
  ];

  const assistantMessage = (data: Json): AgentEvent[] => {
    const text = str(data.content);
    if (!text?.trim()) return [];
    lastAnswer = text;
    return [{ type: 'text', text }];
  };

  return {
    kind: 'copilot',
    reportsNoTokens: true,
    isRetryNoise: (line, stream) => stream === 'stdout' && RETRY_EVENT.test(line),
    setupHint: 'Set COPILOT_PROVIDER_API_KEY with COPILOT_PROVIDER_BASE_URL (your own model endpoint), or COPILOT_GITHUB_TOKEN (GH_TOKEN, GITHUB_TOKEN) for GitHub\'s, in the worker\'s environment or in <repository>/.slipway/.env',
    credentialSources: (_spec, { env }) => copilotCredentialSources(env),
    // `$COPILOT_HOME/session-state/<id>/...` (events.jsonl, workspace.yaml, checkpoints): `--resume=<id>` reopens it
    // from that folder alone (checked with 1.0.102, without session-store.db); its `inuse.<pid>.*` locks stay behind.
    sessionLocation: (id, { env, home }) => ({
      root: path.join(copilotHome(env, home), 'session-state'),
      belongs: (rel) => rel.startsWith(`${id}/`) && !/^inuse\./.test(path.posix.basename(rel)),
      place: (rel) => rel,
    }),
    buildCommand(invocation) {
      const { spec } = invocation;
      const args = ['--output-format', 'json'];
      if (spec.model) args.push('--model', spec.model);
      // `--resume` takes an optional value: the `=` form keeps it from being read as a prompt.
      if (invocation.resumeSessionId) args.push(`--resume=${invocation.resumeSessionId}`);
      args.push(...(permissionEntry('copilot', PERMISSION_FLAGS, spec.permission_mode) ?? []));
      args.push(...spec.extra_args);
      return stdinCommand(invocation, 'copilot', args);
    },
    parseLine: jsonLineParser({
      stderr(line) {
        if (RATE_LIMIT_TEXT.test(line)) return reportRateLimit(line.trim());
        return STDERR_ERROR.test(line) ? failure(line.trim(), false) : [];
      },
      event(event) {
        const data = isObject(event.data) ? event.data : {};
        switch (event.type) {
          case 'assistant.message':
            return assistantMessage(data);
          case 'tool.execution_start':
            return typeof data.toolName === 'string' ? [{ type: 'tool_call', name: data.toolName, input: data.arguments }] : [];
          case 'session.error': {
            const message = str(data.message) ?? `copilot session error${str(data.errorType) ? ` (${str(data.errorType)})` : ''}`;
            return failure(message, data.errorType === 'authentication' || data.statusCode === 401);
          }
          case 'result': {
            const out = session(event.sessionId);
            if (event.exitCode === 0 || event.exitCode === undefined) out.push({ type: 'result', text: lastAnswer });
            return out;
          }
          default:
            return []; // user.message, turn and model-call progress, deltas, tool completion, idle
        }
      },
    }),
  };
}
