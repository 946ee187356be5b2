/**
 * The agent activity: ONE run of a coding agent in a sandbox. The workflow calls it once per
 * iteration of a step's loop (workflows/agent-runs.ts), so a worker crash resumes at the run that
 * was in flight, never at the start of the step.
 *
 * One run: read `.slipway/.env`, render the prompt (template arguments, `` !`command` ``
 * expansions in the sandbox), start the provider's command line in the sandbox, parse its output
 * line by line, and end it:
 * - normally, when it exits (non-zero: `agent_runtime_transient`);
 * - `completion_grace_seconds` after it printed a completion signal or its final result, by
 *   killing its process group, so children it left behind (a dev server, a watcher holding
 *   stdout open) never hang the run. That ending counts as success;
 * - after `idle_timeout_minutes` without a line of output, or `timeout_minutes` in all, or on
 *   cancellation: process group killed, `agent_runtime_transient`;
 * - a rate limit reported by the agent: `provider_rate_limit` with `{ resetAt }`, which the
 *   workflow sits out on a durable timer.
 * A reviewer's or planner's structured answer that does not validate is returned as
 * `outputError` (not thrown): the workflow decides whether to ask again.
 *
 * Everything returned or thrown is redacted with the one redaction set (activities/redact.ts): the
 * worker's secret-looking environment values, tokens, and the values of the repository's
 * `.slipway/.env`, `.env` and `.env.*` never reach workflow history.
 */
import os from 'node:os';
import path from 'node:path';
import { stripVTControlCharacters } from 'node:util';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import type { AgentSpec, Feedback, StreamSpec } from '../../core/types';
import type { AgentRole } from '../../core/states';
import { failure } from '../failures';
import { commitIdentityEnv } from '../../lib/git';
import { withHeartbeat } from '../heartbeat';
import { tail } from '../process';
import { redact, secretsFor, secretValuesWith } from '../redact';
import type { SandboxProvider } from '../sandbox/provider';
import { readProjectEnv } from '../../agents/credentials';
import { ANSWER_FORMATS, buildPrompt, builtinValues, contextEnv, correctionRequest, feedbackSection, rebuildSection, type PromptContext } from '../../agents/prompt';
import type { AgentEvent, SessionTotals, TokenUsage } from '../../agents/provider';
import { agentProvider } from '../../agents/registry';
import { readSessionTotals, writeSessionTotals } from './session-usage';
import { clearSandboxGitLocks, commitSandboxWork, type CommittedWork } from '../sandbox/commit-work';
import { estimateCostUsd } from '../../core/prices';
import { allowanceUsed, type RunAllowance } from '../../core/budget';
import { captureSession, readSession, restoreSession, sessionStoreDir } from './session-carry';
import { extractTagged, PlanSchema, ReviewVerdictSchema, type ReviewVerdict } from '../../agents/structured';
import { FEEDBACK_KEYS, parseTemplate, renderTemplate, templateKeys, TemplateError, type BuiltinTemplateKey } from '../../agents/template';

/** What each CLI says when the session to resume is gone (Claude Code, Codex, Pi, OpenCode; checked with the versions setup.sh pins). */
const SESSION_MISSING = /No conversation found with session ID:?\s*\S+|No session, task, or name matched\s*\S+|no rollout found for thread id\s*\S+|No session found matching\s*\S+|Session not found/i;

/** Characters of agent output kept in workflow history per run. */
export const AGENT_OUTPUT_TAIL_CHARS = 6_000;
/** Longest a prompt's `` !`command` `` may run, and the most output it may give. */
const EXPANSION_TIMEOUT_MS = 60_000;
const EXPANSION_MAX_BYTES = 1024 * 1024;

