/**
 * Graph and semantic checks of a blueprint, beyond what the zod schema can say: step
 * references, loops, reachability, which actions and roles each level allows, references
 * between blueprints.
 *
 * Pure (no I/O): every issue carries the path of the offending node in the blueprint
 * document (`['steps', 2, 'next']`), so the loader can point at its line and column.
 */
import type { AgentRole } from '../core/states';
import {
  ACTIONS,
  AgentStepSchema,
  BlueprintRefStepSchema,
  BlueprintSchema,
  DeterministicStepSchema,
  ROLE_LEVELS,
  StepSchema,
  type ActionName,
  type Blueprint,
  type BlueprintLevel,
  type StepType,
} from '../core/blueprint-schema';

export type BlueprintPath = (string | number)[];

/** The stream blueprint a `dispatch_streams` step runs for each work item. */
export const DISPATCH_STREAMS_BLUEPRINT = 'build-review';

export interface BlueprintIssue {
  /** Where in the blueprint document, e.g. `['steps', 2, 'next']`; `[]` is the whole blueprint. */
  path: BlueprintPath;
  message: string;
  /** The id of the step the problem is in, when it is inside a step that has a valid id. */
  stepId?: string;
}

export interface ValidateOptions {
  /** Ids of every blueprint that exists; a `ref` to another id is unknown. */
  knownBlueprintIds?: Iterable<string>;
  /**
   * The blueprint a `ref` names, for level checks and for what nested blueprints contain.
   * Without `knownBlueprintIds`, a ref this returns nothing for is unknown.
   */
  lookup?: (id: string) => Blueprint | undefined;
}

/** Every graph and semantic problem of a blueprint that passed the schema. */
export function validateBlueprint(bp: Blueprint, options: ValidateOptions = {}): BlueprintIssue[] {
  return checkView(viewOf(bp), options);
}

/**
 * The same checks on a document that failed the schema, so they can be reported together
 * with its schema problems. Uses only the parts that are valid, and leaves out the checks
 * that need the whole blueprint (reachability, required steps), which could be wrong.
 */
export function validatePartialBlueprint(raw: unknown, options: ValidateOptions = {}): BlueprintIssue[] {
  if (!isRecord(raw)) return [];
  const steps = Array.isArray(raw.steps) ? raw.steps : [];
  const view: BlueprintView = {
    id: valid(BlueprintSchema.shape.id, raw.id),
    level: valid(BlueprintSchema.shape.level, raw.level),
    start: valid(BlueprintSchema.shape.id, raw.start),
    steps: steps.map((s, index) => salvageStep(s, index)),
    complete: false,
  };
  return checkView(view, options);
}

/**
 * References between blueprints that go round in a circle (`a` nests `b`, `b` nests `a`).
 * One entry per cycle found, at the ref that closes it. A blueprint naming itself is left
 * to `validateBlueprint`.
 */
export function findRefCycles(blueprints: ReadonlyMap<string, Blueprint>): { blueprintId: string; issue: BlueprintIssue }[] {
  const found: { blueprintId: string; issue: BlueprintIssue }[] = [];
  const state = new Map<string, 'active' | 'done'>();
  const trail: string[] = [];
  const visit = (id: string) => {
    state.set(id, 'active');
    trail.push(id);
    const bp = blueprints.get(id)!;
    bp.steps.forEach((step, index) => {
      if (step.type !== 'blueprint_ref' || step.ref === id || !blueprints.has(step.ref)) return;
      const seen = state.get(step.ref);
      if (seen === 'active') {
        const cycle = [...trail.slice(trail.indexOf(step.ref)), step.ref];
        found.push({
          blueprintId: id,
          issue: {
            path: ['steps', index, 'ref'],
            stepId: step.id,
            message: `"${step.ref}" closes a cycle of blueprint references: ${cycle.join(' -> ')}; a blueprint cannot contain itself`,
          },
        });
      } else if (seen === undefined) visit(step.ref);
    });
    trail.pop();
    state.set(id, 'done');
  };
  for (const id of [...blueprints.keys()].sort()) if (!state.has(id)) visit(id);
  return found;
}

