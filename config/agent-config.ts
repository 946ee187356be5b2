/**
 * Agents of an objective: `.slipway/config.yaml` in the repository gives per-role defaults, the
 * objective file's `agents.<role>` overrides them field by field. Everything an agent run needs
 * is checked here, before anything starts, and every problem points at the file and line it
 * comes from (the objective file, the config file, or a prompt template):
 *
 *   .slipway/config.yaml:4:14: agents.builder.permission_mode: codex does not know permission_mode "yolo" (...)
 *   prompts/build.md:7:3: {{TIKET}} has no value; give it in "args", or use a built-in: ...
 *
 * Merge rules (the objective file wins):
 * - a field set in the objective file replaces the config's (lists too: `extra_args`, `completion_signals`);
 * - a different `provider` in the objective file drops the config's defaults for that role
 *   (a claude-code model or flag means nothing to codex);
 * - `prompt` or `prompt_file` in the objective file replaces the config's prompt and its `args`;
 *   otherwise `args` are merged key by key.
 * `prompt_file` is relative to the file that names it. Its text is read now and travels in the
 * workflow input (`prompt`, with `prompt_file` kept as the absolute path for messages), so an edit
 * of the template during a run changes nothing and remote workers need no access to it.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { isMap } from 'yaml';
import { z } from 'zod';
import { AgentOverridesSchema, AgentSchema, BudgetSchema, type AgentOverrides, type BudgetConfig } from '../core/objective-schema';
import { ModelPriceSchema, priceFor, type ModelPrice } from '../core/prices';
import { AGENT_ROLES, type AgentRole } from '../core/states';
import type { AgentSpec, AgentSpecs } from '../core/types';
import { agentProvider } from '../agents/registry';
import { ANSWER_FORMATS } from '../agents/prompt';
import { BUILTIN_KEYS, checkTemplate } from '../agents/template';
import {
  describeIssue,
  describeNode,
  formatFieldPath,
  isEmptyDocument,
  issuePath,
  knownKeys,
  parseYamlWithPositions,
  type PathSegment,
  type Position,
} from '../lib/yaml-positions';

export const PROJECT_CONFIG_FILE = path.join('.slipway', 'config.yaml');

const agentsShape = Object.fromEntries(AGENT_ROLES.map((role) => [role, AgentOverridesSchema.optional()])) as Record<AgentRole, z.ZodOptional<typeof AgentOverridesSchema>>;

/** `.slipway/config.yaml`: project-wide settings: default agents per role, the default budget. */
export const ProjectConfigSchema = z.strictObject({
  agents: z.strictObject(agentsShape).default({}),
  /** Under the objective file's `budget:`, field by field (config/objective-file.ts). */
  budget: BudgetSchema.optional(),
  /** Per model: USD per million tokens, over the shipped table (core/prices.ts). */
  prices: z.record(z.string().min(1), ModelPriceSchema).optional(),
});

/** Same shape as the objective file's problems (config/objective-file.ts). */
export interface ConfigProblem extends Position {
  file: string;
  field?: string;
  message: string;
}

/** A YAML file that agents come from, able to say where a field is. */
export interface AgentSource {
  file: string;
  /** Folder that relative paths (`prompt_file`) are resolved against. */
  dir: string;
  locate(segments: readonly PathSegment[]): Position;
  locateKey(mapPath: readonly PathSegment[], key: string): Position;
  /** Per role, what the file says, with the fields that failed their own checks left out. */
  agents: Partial<Record<AgentRole, AgentOverrides>>;
  /** Per role, fields already reported as invalid in this file (not reported again after the merge). */
  reported: Partial<Record<AgentRole, Set<string>>>;
}

/**
 * Per role, the objective file's agent with the fields that failed the schema left out, so the
 * merge can still check the rest (and report "needs a command" next to an unknown key).
 */
export function sanitizeAgents(raw: unknown, issues: readonly z.core.$ZodIssue[], prefix: readonly PathSegment[]): Pick<AgentSource, 'agents' | 'reported'> {
  const agents: AgentSource['agents'] = {};
  const reported: AgentSource['reported'] = {};
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) return { agents, reported };
  for (const role of AGENT_ROLES) {
    const entry = (raw as Record<string, unknown>)[role];
    if (entry === undefined) continue;
    if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) {
      reported[role] = new Set(['*']);
      continue;
    }
    const bad = new Set<string>();
    for (const issue of issues) {
      const p = issuePath(issue);
      if (p.length < prefix.length + 1 || prefix.some((seg, i) => p[i] !== seg) || p[prefix.length] !== role) continue;
      const field = p[prefix.length + 1];
      if (issue.code === 'unrecognized_keys' && field === undefined) issue.keys.forEach((k) => bad.add(k));
      else if (typeof field === 'string') bad.add(field);
    }
    const kept = Object.fromEntries(Object.entries(entry).filter(([k]) => !bad.has(k)));
    const parsed = AgentOverridesSchema.safeParse(kept);
    agents[role] = parsed.success ? parsed.data : {};
    reported[role] = bad;
  }
  return { agents, reported };
}