export interface AgentRunInput {
  role: AgentRole;
  spec: AgentSpec;
  sandboxPath: string;
  /** The user's repository: `.slipway/.env` is read from it (a path; never the values). */
  repository: string;
  objectiveDir: string;
  objective: { id: string; text: string };
  /** The stream the agent works on; a planner works for the whole objective. */
  stream: { id: string; task: string; branch: string };
  targetBranch: string;
  /** Builder runs of the stream so far, this one included (the fix-loop iteration). */
  iteration: number;
  /** This run within the step's iteration loop (1..spec.max_iterations); default 1. */
  agentIteration?: number;
  feedback?: Feedback;
  /** Reviewer runs after a merge-conflict rebuild: the conflict and the stream's earlier change. */
  rebuilt?: string;
  resumeSessionId?: string;
  /** The previous run's structured answer could not be used: why. The agent is asked again. */
  outputError?: string;
  /** `budget.hard_limit`: what this run may spend; the run is stopped once its reported usage reaches it. */
  allowance?: RunAllowance;
  /**
   * A stream's run: once the agent has ended, what it left uncommitted is committed with this
   * message and the sandbox's head collected, as `commitWork` would, in this activity instead of
   * another (docs/adr/0034-fewer-round-trips-per-stream.md).
   */
  commit?: { message: string };
}

export interface AgentRunResult {
  exitCode: number | null;
  sessionId?: string;
  /** `costUsd` is absent when the agent reports no cost (codex). */
  usage: TokenUsage;
  toolCalls: number;
  /** The run was asked to resume a session the agent no longer has, and ran as a fresh session instead: why (redacted). */
  resumeFailed?: string;
  /** Tail of the agent's text output (redacted). */
  output: string;
  /** The completion signal the output held, if any (ends the step's iteration loop). */
  completionSignal?: string;
  /** How the process ended: it exited, or it was killed once the grace period after its completion signal or final result ran out. */
  ended: 'exited' | 'grace_killed';
  verdict?: ReviewVerdict;
  /** A planner's streams, validated. */
  plan?: StreamSpec[];
  /** Why a reviewer's or planner's answer could not be used (redacted); absent when it could. */
  outputError?: string;
  /** The run was stopped at its allowance (`budget.hard_limit`): why. `usage` is what it reported until then. */
  budgetStopped?: string;
  durationMs: number;
  /** With `commit`: the work committed and the head collected after the run. */
  commit?: CommittedWork;
}

/** `failure()` with the secrets taken out of its message (agent output goes into it). */
function redactedFailure(kind: Parameters<typeof failure>[0], message: string, secrets: string[], details?: unknown): ApplicationFailure {
  return failure(kind, redact(message, secrets), details);
}

/** How long a stopped agent has between SIGTERM and SIGKILL. */
export const AGENT_KILL_GRACE_MS = 5_000;

