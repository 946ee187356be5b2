/**
 * The objective file: what a user writes. Validated with zod; `config/objective-file.ts`
 * turns zod issues into "file:line field: message" errors.
 */
import { KubernetesConfigSchema } from './kubernetes';
import { LimitsConfigSchema } from './limits';
import { ModelPriceSchema } from './prices';
import { z } from 'zod';
import { ID_PATTERN, ID_RULE, RESERVED_STREAM_IDS } from './ids';
import { streamGraphIssues } from './stream-graph';

export { findDependencyCycle, MAX_STREAMS } from './stream-graph';

export const AGENT_PROVIDERS = ['script', 'claude-code', 'codex', 'opencode', 'pi', 'copilot'] as const;
export type AgentProviderKind = (typeof AGENT_PROVIDERS)[number];

const id = z.string().regex(ID_PATTERN, `must be ${ID_RULE}`);

/**
 * Size limits of the texts a user writes. The objective travels in every workflow input and
 * agent context, so a multi-megabyte text would hit Temporal's payload limit (a gRPC error
 * after the start) instead of a clear message here.
 */
export const TEXT_LIMITS = {
  /** The `objective:` text, in characters. */
  objective: 50_000,
  /** One stream's `task:` text, in characters. */
  task: 20_000,
  /** The whole objective file, in bytes. */
  fileBytes: 1024 * 1024,
} as const;

const count = (n: number) => n.toLocaleString('en-US');

/**
 * Bounds of the loops a stream runs. The stream workflow continues as new once per fix
 * iteration, so one run holds at most one step's agent loop (`maxIterations` runs, plus
 * `maxOutputRetries`): these caps keep every run far below Temporal's history limits, and the
 * whole stream's agent runs ((maxFixIterations + 1) x maxIterations per agent step) within what
 * the objective gathers. Worst case in docs/adr/0010-bounded-stream-history.md; a test drives it.
 */
export const ITERATION_CAPS = {
  /** Agent runs per step (`agents.<role>.max_iterations`). */
  maxIterations: 20,
  /** Fix-loop rounds per step (`max_fix_iterations`, also in blueprints). */
  maxFixIterations: 10,
  /** New runs for an unusable structured answer (`agents.<role>.max_output_retries`). */
  maxOutputRetries: 10,
} as const;

/** An integer within [min, max] (the loader says "<field>: must be at most <max>, got <n>"). */
const capped = (min: number, max: number) => z.number().int().min(min).max(max);

/** A non-empty string of at most `max` characters; the message says how long it is. */
const limitedText = (max: number, hint: string) =>
  z
    .string()
    .min(1)
    .superRefine((s, ctx) => {
      // Not `.max()`: its message cannot say how long the text is, nor what to do instead.
      if (s.length > max) ctx.addIssue({ code: 'custom', message: `too long: ${count(s.length)} characters, at most ${count(max)} allowed; ${hint}` });
    });

/** A shell command: whitespace alone would run nothing and "pass". */
const command = z
  .string()
  .min(1)
  .refine((s) => s.trim() !== '', { message: 'must not be only whitespace: give a command to run' });

export const GateSchema = z.strictObject({
  name: z.string().min(1),
  command,
  timeout_seconds: z.number().int().positive().max(24 * 3600).default(600),
});
export type GateSpec = z.infer<typeof GateSchema>;

/** Printed by an agent to end its step's iteration loop early (Sandcastle's convention). */
export const DEFAULT_COMPLETION_SIGNAL = '<promise>COMPLETE</promise>';
/** `{{KEY}}` names a prompt template may use. */
export const TEMPLATE_KEY_PATTERN = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Agent fields as a user writes them, with no defaults: the objective file's `agents.<role>`
 * overrides `.slipway/config.yaml`'s field by field, so an absent field must stay absent until
 * the two are merged (config/agent-config.ts) and `AgentSchema` applies the defaults.
 */