/** Reads `<repository>/.slipway/config.yaml`; no file means no defaults. */
export async function loadProjectConfig(repository: string): Promise<{ source?: AgentSource; budget?: BudgetConfig; prices?: Record<string, ModelPrice>; problems: ConfigProblem[] }> {
  const file = path.join(repository, PROJECT_CONFIG_FILE);
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { problems: [] };
    return { problems: [{ file, message: `cannot read the project config: ${(e as Error).message}` }] };
  }
  const yaml = parseYamlWithPositions(text);
  if (yaml.errors.length > 0) return { problems: yaml.errors.map(({ message, ...pos }) => ({ file, ...pos, message: `YAML syntax error: ${message}` })) };
  const root = yaml.doc.contents;
  const empty = { file, dir: path.dirname(file), locate: yaml.locate, locateKey: yaml.locateKey, agents: {}, reported: {} };
  if (root === null || isEmptyDocument(yaml.doc)) return { source: empty, problems: [] };
  if (!isMap(root)) return { problems: [{ file, ...yaml.at(root.range?.[0]), message: `expected a mapping (key: value pairs) at the top level, found ${describeNode(root)}` }] };
  let raw: unknown;
  try {
    raw = yaml.doc.toJS({ maxAliasCount: 100 });
  } catch (e) {
    return { problems: [{ file, ...yaml.at(root.range?.[0]), message: `cannot read the YAML: ${(e as Error).message}` }] };
  }
  const problems: ConfigProblem[] = [];
  const parsed = ProjectConfigSchema.safeParse(raw, { reportInput: true });
  const issues = parsed.success ? [] : parsed.error.issues;
  for (const issue of issues) {
    const segments = issuePath(issue);
    if (issue.code === 'unrecognized_keys') {
      const known = knownKeys(ProjectConfigSchema, segments);
      for (const key of issue.keys) {
        problems.push({ file, ...yaml.locateKey(segments, key), field: formatFieldPath([...segments, key]), message: `unknown key "${key}"${known ? ` (expected one of: ${known.join(', ')})` : ''}` });
      }
      continue;
    }
    const missing = issue.code === 'invalid_type' && issue.input === undefined && !yaml.doc.hasIn(segments);
    problems.push({ file, ...yaml.locate(segments), field: formatFieldPath(segments) || undefined, message: describeIssue(issue, missing) });
  }
  const agentsRaw = (raw as Record<string, unknown>).agents;
  // An invalid budget was reported above; the merge takes none from this file then.
  const budget = BudgetSchema.optional().safeParse((raw as Record<string, unknown>).budget);
  const prices = ProjectConfigSchema.shape.prices.safeParse((raw as Record<string, unknown>).prices);
  return {
    source: { ...empty, ...sanitizeAgents(agentsRaw, issues, ['agents']) },
    ...(budget.success && budget.data ? { budget: budget.data } : {}),
    ...(prices.success && prices.data ? { prices: prices.data } : {}),
    problems,
  };
}

const PROVIDER_BOUND_FIELDS = ['command', 'model', 'permission_mode', 'extra_args'] as const;
const PROMPT_FIELDS = ['prompt', 'prompt_file', 'args'] as const;

/**
 * Merges the config's agents under the objective file's, applies the defaults, reads and checks
 * prompt templates and the providers' command lines. Problems point at the file each field came from.
 */