export function createAgentActivities(deps: { sandboxes: SandboxProvider }) {
  const { sandboxes } = deps;
  const activities = {
    async runAgent(input: AgentRunInput): Promise<AgentRunResult> {
      const { spec, role } = input;
      const name = `${role} agent (${spec.provider})`;
      const agentIteration = input.agentIteration ?? 1;

      // Started together: each is a process or a file read, and every agent run waits for them.
      // A run killed while git worked in the sandbox (a worker SIGKILLed mid-commit) left its
      // locks: without clearing them, the agent's own `git commit` fails on them at every retry.
      const unlocking = clearSandboxGitLocks(sandboxes, input.sandboxPath);
      unlocking.catch(() => undefined); // awaited before anything runs in the sandbox
      const identity = commitIdentityEnv(input.sandboxPath);
      identity.catch(() => undefined); // awaited below, after the project's env
      const repositorySecrets = secretsFor(input.repository);
      repositorySecrets.catch(() => undefined);
      let projectEnv: Record<string, string>;
      try {
        projectEnv = await readProjectEnv(input.repository);
      } catch (e) {
        throw failure('configuration_error', (e as Error).message);
      }
      // One set: the worker's environment, tokens, and the repository's `.env` files (copy_ignored puts them in the sandbox).
      const secrets = [...new Set([...secretValuesWith(projectEnv), ...(await repositorySecrets)])].sort((a, b) => b.length - a.length);

      const ctx: PromptContext = {
        role,
        objective: input.objective.text,
        objectiveId: input.objective.id,
        streamId: input.stream.id,
        task: input.stream.task,
        iteration: input.iteration,
        agentIteration,
        maxIterations: spec.max_iterations,
        completionSignals: spec.completion_signals,
        sourceBranch: input.stream.branch,
        targetBranch: input.targetBranch,
        feedback: input.feedback,
        ...(input.rebuilt ? { rebuilt: input.rebuilt } : {}),
      };
      const env: Record<string, string> = {
        ...(await identity),
        ...projectEnv,
        ...contextEnv(ctx),
        SLIPWAY_OBJECTIVE_DIR: input.objectiveDir,
        SLIPWAY_SANDBOX: input.sandboxPath,
      };
      const cancelSignal = Context.current().cancellationSignal;
      const unlocked = await unlocking;
      if (unlocked.length > 0) Context.current().log.warn('stale git locks removed from the sandbox before the agent ran', { role, locks: unlocked.map((l) => path.basename(l)).join(', ') });

      // --- the prompt ---------------------------------------------------------------------------
      let prompt: string;
      if (spec.prompt !== undefined) {
        const source = spec.prompt_file ?? `agents.${role}.prompt`;
        const template = parseTemplate(spec.prompt);
        const values: Record<string, string> = { ...spec.args, ...builtinValues(ctx) };
        try {
          // Expansions may take a while (up to a minute each): heartbeat meanwhile.
          prompt = await withHeartbeat(() => renderTemplate(template, values, async (command, at, argEnv) => {
            // Values reach the command only as environment variables it references (template.ts).
            const run = await sandboxes.exec(
              { root: input.sandboxPath },
              { command, shell: true, env: { ...env, ...argEnv }, timeoutMs: EXPANSION_TIMEOUT_MS, signal: cancelSignal, maxCaptureBytes: EXPANSION_MAX_BYTES },
            );
            const where = `${source}:${at.line}:${at.column}: !\`${command}\``;
            if (run.cancelled) throw new TemplateError(`${where} was cancelled`);
            if (run.timedOut) throw new TemplateError(`${where} ran over ${EXPANSION_TIMEOUT_MS / 1000} s`);
            if (run.exitCode !== 0) throw new TemplateError(`${where} exited with ${run.exitCode ?? run.signal}: ${tail(run.stderr.trim(), 500)}`);
            if (run.stdout.startsWith('…[truncated]')) throw new TemplateError(`${where} printed more than ${EXPANSION_MAX_BYTES / 1024} KB`);
            return run.stdout;
          }));
        } catch (e) {
          if (e instanceof TemplateError) throw redactedFailure('agent_runtime_transient', `prompt of the ${name}: ${e.message}`, secrets);
          throw e;
        }
        // A template that never asks for the failure still gets it: a fix loop must not lose why it runs.
        const keys = new Set(templateKeys(template).map((k) => k.key as BuiltinTemplateKey));
        if (input.feedback && !FEEDBACK_KEYS.some((k) => keys.has(k))) prompt += `\n\n${feedbackSection(ctx).join('\n')}`;
        // Likewise a reviewer of a rebuilt stream is always told both intents must survive.
        if (input.rebuilt && !keys.has('REBUILD')) prompt += `\n\n${rebuildSection(ctx).join('\n')}`;
        // The answer's shape is Slipway's contract; say it unless the template already does.
        const format = ANSWER_FORMATS[role];
        if (format && !prompt.includes(`<${format.tag}>`)) prompt += `\n\n${format.instruction}`;
      } else {
        prompt = buildPrompt(ctx);
      }
      if (input.outputError) prompt += `\n\n${correctionRequest(role, input.outputError)}`;

      // --- the command --------------------------------------------------------------------------
      // A resumed session's CLI may report session totals: the provider subtracts what it had before.
      const baseline = input.resumeSessionId ? await readSessionTotals(spec.provider, input.resumeSessionId) : undefined;
      const provider = agentProvider(spec.provider, { baseline });
      // A builder's session follows the stream: restored into an agent home that lacks it (session-carry.ts).
      // Under confinement the agent's HOME is the sandbox's own (ExecRequest.agentHome): its sessions are there.
      const sandboxHome = await sandboxes.agentHome?.({ root: input.sandboxPath });
      const agentEnv = { ...process.env, ...env, ...(sandboxHome ? { HOME: sandboxHome } : {}) };
      // The CLI's config files from the worker's HOME (or the one its environment names), bound read-only into that home.
      const workerEnv = { ...process.env, ...env };
      const workerHome = workerEnv.HOME || os.homedir();
      const agentConfig = sandboxHome
        ? (provider.configFiles ?? []).filter((f) => !f.overriddenBy || !workerEnv[f.overriddenBy]).map((f) => ({ source: path.join(workerHome, ...f.path.split('/')), path: f.path }))
        : undefined;
      const carry = (sessionId: string) => {
        const store = role === 'builder' ? sessionStoreDir(input.repository, input.objective.id, input.stream.id, spec.provider, sessionId) : undefined;
        const location = store ? provider.sessionLocation?.(sessionId, { env: agentEnv, home: agentEnv.HOME || os.homedir() }) : undefined;
        return store && location ? { store, location } : undefined;
      };
      const resumeCarry = input.resumeSessionId ? carry(input.resumeSessionId) : undefined;
      if (resumeCarry) {
        const agentCwd = async () => {
          const r = await sandboxes.exec({ root: input.sandboxPath }, { command: 'pwd -P', shell: true, env, timeoutMs: 60_000, signal: cancelSignal });
          if (r.exitCode !== 0 || !r.stdout.trim().startsWith('/')) throw new Error(`cannot tell the sandbox's working directory: ${tail(r.stderr.trim(), 300)}`);
          return r.stdout.trim();
        };
        try {
          const restored = await restoreSession(resumeCarry.location, resumeCarry.store, agentCwd);
          if (restored === 'restored') Context.current().log.info('agent session restored into the agent home', { role, provider: spec.provider, session: input.resumeSessionId });
        } catch (e) {
          // The resume then falls back to a fresh session with the full context (below).
          Context.current().log.warn('agent session could not be restored', { role, provider: spec.provider, session: input.resumeSessionId, error: redact((e as Error).message, secrets) });
        }
      }
      let command;
      try {
        command = provider.buildCommand({ role, spec, prompt, cwd: input.sandboxPath, resumeSessionId: input.resumeSessionId, env: {} });
      } catch (e) {
        throw failure('configuration_error', `${name}: ${(e as Error).message}`);
      }

      // --- the run ------------------------------------------------------------------------------
      const usage: TokenUsage = { inputTokens: 0, outputTokens: 0, cachedTokens: 0, costUsd: undefined };
      const texts: string[] = [];
      const errors: string[] = [];
      let rateLimit: Extract<AgentEvent, { type: 'rate_limit' }> | undefined;
      let configError: string | undefined;
      let sessionId: string | undefined;
      let sessionTotals: SessionTotals | undefined;
      let toolCalls = 0;
      const denied: string[] = [];
      let completionSignal: string | undefined;
      let lines = 0;
      let retryLines = 0;
      let lastOutputAt = Date.now();
      let idleKilled = false;
      let graceKilled = false;
      let budgetStopped: string | undefined;
      /** `usage_so_far`: the running total of an agent that reports exact figures only at the end. */
      let soFar: TokenUsage | undefined;
      let usageReported = false;
      /** The hard limit: stops the run once `used` reaches its allowance. */
      const checkAllowance = (used: TokenUsage) => {
        if (!input.allowance || budgetStopped !== undefined) return;
        // Tokens but no cost reported: the price table's estimate stands in for it.
        const costUsd = used.costUsd ?? (spec.price ? estimateCostUsd(used, spec.price) : undefined);
        budgetStopped = allowanceUsed(input.allowance, { ...used, costUsd });
        if (budgetStopped !== undefined) stop.abort();
      };
      let graceTimer: NodeJS.Timeout | undefined;
      const stop = new AbortController();
      const startGrace = () => {
        graceTimer ??= setTimeout(() => {
          graceKilled = true;
          stop.abort();
        }, spec.completion_grace_seconds * 1000);
      };
      const onEvent = (event: AgentEvent) => {
        switch (event.type) {
          case 'text':
          case 'result':
            texts.push(event.text);
            completionSignal ??= spec.completion_signals.find((s) => event.text.includes(s));
            if (completionSignal || event.type === 'result') startGrace();
            break;
          case 'session':
            sessionId = event.sessionId;
            break;
          case 'session_totals':
            sessionTotals = event.totals;
            break;
          case 'tool_call':
            toolCalls += 1;
            break;
          case 'denied':
            denied.push(event.tool);
            break;
          case 'usage':
            usage.inputTokens += event.inputTokens;
            usage.outputTokens += event.outputTokens;
            usage.cachedTokens = (usage.cachedTokens ?? 0) + (event.cachedTokens ?? 0);
            if (event.costUsd !== undefined) usage.costUsd = (usage.costUsd ?? 0) + event.costUsd;
            usageReported = true;
            checkAllowance(usage);
            break;
          case 'usage_so_far':
            if (usageReported) break;
            soFar = { inputTokens: event.inputTokens, outputTokens: event.outputTokens, cachedTokens: event.cachedTokens ?? 0, costUsd: event.costUsd };
            checkAllowance(soFar);
            break;
          case 'error':
            errors.push(event.message);
            break;
          case 'rate_limit':
            rateLimit ??= event;
            break;
          case 'config_error':
            // Permanent (credentials): end the run now instead of letting the CLI retry for minutes.
            if (configError === undefined) {
              configError = event.message;
              stop.abort();
            }
            break;
        }
      };
      // A builder is there to change the work: what it looked like before, to tell whether refused
      // tool calls left it unchanged. Read only for a CLI that says when its calls were refused.
      const workState = async () => {
        const r = await sandboxes.exec({ root: input.sandboxPath }, { command: 'git rev-parse HEAD && git status --porcelain --untracked-files=all', shell: true, env, timeoutMs: 60_000, signal: cancelSignal });
        return r.exitCode === 0 ? r.stdout : undefined;
      };
      const before = role === 'builder' && (provider.reportsRefusals || provider.sessionToolCalls) ? await workState() : undefined;
      const idleMs = spec.idle_timeout_minutes * 60_000;
      const run = await withHeartbeat(async (signal, beat) => {
        const idleCheck = setInterval(
          () => {
            if (Date.now() - lastOutputAt >= idleMs && !graceKilled) {
              idleKilled = true;
              stop.abort();
            }
          },
          Math.min(Math.max(idleMs / 10, 50), 5_000),
        );
        try {
          return await sandboxes.exec(
            { root: input.sandboxPath },
            {
              command: command.command,
              args: command.args,
              shell: command.shell,
              stdin: command.stdin,
              env: { ...env, ...command.env },
              agentHome: true,
              ...(agentConfig ? { agentConfig } : {}),
              signal: signal ? AbortSignal.any([signal, stop.signal]) : stop.signal,
              timeoutMs: spec.timeout_minutes * 60_000,
              // Stopped (timeout, idle, cancellation, lingering): SIGTERM first, so the agent can
              // save its session and exit; SIGKILL for what is left after the grace period.
              killGraceMs: AGENT_KILL_GRACE_MS,
              onLine: (stream, line) => {
                if (provider.isRetryNoise?.(line, stream)) retryLines += 1;
                else lastOutputAt = Date.now();
                lines += 1;
                for (const event of provider.parseLine(line, stream)) onEvent(event);
                beat({ lines, agentIteration });
              },
            },
          );
        } catch (e) {
          // The executable is missing on the worker: no retry can fix that.
          if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw failure('configuration_error', missingExecutable(name, command.command, role));
          throw e;
        } finally {
          clearInterval(idleCheck);
          if (graceTimer) clearTimeout(graceTimer);
        }
      });

      let output = redact(tail(texts.join('\n'), AGENT_OUTPUT_TAIL_CHARS), secrets);
      if (cancelSignal.aborted) throw failure('agent_runtime_transient', `${name} was cancelled`);
      if (configError !== undefined) {
        throw redactedFailure('configuration_error', `${name} cannot work as configured: ${tail(configError, 500)}. ${provider.setupHint ?? ''}`.trim(), secrets);
      }
      // The launcher in front of the agent (unshare's PID namespace unconfined, bubblewrap confined) reports a missing executable itself.
      const launcherSays = [`unshare: failed to execute ${command.command}: No such file or directory`, `bwrap: execvp ${command.command}: No such file or directory`];
      if (run.exitCode !== 0 && run.stderr.split('\n').some((l) => launcherSays.includes(l.trim()))) {
        throw failure('configuration_error', missingExecutable(name, command.command, role));
      }
      if (idleKilled && !graceKilled) {
        const what = retryLines > 0 ? `made no progress (only ${retryLines} retry line${retryLines > 1 ? 's' : ''})` : 'printed nothing';
        throw failure('agent_runtime_transient', `${name} ${what} for ${formatMinutes(spec.idle_timeout_minutes)} (idle_timeout_minutes) and was killed`);
      }
      if (run.timedOut) throw failure('agent_runtime_transient', `${name} ran past its ${formatMinutes(spec.timeout_minutes)} limit (timeout_minutes) and was killed`);
      if (rateLimit) {
        const message = rateLimit.message ? `: ${tail(rateLimit.message, 300)}` : '';
        throw redactedFailure('provider_rate_limit', `${name} hit a rate limit${message}`, secrets, { resetAt: rateLimit.resetAt });
      }
      if (!graceKilled && budgetStopped === undefined && run.exitCode !== 0) {
        // The agent's own error reports say most; without them, its stderr, then its last words.
        const why = errors.length > 0 ? errors.join('\n') : run.stderr.trim() || output;
        // The saved session is gone (another worker, a cleaned agent home, a private sandbox home):
        // a fresh session with the full prompt (task, failure, history) instead of failing six times.
        const missing = input.resumeSessionId ? SESSION_MISSING.exec(stripVTControlCharacters(`${errors.join('\n')}\n${run.stderr}\n${texts.join('\n')}`)) : null;
        if (missing) {
          Context.current().log.warn('agent session cannot be resumed; starting a fresh one', { role, provider: spec.provider, session: input.resumeSessionId });
          const fresh = await activities.runAgent({ ...input, resumeSessionId: undefined });
          return { ...fresh, resumeFailed: redact(`session ${input.resumeSessionId} could not be resumed (${missing[0]}); a fresh session got the full context`, secrets) };
        }
        throw redactedFailure('agent_runtime_transient', `${name} exited with ${run.exitCode ?? run.signal}: ${tail(why, 1_000)}`, secrets);
      }

      // Tool calls the CLI's output leaves out when they fail (codex): from its session file.
      if (provider.sessionToolCalls && provider.sessionLocation && sessionId) {
        let calls;
        try {
          const location = provider.sessionLocation(sessionId, { env: agentEnv, home: agentEnv.HOME || os.homedir() });
          const files = await readSession(location.root, location.belongs);
          calls = provider.sessionToolCalls([...files.values()].map((b) => b.toString('utf8')).join('\n'));
        } catch (e) {
          Context.current().log.warn('agent session file could not be read for its tool calls', { role, provider: spec.provider, error: redact((e as Error).message, secrets) });
        }
        if (calls && calls.failed.length > 0) {
          const list = redact(calls.failed.slice(0, 5).join('; '), secrets);
          Context.current().log.warn('agent tool calls failed', { role, provider: spec.provider, failed: list });
          if (calls.failed.length >= calls.calls && before !== undefined && (await workState()) === before) {
            throw failure('configuration_error', `${name} changed nothing: ${calls.failed.length > 1 ? `all ${calls.failed.length} of its tool calls` : 'its one tool call'} failed (${list}); ${calls.hint.replace('<role>', role)}`);
          }
          output = tail(`${output}\n[slipway] ${calls.failed.length} of ${calls.calls} tool call${calls.calls > 1 ? 's' : ''} failed: ${list}`, AGENT_OUTPUT_TAIL_CHARS);
        }
      }

      if (denied.length > 0) {
        const perTool = new Map<string, number>();
        for (const tool of denied) perTool.set(tool, (perTool.get(tool) ?? 0) + 1);
        const counts = [...perTool].map(([tool, n]) => (n > 1 ? `${tool} ×${n}` : tool)).join(', ');
        Context.current().log.warn('agent tool calls denied', { role, provider: spec.provider, denied: counts });
        if (before !== undefined && (await workState()) === before) {
          throw failure('configuration_error', `${name} changed nothing: its permission rules denied ${denied.length} tool call${denied.length > 1 ? 's' : ''} (${counts}); set agents.${role}.permission_mode to one that allows them (claude-code: acceptEdits, or bypassPermissions in a confined sandbox)`);
        }
        output = tail(`${output}\n[slipway] ${denied.length} tool call${denied.length > 1 ? 's were' : ' was'} denied by the agent's permission rules: ${counts}`, AGENT_OUTPUT_TAIL_CHARS);
      }

      let verdict: ReviewVerdict | undefined;
      let plan: StreamSpec[] | undefined;
      let outputError: string | undefined;
      const answer = texts.join('\n');
      if (role === 'reviewer') {
        const parsed = extractTagged(answer, ANSWER_FORMATS.reviewer!.tag, ReviewVerdictSchema);
        if (parsed.ok) {
          verdict = {
            ...parsed.value,
            summary: parsed.value.summary === undefined ? undefined : redact(parsed.value.summary, secrets),
            findings: parsed.value.findings.map((f) => redact(f, secrets)),
          };
        } else outputError = redact(parsed.error, secrets);
      } else if (role === 'planner') {
        const parsed = extractTagged(answer, ANSWER_FORMATS.planner!.tag, PlanSchema);
        if (parsed.ok) plan = parsed.value.streams.map((s) => ({ ...s, task: redact(s.task, secrets) }));
        else outputError = redact(parsed.error, secrets);
      }
      // Stopped (or ended) before its final figures: its running total is what it spent.
      if (!usageReported && soFar) Object.assign(usage, soFar);
      // No cost in the agent's output: estimate it from the model's price, marked as an estimate.
      if (provider.reportsNoTokens) usage.usageUnknown = true;
      else if (usage.costUsd === undefined && spec.price) {
        usage.costUsd = estimateCostUsd(usage, spec.price);
        usage.estimated = true;
      }
      // Only a run that counts records its session's totals: the next resume subtracts them.
      if (sessionId && sessionTotals) await writeSessionTotals(spec.provider, sessionId, sessionTotals);
      const captured = sessionId ? carry(sessionId) : undefined;
      if (captured) {
        try {
          await captureSession(captured.location, captured.store);
        } catch (e) {
          // Not fatal: a later resume that cannot find the session falls back to a fresh one.
          Context.current().log.warn('agent session could not be captured', { role, provider: spec.provider, session: sessionId, error: redact((e as Error).message, secrets) });
        }
      }
      // The run's work enters the repository here, not in a commitWork of its own. A retried
      // attempt (this one's worker died after the commit) finds it committed and commits only
      // what its own run changed.
      // A commit that fails must not fail the run: a retry would run the agent again for a commit
      // the workflow's own commitWork (or the leftovers commit) can make or report.
      const commit = input.commit
        ? await withHeartbeat(() => commitSandboxWork(sandboxes, { path: input.sandboxPath, message: input.commit!.message })).catch((e: unknown) => {
            Context.current().log.warn('the run ended but its work could not be committed in the run; the stream commits it', { role, error: redact((e as Error).message, secrets) });
            return undefined;
          })
        : undefined;
      const ended = graceKilled ? 'grace_killed' : 'exited';
      Context.current().log.info('agent run finished', {
        role,
        stream: input.stream.id,
        provider: spec.provider,
        agentIteration,
        durationMs: run.durationMs,
        inputTokens: usage.inputTokens,
        outputTokens: usage.outputTokens,
        costUsd: usage.costUsd,
        completionSignal: completionSignal !== undefined,
        ended,
        budgetStopped: budgetStopped !== undefined,
      });
      const committed = commit ? { commit } : {};
      if (budgetStopped !== undefined) return { exitCode: run.exitCode, sessionId, usage, toolCalls, output, ended, budgetStopped, durationMs: run.durationMs, ...committed };
      return { exitCode: run.exitCode, sessionId, usage, toolCalls, output, completionSignal, ended, verdict, plan, outputError, durationMs: run.durationMs, ...committed };
    },
  };
  return activities;
}

function missingExecutable(name: string, executable: string, role: AgentRole): string {
  return `${name}: the executable "${executable}" was not found on the worker (ENOENT); install it on the worker's PATH or set agents.${role}.command`;
}

function formatMinutes(minutes: number): string {
  return minutes < 1 ? `${Math.round(minutes * 600) / 10} s` : `${minutes} min`;
}