const agentFields = {
  provider: z.enum(AGENT_PROVIDERS),
  /**
   * For `script`: the shell command run inside the sandbox. For real agents: the executable,
   * optionally followed by arguments (split like a shell would, no shell involved), e.g.
   * `node /path/fake-agent.mjs --format claude`.
   */
  command,
  model: z.string().min(1),
  permission_mode: z.string().min(1),
  extra_args: z.array(z.string()),
  /** Hard cap on one agent run. */
  timeout_minutes: z.number().positive().max(24 * 60),
  /** No output (stdout or stderr) for this long: the process group is killed; the run is `agent_runtime_transient`. */
  idle_timeout_minutes: z.number().positive().max(24 * 60),
  /** Agent runs per step; the loop ends early when the output holds a completion signal. */
  max_iterations: capped(1, ITERATION_CAPS.maxIterations),
  completion_signals: z.array(z.string().min(1)).min(1),
  /** After a completion signal: how long the process may take to exit before its process group is killed. */
  completion_grace_seconds: z.number().min(0).max(600),
  /** Inline prompt template (`{{KEY}}` arguments, `` !`command` `` expansions). */
  prompt: z.string().min(1),
  /** Prompt template file, relative to the file that names it. */
  prompt_file: z.string().min(1),
  /** Values of the template's own `{{KEY}}` arguments. */
  args: z.record(z.string().regex(TEMPLATE_KEY_PATTERN, 'must be a template key: letters, digits and "_", not starting with a digit'), z.string()),
  /** New runs allowed when a reviewer's or planner's structured answer is invalid (each told why). */
  max_output_retries: capped(0, ITERATION_CAPS.maxOutputRetries),
};

const onePrompt = (a: { prompt?: string; prompt_file?: string }) => a.prompt === undefined || a.prompt_file === undefined;
const onePromptIssue = { message: 'set either "prompt" or "prompt_file", not both', path: ['prompt_file'] };

/** One role's agent as written in the objective file or `.slipway/config.yaml`: every field optional. */
export const AgentOverridesSchema = z.strictObject(agentFields).partial().refine(onePrompt, onePromptIssue);
export type AgentOverrides = z.infer<typeof AgentOverridesSchema>;

/** A role's agent after the objective file and `.slipway/config.yaml` are merged: defaults applied. */
export const AgentSchema = z
  .strictObject({
    provider: agentFields.provider,
    command: agentFields.command.optional(),
    model: agentFields.model.optional(),
    permission_mode: agentFields.permission_mode.optional(),
    extra_args: agentFields.extra_args.default([]),
    timeout_minutes: agentFields.timeout_minutes.default(30),
    // Long enough for a silent tool call (a test suite run by the agent prints nothing until it ends).
    idle_timeout_minutes: agentFields.idle_timeout_minutes.default(15),
    max_iterations: agentFields.max_iterations.default(1),
    completion_signals: agentFields.completion_signals.default([DEFAULT_COMPLETION_SIGNAL]),
    completion_grace_seconds: agentFields.completion_grace_seconds.default(5),
    /**
     * The prompt template's text. When the user wrote `prompt_file`, the loader reads the file
     * into `prompt` and keeps `prompt_file` (the path as written) to name it in messages.
     */
    prompt: agentFields.prompt.optional(),
    prompt_file: agentFields.prompt_file.optional(),
    args: agentFields.args.default({}),
    max_output_retries: agentFields.max_output_retries.default(2),
    /** Set by the loader (core/prices.ts, `.slipway/config.yaml` `prices:`), never written: the model's price, for runs that report no cost. */
    price: ModelPriceSchema.optional(),
  })
  .refine((a) => a.provider !== 'script' || a.command !== undefined, {
    message: 'the script provider needs a "command"',
    path: ['command'],
  });
export type AgentSpec = z.infer<typeof AgentSchema>;

/** Where sandboxes can run (the `sandbox:` section's `provider`). */
export const SANDBOX_PROVIDERS = ['local', 'podman', 'docker', 'daytona', 'kubernetes'] as const;
export type SandboxProviderKind = (typeof SANDBOX_PROVIDERS)[number];

/** Absolute path, or `~/...` (the worker's home). */
const hostPath = z.string().refine((p) => p.startsWith('/') || p === '~' || p.startsWith('~/'), { message: 'must be an absolute path or start with ~/' });