export async function resolveAgents(
  objective: AgentSource,
  config: AgentSource | undefined,
  prices: Readonly<Record<string, ModelPrice>> = {},
): Promise<{ agents: AgentSpecs; problems: ConfigProblem[] }> {
  const problems: ConfigProblem[] = [];
  const agents: AgentSpecs = {};
  for (const role of AGENT_ROLES) {
    const over = objective.agents[role];
    let base: AgentOverrides = config?.agents[role] ?? {};
    if (over === undefined && config?.agents[role] === undefined) continue;
    const fromFile = over ?? {};
    if (fromFile.provider !== undefined && base.provider !== undefined && fromFile.provider !== base.provider) {
      const kept = { ...base };
      for (const f of PROVIDER_BOUND_FIELDS) delete kept[f];
      base = kept;
    }
    if (fromFile.prompt !== undefined || fromFile.prompt_file !== undefined) {
      const kept = { ...base };
      for (const f of PROMPT_FIELDS) delete kept[f];
      base = kept;
    }
    const merged: Record<string, unknown> = { ...base, ...fromFile };
    if (base.args && fromFile.args) merged.args = { ...base.args, ...fromFile.args };
    // Where each field came from, and where the role itself is written (for absent fields).
    const origin = (field: string): AgentSource => (config && !Object.hasOwn(fromFile, field) && Object.hasOwn(base, field) ? config : objective);
    const roleSource = over !== undefined || !config ? objective : config;
    const at = (field: string | undefined, sub: PathSegment[] = []): ConfigProblem => {
      const src = field === undefined ? roleSource : Object.hasOwn(merged, field) ? origin(field) : roleSource;
      const segments: PathSegment[] = ['agents', role, ...(field === undefined ? [] : [field]), ...sub];
      return { file: src.file, ...src.locate(segments), field: formatFieldPath(segments), message: '' };
    };
    const alreadyReported = (field: string | undefined) => {
      const sets = [objective.reported[role], config?.reported[role]];
      return sets.some((s) => s?.has('*') || (field !== undefined && s?.has(field)));
    };
    const add = (field: string | undefined, message: string, sub: PathSegment[] = []) => {
      if (!alreadyReported(field)) problems.push({ ...at(field, sub), message });
    };

    const parsed = AgentSchema.safeParse(merged, { reportInput: true });
    if (!parsed.success) {
      for (const issue of parsed.error.issues) {
        const [field, ...sub] = issuePath(issue);
        const missing = issue.code === 'invalid_type' && issue.input === undefined;
        const message = describeIssue(issue, missing);
        add(typeof field === 'string' ? field : undefined, missing && config === undefined ? message : missing ? `${message}; set it here or in ${config!.file}` : message, sub);
      }
      continue;
    }
    const spec: AgentSpec = parsed.data;
    // Runs that report no cost are estimated at this price (absent: no known price, no estimate).
    const price = priceFor(spec.model, prices);
    if (price) spec.price = price;

    // Structured answers come from one run: the loop could only keep the last one.
    if (ANSWER_FORMATS[role] && spec.max_iterations > 1) {
      add('max_iterations', `must be 1 for the ${role}: it answers once, with <${ANSWER_FORMATS[role]!.tag}>…</${ANSWER_FORMATS[role]!.tag}>`);
    }

    // The provider's command line (permission modes, model format, quoting of `command`).
    if (spec.provider !== 'script') {
      try {
        agentProvider(spec.provider).buildCommand({ role, spec, prompt: '', cwd: objective.dir, env: {} });
      } catch (e) {
        const message = (e as Error).message;
        const field = /permission_mode/.test(message) ? 'permission_mode' : /model/.test(message) ? 'model' : 'command';
        add(field, message);
      }
    }

    // The prompt template.
    for (const key of Object.keys(spec.args)) {
      if ((BUILTIN_KEYS as string[]).includes(key)) add('args', `"${key}" is a built-in argument; choose another name`, [key]);
    }
    if (spec.prompt_file !== undefined) {
      const src = origin('prompt_file');
      const templateFile = path.resolve(src.dir, spec.prompt_file);
      try {
        spec.prompt = await fs.readFile(templateFile, 'utf8');
        spec.prompt_file = templateFile;
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        add('prompt_file', `cannot read ${templateFile}: ${code === 'ENOENT' ? 'no such file' : code === 'EISDIR' ? 'it is a directory' : (e as Error).message}`);
        continue;
      }
      if (!spec.prompt.trim()) add('prompt_file', `${templateFile} is empty`);
    }
    if (spec.prompt !== undefined) {
      const checked = checkTemplate(spec.prompt, spec.args);
      for (const p of checked.problems) {
        if (spec.prompt_file !== undefined) problems.push({ file: spec.prompt_file, line: p.line, column: p.column, message: p.message });
        else add('prompt', `line ${p.line} of the prompt: ${p.message}`);
      }
      for (const key of checked.unusedArgs) {
        const src = origin('args');
        const segments = ['agents', role, 'args'];
        if (!alreadyReported('args')) {
          problems.push({ file: src.file, ...src.locateKey(segments, key), field: formatFieldPath([...segments, key]), message: `unknown key "${key}": the prompt never uses {{${key}}}` });
        }
      }
    } else if (Object.keys(spec.args).length > 0) {
      add('args', 'args fill a prompt template\'s {{KEY}}s; set "prompt" or "prompt_file" too');
    }
    agents[role] = spec;
  }
  return { agents, problems };
}