/** The closest of `candidates` to a misspelt `name`, if one is close enough to suggest. */
export function didYouMean(name: string, candidates: Iterable<string>): string | undefined {
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const c of candidates) {
    const d = editDistance(name, c);
    if (d < bestDistance) {
      best = c;
      bestDistance = d;
    }
  }
  return best !== undefined && bestDistance > 0 && bestDistance <= Math.max(1, Math.floor(name.length / 3)) ? best : undefined;
}

// ---------------------------------------------------------------------------------------
// A view of a blueprint: the whole of a valid one, or the valid parts of an invalid one

interface StepView {
  index: number;
  id?: string;
  type?: StepType;
  action?: ActionName;
  role?: AgentRole;
  ref?: string;
  foreach?: boolean;
  next?: string;
  on_fail?: string;
}

interface BlueprintView {
  id?: string;
  level?: BlueprintLevel;
  start?: string;
  steps: StepView[];
  /** The document passed the schema: every step and edge is known. */
  complete: boolean;
}

function viewOf(bp: Blueprint): BlueprintView {
  return {
    id: bp.id,
    level: bp.level,
    start: bp.start,
    steps: bp.steps.map((s, index) => ({
      index,
      id: s.id,
      type: s.type,
      action: s.type === 'deterministic' ? s.action : undefined,
      role: s.type === 'agent' ? s.role : undefined,
      ref: s.type === 'blueprint_ref' ? s.ref : undefined,
      foreach: s.type === 'blueprint_ref' && s.foreach !== undefined,
      next: s.next,
      on_fail: s.on_fail,
    })),
    complete: true,
  };
}

const STEP_TYPES: readonly string[] = StepSchema.options.map((o) => o.shape.type.value);
const stepIdSchema = BlueprintSchema.shape.id;

function salvageStep(raw: unknown, index: number): StepView {
  if (!isRecord(raw)) return { index };
  const parsed = StepSchema.safeParse(raw);
  if (parsed.success) {
    const s = parsed.data;
    return {
      index,
      id: s.id,
      type: s.type,
      action: s.type === 'deterministic' ? s.action : undefined,
      role: s.type === 'agent' ? s.role : undefined,
      ref: s.type === 'blueprint_ref' ? s.ref : undefined,
      foreach: s.type === 'blueprint_ref' && s.foreach !== undefined,
      next: s.next,
      on_fail: s.on_fail,
    };
  }
  const type = typeof raw.type === 'string' && STEP_TYPES.includes(raw.type) ? (raw.type as StepType) : undefined;
  return {
    index,
    id: valid(stepIdSchema, raw.id),
    type,
    action: type === 'deterministic' ? valid(DeterministicStepSchema.shape.action, raw.action) : undefined,
    role: type === 'agent' ? valid(AgentStepSchema.shape.role, raw.role) : undefined,
    ref: type === 'blueprint_ref' ? valid(BlueprintRefStepSchema.shape.ref, raw.ref) : undefined,
    foreach: type === 'blueprint_ref' && valid(BlueprintRefStepSchema.shape.foreach, raw.foreach) !== undefined,
    next: valid(stepIdSchema, raw.next),
    on_fail: valid(stepIdSchema, raw.on_fail),
  };
}

// ---------------------------------------------------------------------------------------
// Checks

