/**
 * The agent provider contract: build a headless command line, parse output lines into events.
 * Each agent kind (script, claude-code, codex, opencode, pi) implements it in its own file.
 */
import type { AgentProviderKind } from '../core/objective-schema';
import type { AgentSpec } from '../core/types';
import type { AgentRole } from '../core/states';

export interface AgentInvocation {
  role: AgentRole;
  spec: AgentSpec;
  prompt: string;
  /** Sandbox working directory. */
  cwd: string;
  /** Session to resume, when the agent supports it. */
  resumeSessionId?: string;
  /** Extra environment for the agent process (context variables, never secrets from workflow input). */
  env: Record<string, string>;
}

export interface AgentCommand {
  command: string;
  args: string[];
  /** Run `command` through /bin/sh -c. */
  shell?: boolean;
  stdin?: string;
  env?: Record<string, string>;
}

export interface TokenUsage {
  inputTokens: number;
  outputTokens: number;
  cachedTokens?: number;
  costUsd?: number;
  /** `costUsd` is Slipway's estimate from the model's price (core/prices.ts): the agent reported none. */
  estimated?: boolean;
  /** The agent reports no token counts (Copilot): the zeros mean unknown, not free. */
  usageUnknown?: boolean;
}

/**
 * What a session has used in total, as a CLI that reports running totals prints it (raw, before
 * the token convention): Claude Code's `total_cost_usd`, Codex's thread token totals. Stored after a
 * run (session-usage.ts) and given to the provider of the next run that resumes the session, which
 * reports only the difference.
 */
export interface SessionTotals {
  inputTokens?: number;
  outputTokens?: number;
  cachedTokens?: number;
  costUsd?: number;
}

export interface ProviderOptions {
  /** The resumed session's totals after its previous run. */
  baseline?: SessionTotals;
}

export type AgentEvent =
  | { type: 'text'; text: string }
  | { type: 'tool_call'; name: string; input?: unknown }
  | ({ type: 'usage' } & TokenUsage)
  /**
   * The run's usage so far, as a running total, from an agent whose exact figures come only at the
   * end (Claude Code's per-message usage): for the hard limit in flight, and the run's usage when it
   * is stopped before its final `usage`; once a `usage` event came, these are ignored.
   */
  | ({ type: 'usage_so_far' } & TokenUsage)
  | { type: 'session'; sessionId: string }
  | { type: 'session_totals'; totals: SessionTotals }
  | { type: 'result'; text: string; isError?: boolean }
  | { type: 'error'; message: string }
  /** The agent's own permission rules refused a tool call (Claude Code's `permission_denials`). */
  | { type: 'denied'; tool: string }
  /** The agent cannot work as configured (not logged in, key rejected or missing): retrying cannot help. */
  | { type: 'config_error'; message: string }
  | { type: 'rate_limit'; resetAt?: string; message?: string };

/**
 * Where a CLI looks for its credentials, for the check `slipway run` makes before anything starts
 * (activities/agents/preflight.ts): names and paths only, never a value.
 */
export interface CredentialSources {
  /** Environment variables, any one of which (set and not empty) will do. */
  env: string[];
  /** Files, any one of which existing will do: a login, or a config that declares its own provider. */
  files: string[];
  /** The configured model provider needs no key (a local model): nothing to check. */
  keyless?: boolean;
}

/** What a provider may look at to name its credential sources: the environment the agent would get, and files to read. */
export interface CredentialContext {
  env: Record<string, string | undefined>;
  /** The agent's home: `HOME` of that environment. */
  home: string;
  /** A file's text, or undefined when it cannot be read. */
  readText(file: string): string | undefined;
}

/**
 * Where a CLI keeps one session's files under its home, so Slipway can carry the session to a fresh
 * agent home (another sandbox or worker): activities/agents/session-carry.ts.
 */
export interface SessionLocation {
  /** The folder of the CLI's sessions (absolute). */
  root: string;
  /** A file (path relative to `root`, `/`-separated) that is part of the session. */
  belongs(rel: string): boolean;
  /** Where a captured file (relative to `root`) goes for an agent working in `cwd` (the cwd as the agent sees it). */
  place(rel: string, cwd: string): string;
}

/** The tool calls of the run that just ended, as its session file records them. */
export interface SessionToolCalls {
  calls: number;
  /** One line per failed call: the tool, what it ran, how it failed. */
  failed: string[];
  /** What to change when every call failed. */
  hint: string;
}

/**
 * A config file the CLI reads from its home. Under bubblewrap an agent's HOME is Slipway's private
 * agent home, so the worker's copy (`path` under the worker's HOME) is bound there read-only
 * (ExecRequest.agentConfig). Not bound when `overriddenBy` is set in the agent's environment: the
 * CLI then looks where that variable says (bind that folder with `sandbox.readable:`).
 */
export interface AgentConfigFile {
  /** Relative to HOME, `/`-separated. */
  path: string;
  overriddenBy?: string;
}

export interface AgentProvider {
  readonly kind: AgentProviderKind;
  /** The config files the CLI needs from its home (absent: none). */
  readonly configFiles?: readonly AgentConfigFile[];
  /**
   * For a CLI whose output leaves failed tool calls out (codex 0.169): this run's tool calls, read
   * from the session's files (`sessionLocation`) after it ended. `text`: those files, concatenated.
   */
  sessionToolCalls?(text: string): SessionToolCalls;
  /** Where session `sessionId` lives under the agent's home (absent: its sessions are not carried). */
  sessionLocation?(sessionId: string, context: Pick<CredentialContext, 'env' | 'home'>): SessionLocation;
  /** Where the CLI finds credentials for `spec` (absent: nothing is checked at load, e.g. the script provider). */
  credentialSources?(spec: AgentSpec, context: CredentialContext): CredentialSources;
  /**
   * Its output says when tool calls were refused (`denied` events): a builder's work is read before
   * each run, so a run whose calls were refused and that changed nothing fails with that reason.
   * (A CLI with `sessionToolCalls` gets the same check from its session files.)
   */
  readonly reportsRefusals?: true;
  /** Its output has no token counts (Copilot's JSON): its runs' usage is recorded as unknown, never estimated. */
  readonly reportsNoTokens?: true;
  /** What to set when the agent reports a configuration error (credentials), for the failure message. */
  readonly setupHint?: string;
  buildCommand(invocation: AgentInvocation): AgentCommand;
  /**
   * A line that is the CLI retrying (a lost connection, an overloaded API), not progress: it does not
   * hold off `idle_timeout_minutes`, so an agent that only reconnects is ended like a silent one.
   */
  isRetryNoise?(line: string, stream: 'stdout' | 'stderr'): boolean;
  /** Parses one output line. Unknown or malformed lines yield no events (or a text event), never throw. */
  parseLine(line: string, stream: 'stdout' | 'stderr'): AgentEvent[];
}