/** The `sandbox:` section: how every sandbox of the objective is made and confined. */
export const SandboxConfigSchema = z.strictObject({
  /**
   * Where sandboxes run: `local` (a worktree of the repository on the worker's host), `podman` or
   * `docker` (one container per sandbox, carried by git bundles: ADR 0012).
   */
  provider: z.enum(SANDBOX_PROVIDERS).default('local'),
  /** `bubblewrap`: agents, gates and setup commands can write only to their worktree (local provider). */
  confinement: z.enum(['none', 'bubblewrap']).default('none'),
  /** Under bubblewrap: false leaves the sandbox a loopback device only. */
  network: z.boolean().default(true),
  /** Copy the checkout's git-ignored files (node_modules, .env; `.worktreeinclude` limits them). */
  copy_ignored: z.boolean().default(true),
  project_setup: z
    .strictObject({
      /** Run once after a sandbox is created (`npm ci`). */
      commands: z.array(command).default([]),
      /** Checks after setup (`node -e "require('left-pad')"`); one failing retries setup. */
      verify: z.array(command).default([]),
      timeout_seconds: z.number().int().positive().max(3600).default(300),
      /** Setup runs at most this many times (a failing verify retries it). */
      attempts: z.number().int().min(1).max(5).default(2),
    })
    .optional(),
  /** Ready sandboxes kept, claimed on create (0: off): worktrees per repository and base commit; podman/docker: running containers per image and settings; kubernetes: Ready pods. */
  warm_pool: z.number().int().min(0).max(16).default(0),
  /** Seconds between two probes of a stream's sandbox by its workflow (a sandbox gone outside Slipway is recreated); default 30. */
  probe_seconds: z.number().int().min(1).max(3600).optional(),
  /** Under bubblewrap: extra paths commands may write (agent state such as ~/.claude). */
  writable: z.array(hostPath).default([]),
  /** Under bubblewrap: paths hidden behind an empty folder (~/.ssh, ~/.aws). */
  hidden: z.array(hostPath).default([]),
  /** Under bubblewrap: paths bound read-only (an agent CLI's install folder, its config files), also inside a `writable` path. */
  readable: z.array(hostPath).default([]),
  /** Under bubblewrap: limits every command of a sandbox gets (cgroups where the host has them). */
  limits: LimitsConfigSchema.optional(),
  /** With provider: kubernetes: namespace, image, node_selector, tolerations, resources, service_account, workspace (ADR 0020). */
  kubernetes: KubernetesConfigSchema.optional(),
}).superRefine((sandbox, ctx) => {
  if (sandbox.kubernetes && sandbox.provider !== 'kubernetes') ctx.addIssue({ code: 'custom', path: ['kubernetes'], message: `applies to provider: kubernetes only, not provider: ${sandbox.provider}` });
  if (sandbox.provider === 'kubernetes' && !sandbox.kubernetes?.image) ctx.addIssue({ code: 'custom', path: ['kubernetes', 'image'], message: 'is required with provider: kubernetes (the sandbox image: /bin/sh, git, coreutils)' });
  if (sandbox.provider === 'local') return;
  // Options of the local provider that a container cannot honour: refused, not ignored.
  const localOnly = (field: string, why: string) => ctx.addIssue({ code: 'custom', path: [field], message: `${why}; it is an option of the local provider, not of provider: ${sandbox.provider}` });
  if (sandbox.confinement !== 'none') localOnly('confinement', 'a container is its own confinement (ADR 0012)');
  // Containers keep warm containers (ADR 0025), Kubernetes warm pods (ADR 0020); Daytona has no pool of Slipway's.
  if (sandbox.warm_pool > 0 && sandbox.provider === 'daytona') localOnly('warm_pool', 'Daytona sandboxes have no warm pool');
  if (sandbox.writable.length > 0) localOnly('writable', 'a container writes only its workspace');
  if (sandbox.hidden.length > 0) localOnly('hidden', 'a container sees no host path it is not given');
  // Daytona sizes a sandbox by its snapshot and account (ADR 0019): limits would be ignored, so they are refused.
  // A pod is sized by kubernetes.resources: limits would be a second, conflicting place.
  if (sandbox.provider === 'kubernetes' && sandbox.limits) ctx.addIssue({ code: 'custom', path: ['limits'], message: 'is not supported by provider: kubernetes (size pods with kubernetes.resources)' });
  if (sandbox.provider === 'daytona' && sandbox.limits) ctx.addIssue({ code: 'custom', path: ['limits'], message: 'is not supported by provider: daytona (a Daytona sandbox is sized by its snapshot)' });
  if (sandbox.limits?.disk_mb !== undefined) ctx.addIssue({ code: 'custom', path: ['limits', 'disk_mb'], message: `is not supported by provider: ${sandbox.provider} (use the local provider)` });
});
export type SandboxConfig = z.infer<typeof SandboxConfigSchema>;