function checkView(bp: BlueprintView, options: ValidateOptions): BlueprintIssue[] {
  const issues: BlueprintIssue[] = [];
  const at = (step: StepView, field: string | undefined, message: string) =>
    issues.push({ path: field === undefined ? ['steps', step.index] : ['steps', step.index, field], message, ...(step.id ? { stepId: step.id } : {}) });

  // Step ids: the first step with an id owns it.
  const byId = new Map<string, StepView>();
  const duplicates = new Set<StepView>();
  for (const step of bp.steps) {
    if (step.id === undefined) continue;
    const first = byId.get(step.id);
    if (first) {
      duplicates.add(step);
      at(step, 'id', `duplicate step id "${step.id}" (step #${first.index + 1} already has it); step ids must be unique`);
    } else byId.set(step.id, step);
  }
  const ids = [...byId.keys()];
  const unknownStep = (name: string) => {
    const guess = didYouMean(name, ids);
    return `unknown step "${name}"${guess ? ` (did you mean "${guess}"?)` : ''}; steps are: ${ids.join(', ')}`;
  };

  // Edges to steps that do not exist (unless a step has no valid id: it may be the one meant).
  const allIdsKnown = bp.steps.every((s) => s.id !== undefined);
  if (allIdsKnown && bp.start !== undefined && !byId.has(bp.start)) issues.push({ path: ['start'], message: unknownStep(bp.start) });
  let dangling = bp.start !== undefined && !byId.has(bp.start);
  for (const step of bp.steps) {
    for (const field of ['next', 'on_fail'] as const) {
      const to = step[field];
      if (to === undefined || byId.has(to)) continue;
      dangling = true;
      if (allIdsKnown) at(step, field, unknownStep(to));
    }
  }

  // What each level allows.
  const level = bp.level;
  const article = (word: string) => (/^[aeiou]/.test(word) ? `an ${word}` : `a ${word}`);
  const otherLevels = (allowed: readonly BlueprintLevel[]) =>
    allowed.length === 1 ? `only in ${allowed[0]} blueprints` : `only in ${allowed.join(' and ')} blueprints`;
  if (level !== undefined) {
    for (const step of bp.steps) {
      if (step.action !== undefined && !(ACTIONS[step.action].levels as readonly BlueprintLevel[]).includes(level)) {
        at(step, 'action', `action "${step.action}" is not allowed in ${article(level)} blueprint (it belongs ${otherLevels(ACTIONS[step.action].levels)})`);
      }
      if (step.role !== undefined && !ROLE_LEVELS[step.role].includes(level)) {
        at(step, 'role', `agent role "${step.role}" is not allowed in ${article(level)} blueprint (it belongs ${otherLevels(ROLE_LEVELS[step.role])})`);
      }
      if (step.foreach && level === 'stream') {
        at(step, 'foreach', 'not allowed in a stream blueprint: only an objective blueprint starts one stream per work item');
      }
    }
  }

  // References to other blueprints.
  const known = options.knownBlueprintIds !== undefined ? new Set(options.knownBlueprintIds) : undefined;
  for (const step of bp.steps) {
    if (step.ref === undefined) continue;
    if (bp.id !== undefined && step.ref === bp.id) {
      at(step, 'ref', `"${step.ref}" is this blueprint; a blueprint cannot contain itself`);
      continue;
    }
    const target = options.lookup?.(step.ref);
    const isUnknown = known !== undefined ? !known.has(step.ref) : options.lookup !== undefined && target === undefined;
    if (isUnknown) {
      const names = known !== undefined ? [...known].sort() : [];
      const guess = didYouMean(step.ref, names);
      at(step, 'ref', `unknown blueprint "${step.ref}"${guess ? ` (did you mean "${guess}"?)` : ''}${names.length ? `; known blueprints: ${names.join(', ')}` : ''}`);
      continue;
    }
    if (target === undefined) continue;
    if (step.foreach && target.level !== 'stream') {
      at(step, 'ref', `"${step.ref}" is ${article(target.level)} blueprint; foreach runs one stream per work item, so it must name a stream blueprint`);
    } else if (!step.foreach && level !== undefined && target.level !== level) {
      at(step, 'ref', `"${step.ref}" is ${article(target.level)} blueprint; without foreach it runs inside this ${level} blueprint, so it must be ${article(level)} blueprint too`);
    }
  }

  // dispatch_streams runs the build-review blueprint for each work item.
  for (const step of bp.steps) {
    if (step.action !== 'dispatch_streams' || level !== 'objective') continue;
    const target = options.lookup?.(DISPATCH_STREAMS_BLUEPRINT);
    const isUnknown = known !== undefined ? !known.has(DISPATCH_STREAMS_BLUEPRINT) : options.lookup !== undefined && target === undefined;
    if (isUnknown) at(step, 'action', `dispatch_streams runs the "${DISPATCH_STREAMS_BLUEPRINT}" blueprint for each work item, and there is none`);
    else if (target && target.level !== 'stream') {
      at(step, 'action', `dispatch_streams runs "${DISPATCH_STREAMS_BLUEPRINT}" for each work item, but it is ${article(target.level)} blueprint; it must be a stream blueprint`);
    }
  }

  // mark_complete ends the run: no step after it, and it never fails.
  for (const step of bp.steps) {
    if (step.action !== 'mark_complete') continue;
    if (step.next !== undefined) at(step, 'next', `mark_complete ends the blueprint, so no step can follow it; remove next: ${step.next}`);
    if (step.on_fail !== undefined) at(step, 'on_fail', `mark_complete never fails, so on_fail: ${step.on_fail} would never be taken; remove it`);
  }

  // Loops made of next edges alone have no fix-iteration bound.
  const reported = new Set<StepView>();
  for (const first of bp.steps) {
    if (duplicates.has(first) || reported.has(first)) continue;
    const path: StepView[] = [];
    let cur: StepView | undefined = first;
    while (cur && !path.includes(cur) && !reported.has(cur)) {
      path.push(cur);
      cur = cur.next !== undefined ? byId.get(cur.next) : undefined;
    }
    for (const s of path) reported.add(s);
    if (!cur || !path.includes(cur)) continue;
    const cycle = path.slice(path.indexOf(cur));
    // Report at the edge that goes back up the file, starting from the cycle's first step.
    const start = cycle.reduce((a, b) => (b.index < a.index ? b : a));
    const ordered = [...cycle.slice(cycle.indexOf(start)), ...cycle.slice(0, cycle.indexOf(start))];
    const closing = ordered.find((s) => byId.get(s.next!)!.index <= s.index) ?? ordered[ordered.length - 1];
    const names = [...ordered.map((s) => s.id!), start.id!].join(' -> ');
    at(
      closing,
      'next',
      cycle.length === 1
        ? `"${closing.next}" is this step itself, a loop with no fix-iteration bound; send work back with on_fail instead, which max_fix_iterations bounds`
        : `"${closing.next}" closes a loop of next steps (${names}) with no fix-iteration bound; loops must go back through on_fail, which max_fix_iterations bounds`,
    );
  }

  // The rest needs the whole blueprint.
  if (!bp.complete || bp.steps.length === 0) return issues;

  // Reachability from the start step (when every edge leads somewhere: a misspelt next
  // already says why the steps after it look unreachable).
  const startStep = bp.start !== undefined ? byId.get(bp.start) : bp.steps[0];
  if (startStep && !dangling) {
    const seen = new Set<StepView>([startStep]);
    const queue = [startStep];
    while (queue.length > 0) {
      const s = queue.shift()!;
      for (const to of [s.next, s.on_fail]) {
        const t = to !== undefined ? byId.get(to) : undefined;
        if (t && !seen.has(t)) {
          seen.add(t);
          queue.push(t);
        }
      }
    }
    for (const step of bp.steps) {
      if (seen.has(step) || duplicates.has(step)) continue;
      at(step, undefined, `is unreachable: no next or on_fail path leads to it from the start step "${startStep.id}"`);
    }
  }

  // Steps a level needs.
  const contains = (action: ActionName) => (step: StepView) => stepContains(step, action, options.lookup, new Set(bp.id ? [bp.id] : []));
  if (level === 'stream') {
    const results = bp.steps.map(contains('signal_merge_ready'));
    if (!results.includes(true) && !results.includes('unknown')) {
      issues.push({
        path: ['steps'],
        message: 'a stream blueprint needs a deterministic step with action signal_merge_ready; without it the stream never reaches the merge queue',
      });
    }
  }
  if (level === 'objective') {
    for (const step of bp.steps) {
      const dispatches = step.foreach === true || step.action === 'dispatch_streams';
      if (!dispatches || duplicates.has(step)) continue;
      // Follow the success path after the step.
      const after: StepView[] = [];
      let cur = step.next !== undefined ? byId.get(step.next) : undefined;
      while (cur && !after.includes(cur) && cur !== step) {
        after.push(cur);
        cur = cur.next !== undefined ? byId.get(cur.next) : undefined;
      }
      const results = after.map(contains('merge_queue'));
      if (results.includes(true) || results.includes('unknown')) continue;
      at(
        step,
        step.foreach ? 'foreach' : 'action',
        'starts streams, but no merge_queue step follows it through next; their work would never be merged (add a deterministic step with action merge_queue after it)',
      );
    }
  }
  return issues;
}

