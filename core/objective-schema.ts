/**
 * The objective file: what a user writes. Validated with zod; `config/objective-file.ts`
 * turns zod issues into "file:line field: message" errors.
 */
import { z } from 'zod';
import { ID_PATTERN, ID_RULE, RESERVED_STREAM_IDS } from './ids';

export const AGENT_PROVIDERS = ['script', 'claude-code', 'codex', 'opencode', 'pi'] as const;
export type AgentProviderKind = (typeof AGENT_PROVIDERS)[number];

const id = z.string().regex(ID_PATTERN, `must be ${ID_RULE}`);

export const GateSchema = z.strictObject({
  name: z.string().min(1),
  command: z.string().min(1),
  timeout_seconds: z.number().int().positive().max(24 * 3600).default(600),
});
export type GateSpec = z.infer<typeof GateSchema>;

export const AgentSchema = z.strictObject({
  provider: z.enum(AGENT_PROVIDERS),
  /** For `script`: the shell command run inside the sandbox. For real agents: overrides the executable. */
  command: z.string().min(1).optional(),
  model: z.string().min(1).optional(),
  permission_mode: z.string().min(1).optional(),
  extra_args: z.array(z.string()).default([]),
  /** Hard cap on one agent run. */
  timeout_minutes: z.number().positive().max(24 * 60).default(30),
}).refine((a) => a.provider !== 'script' || a.command !== undefined, {
  message: 'the script provider needs a "command"',
  path: ['command'],
});
export type AgentSpec = z.infer<typeof AgentSchema>;

export const StreamSchema = z.strictObject({
  id: id.refine((v) => !(RESERVED_STREAM_IDS as readonly string[]).includes(v), {
    message: `is reserved (${RESERVED_STREAM_IDS.join(', ')})`,
  }),
  task: z.string().min(1),
  depends_on: z.array(z.string()).default([]),
});
export type StreamSpec = z.infer<typeof StreamSchema>;

export const ObjectiveFileSchema = z
  .strictObject({
    id: id.optional(),
    objective: z.string().min(1),
    repository: z.string().min(1),
    base_branch: z.string().min(1).optional(),
    /** Blueprint id (shipped, user or project folder). */
    blueprint: z.string().min(1).default('standard'),
    max_parallel_streams: z.number().int().positive().max(64).default(3),
    /** Overrides the blueprints' fix-loop bound for steps that set none. */
    max_fix_iterations: z.number().int().min(0).max(50).optional(),
    /** Overrides the blueprints' exhaustion mode (ask_human, escalate, fail) for steps that set none. */
    on_exhausted: z.enum(['ask_human', 'escalate', 'fail']).optional(),
    /** Ask for `slipway approve` even when the streams come from this file. */
    require_approval: z.boolean().default(false),
    gates: z.array(GateSchema).default([]),
    post_merge_gates: z.array(GateSchema).optional(),
    agents: z.strictObject({
      builder: AgentSchema,
      reviewer: AgentSchema.optional(),
      planner: AgentSchema.optional(),
      scout: AgentSchema.optional(),
    }),
    /** May be left out when a planner agent produces the streams. */
    streams: z.array(StreamSchema).default([]),
  })
  .superRefine((file, ctx) => {
    if (file.streams.length === 0 && !file.agents.planner) {
      ctx.addIssue({ code: 'custom', path: ['streams'], message: 'list at least one stream, or configure agents.planner to plan them' });
    }
    const ids = new Set<string>();
    file.streams.forEach((stream, index) => {
      if (ids.has(stream.id)) {
        ctx.addIssue({ code: 'custom', path: ['streams', index, 'id'], message: `duplicate stream id "${stream.id}"` });
      }
      ids.add(stream.id);
    });
    file.streams.forEach((stream, index) => {
      stream.depends_on.forEach((dep, depIndex) => {
        if (!ids.has(dep)) {
          ctx.addIssue({ code: 'custom', path: ['streams', index, 'depends_on', depIndex], message: `unknown stream "${dep}"` });
        } else if (dep === stream.id) {
          ctx.addIssue({ code: 'custom', path: ['streams', index, 'depends_on', depIndex], message: 'a stream cannot depend on itself' });
        }
      });
    });
    const cycle = findDependencyCycle(file.streams);
    if (cycle) {
      const index = file.streams.findIndex((s) => s.id === cycle[0]);
      ctx.addIssue({ code: 'custom', path: ['streams', index, 'depends_on'], message: `dependency cycle: ${cycle.join(' -> ')}` });
    }
  });
export type ObjectiveFile = z.infer<typeof ObjectiveFileSchema>;

/** Returns one dependency cycle as a list of stream ids (first repeated at the end), or undefined. */
export function findDependencyCycle(streams: Pick<StreamSpec, 'id' | 'depends_on'>[]): string[] | undefined {
  const deps = new Map(streams.map((s) => [s.id, s.depends_on.filter((d) => d !== s.id)]));
  const state = new Map<string, 'visiting' | 'done'>();
  const stack: string[] = [];
  const visit = (node: string): string[] | undefined => {
    if (state.get(node) === 'done') return undefined;
    if (state.get(node) === 'visiting') return [...stack.slice(stack.indexOf(node)), node];
    state.set(node, 'visiting');
    stack.push(node);
    for (const dep of deps.get(node) ?? []) {
      const found = deps.has(dep) ? visit(dep) : undefined;
      if (found) return found;
    }
    stack.pop();
    state.set(node, 'done');
    return undefined;
  };
  for (const s of streams) {
    const found = visit(s.id);
    if (found) return found;
  }
  return undefined;
}