/** One spending limit: US dollars and/or tokens (input plus output; input includes cached). */
export const BudgetLimitSchema = z
  .strictObject({
    usd: z.number().positive(),
    tokens: z.number().int().positive(),
  })
  .partial()
  .refine((l) => l.usd !== undefined || l.tokens !== undefined, { message: 'give "usd", "tokens" or both' });
export type BudgetLimit = z.infer<typeof BudgetLimitSchema>;

/**
 * The `budget:` section (objective file or `.slipway/config.yaml`, the file's fields win one by
 * one): what the objective and each of its streams may spend on agent runs. Once a limit is
 * reached no new agent run starts; `on_exhausted` says whether the stream then blocks (until
 * `slipway budget raise` or guidance) or fails. See docs/adr/0017-budget-guardrail.md.
 */
export const BudgetSchema = z
  .strictObject({
    /** For the whole objective (its streams and the planner). */
    objective: BudgetLimitSchema,
    /** For each stream on its own. */
    stream: BudgetLimitSchema,
    on_exhausted: z.enum(['block', 'fail']),
    /** Stop an agent run in flight once its stream's limit is reached (default: the run finishes). */
    hard_limit: z.boolean(),
  })
  .partial();
export type BudgetConfig = z.infer<typeof BudgetSchema>;

export const StreamSchema = z.strictObject({
  id: id.refine((v) => !(RESERVED_STREAM_IDS as readonly string[]).includes(v), {
    message: `is reserved (${RESERVED_STREAM_IDS.join(', ')})`,
  }),
  task: limitedText(TEXT_LIMITS.task, 'keep a task to what the stream must do and put longer context in a file in the repository'),
  depends_on: z.array(z.string()).default([]),
});
export type StreamSpec = z.infer<typeof StreamSchema>;

export const ObjectiveFileSchema = z
  .strictObject({
    id: id.optional(),
    objective: limitedText(TEXT_LIMITS.objective, 'put longer context in a file in the repository and refer to it'),
    repository: z.string().min(1),
    base_branch: z.string().min(1).optional(),
    /** Blueprint id (shipped, user or project folder). */
    blueprint: z.string().min(1).default('standard'),
    max_parallel_streams: z.number().int().positive().max(64).default(3),
    /** Overrides the blueprints' fix-loop bound for steps that set none. */
    max_fix_iterations: capped(0, ITERATION_CAPS.maxFixIterations).optional(),
    /** Overrides the blueprints' exhaustion mode (ask_human, escalate, fail) for steps that set none. */
    on_exhausted: z.enum(['ask_human', 'escalate', 'fail']).optional(),
    /** Ask for `slipway approve` even when the streams come from this file. */
    require_approval: z.boolean().default(false),
    gates: z.array(GateSchema).default([]),
    post_merge_gates: z.array(GateSchema).optional(),
    /** Per role; merged over `.slipway/config.yaml`'s agents (config/agent-config.ts), which may supply them all. */
    agents: z
      .strictObject({
        builder: AgentOverridesSchema.optional(),
        reviewer: AgentOverridesSchema.optional(),
        planner: AgentOverridesSchema.optional(),
        scout: AgentOverridesSchema.optional(),
      })
      .default({}),
    /** May be left out when a planner agent produces the streams. */
    streams: z.array(StreamSchema).default([]),
    /** Spending limits; merged over `.slipway/config.yaml`'s `budget:` field by field. */
    budget: BudgetSchema.optional(),
    /** How sandboxes are made and confined; see SandboxConfigSchema. */
    sandbox: SandboxConfigSchema.optional(),
  })
  .superRefine((file, ctx) => {
    // "No streams and no planner" is checked by the loader once .slipway/config.yaml's agents are merged in.
    for (const issue of streamGraphIssues(file.streams)) ctx.addIssue({ code: 'custom', ...issue });
  });
export type ObjectiveFile = z.infer<typeof ObjectiveFileSchema>;