/** Whether a step is, or (through a blueprint it nests inline) contains, a deterministic `action`. */
function stepContains(
  step: StepView,
  action: ActionName,
  lookup: ValidateOptions['lookup'],
  visiting: Set<string>,
): boolean | 'unknown' {
  if (step.action === action) return true;
  if (step.ref === undefined || step.foreach) return false;
  if (!lookup) return 'unknown';
  if (visiting.has(step.ref)) return false;
  const target = lookup(step.ref);
  if (!target) return false;
  const inner = new Set(visiting).add(step.ref);
  const results = viewOf(target).steps.map((s) => stepContains(s, action, lookup, inner));
  return results.includes(true) ? true : results.includes('unknown') ? 'unknown' : false;
}

// ---------------------------------------------------------------------------------------

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

function valid<T>(schema: { safeParse(v: unknown): { success: true; data: T } | { success: false } }, value: unknown): T | undefined {
  if (value === undefined) return undefined;
  const r = schema.safeParse(value);
  return r.success ? r.data : undefined;
}

/** Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`. */
function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i]![j] = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i]![j] = Math.min(d[i]![j]!, d[i - 2]![j - 2]! + 1);
    }
  }
  return d[a.length]![b.length]!;
}

// ---------------------------------------------------------------------------------------
// Where a blueprint is used

export interface UseIssue {
  /** The blueprint the problem is in. */
  blueprintId: string;
  issue: BlueprintIssue;
}

/**
 * What the workflows would refuse at run time, checked on a resolved blueprint before anything
 * starts: the level it runs at (an objective's blueprint runs in the objective workflow; the
 * blueprints its `blueprint_ref` and `dispatch_streams` steps name run in a stream workflow for
 * each work item), and the steps each interpreter can run there. The loader checks each file
 * against its own `level`; this checks it against where it is used.
 */
export function validateBlueprintUse(resolved: { root: Blueprint; refs: Record<string, Blueprint> }, level: BlueprintLevel): UseIssue[] {
  const issues: UseIssue[] = [];
  const checked = new Set<string>();
  const check = (bp: Blueprint, at: BlueprintLevel, usedAs: string) => {
    if (checked.has(`${at}:${bp.id}`)) return;
    checked.add(`${at}:${bp.id}`);
    const add = (path: BlueprintPath, message: string, stepId?: string) => issues.push({ blueprintId: bp.id, issue: { path, message, ...(stepId ? { stepId } : {}) } });
    if (bp.level !== at) add(['level'], `"${bp.id}" is ${article(bp.level)} blueprint, but it is used as ${usedAs}, which runs at ${at} level`);
    bp.steps.forEach((step, index) => {
      const where = ['steps', index];
      if (step.type === 'agent' && !ROLE_LEVELS[step.role].includes(at)) {
        add([...where, 'role'], `a ${step.role} step cannot run at ${at} level (${usedAs})`, step.id);
      } else if (step.type === 'deterministic' && !(ACTIONS[step.action].levels as readonly BlueprintLevel[]).includes(at)) {
        add([...where, 'action'], `action "${step.action}" cannot run at ${at} level (${usedAs})`, step.id);
      } else if (step.type === 'blueprint_ref' && at === 'stream') {
        add(where, `a stream workflow cannot run a nested blueprint ("${step.ref}"); put its steps in this blueprint (${usedAs})`, step.id);
      }
      if (at !== 'objective') return;
      // The objective workflow runs a blueprint_ref, with or without foreach, for each work item.
      const streamRef = step.type === 'blueprint_ref' ? step.ref : step.type === 'deterministic' && step.action === 'dispatch_streams' ? DISPATCH_STREAMS_BLUEPRINT : undefined;
      const target = streamRef === undefined ? undefined : streamRef === bp.id ? bp : resolved.refs[streamRef];
      if (target) check(target, 'stream', `the stream blueprint of step ${step.id} in "${bp.id}"`);
    });
  };
  check(resolved.root, level, level === 'objective' ? "an objective's blueprint" : 'a stream blueprint');
  return issues;
}

function article(word: string): string {
  return /^[aeiou]/.test(word) ? `an ${word}` : `a ${word}`;
}
