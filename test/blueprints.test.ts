import { describe, it, expect, beforeAll, afterAll, afterEach } from 'vitest';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  BlueprintError,
  BlueprintUseError,
  SHIPPED_BLUEPRINTS_DIR,
  USER_DIR_ENV,
  UnknownBlueprintError,
  blueprintSearchPath,
  formatBlueprintProblem,
  loadBlueprintFile,
  loadBlueprints,
  resolveBlueprint,
  resolveBlueprintForUse,
  type BlueprintProblem,
} from '../blueprints/loader';
import { validateBlueprint, validateBlueprintUse, findRefCycles } from '../blueprints/validate';
import { BLUEPRINT_JSON_SCHEMA_FILE, blueprintJsonSchemaText } from '../blueprints/json-schema';
import type { Blueprint } from '../core/blueprint-schema';

const BAD_DIR = path.join(__dirname, 'fixtures', 'blueprints', 'bad');
const STANDARD = path.join(SHIPPED_BLUEPRINTS_DIR, 'standard.yaml');
const BUILD_REVIEW = path.join(SHIPPED_BLUEPRINTS_DIR, 'build-review.yaml');

const lines = (...ls: string[]) => ls.join('\n') + '\n';

let root: string;
let counter = 0;

beforeAll(async () => {
  root = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-blueprints-')));
});

afterAll(async () => {
  if (root) await fs.rm(root, { recursive: true, force: true });
});

/** A fresh project (with `.slipway/blueprints`) and user folder, holding the given files. */
async function makeDirs(files: { project?: Record<string, string>; user?: Record<string, string> } = {}) {
  const base = path.join(root, `case-${++counter}`);
  const projectDir = path.join(base, 'repo');
  const userDir = path.join(base, 'user-blueprints');
  const projectBlueprints = path.join(projectDir, '.slipway', 'blueprints');
  await fs.mkdir(projectDir, { recursive: true });
  if (files.project) {
    await fs.mkdir(projectBlueprints, { recursive: true });
    for (const [name, text] of Object.entries(files.project)) await fs.writeFile(path.join(projectBlueprints, name), text);
  }
  if (files.user) {
    await fs.mkdir(userDir, { recursive: true });
    for (const [name, text] of Object.entries(files.user)) await fs.writeFile(path.join(userDir, name), text);
  }
  return { projectDir, userDir, projectBlueprints };
}

async function rejection(promise: Promise<unknown>): Promise<BlueprintError> {
  try {
    await promise;
  } catch (err) {
    expect(err).toBeInstanceOf(BlueprintError);
    return err as BlueprintError;
  }
  throw new Error('expected a BlueprintError, but it loaded');
}

/** A stream blueprint; `description` tells the copies apart. */
const streamBlueprint = (id: string, description: string, profile = 'self_healing') =>
  lines(
    `id: ${id}`,
    'level: stream',
    `description: ${description}`,
    'retry:',
    `  profile: ${profile}`,
    'steps:',
    '  - id: build',
    '    type: agent',
    '    role: builder',
    '    next: ready',
    '  - id: ready',
    '    type: deterministic',
    '    action: signal_merge_ready',
  );

describe('shipped blueprints', () => {
  it('standard and build-review load and pass every check', async () => {
    const standard = await loadBlueprintFile(STANDARD);
    const buildReview = await loadBlueprintFile(BUILD_REVIEW);
    expect(standard).toMatchObject({ id: 'standard', level: 'objective', retry: { profile: 'balanced' } });
    expect(buildReview).toMatchObject({ id: 'build-review', level: 'stream', retry: { profile: 'self_healing' } });
    expect(standard.steps.map((s) => s.id)).toEqual(['plan', 'approve', 'execute', 'merge', 'complete']);
    expect(buildReview.steps.map((s) => s.id)).toEqual(['build', 'gates', 'review', 'merge_ready']);
    const lookup = (id: string) => ({ standard, 'build-review': buildReview })[id];
    const known = ['standard', 'build-review'];
    expect(validateBlueprint(standard, { knownBlueprintIds: known, lookup })).toEqual([]);
    expect(validateBlueprint(buildReview, { knownBlueprintIds: known, lookup })).toEqual([]);
  });

  it('loadBlueprints finds them when no other folder exists', async () => {
    const { projectDir, userDir } = await makeDirs();
    const map = await loadBlueprints({ projectDir, userDir });
    expect([...map.keys()]).toEqual(['build-review', 'standard']);
    expect(map.get('standard')).toMatchObject({ file: STANDARD, source: 'shipped' });
    expect(map.get('build-review')).toMatchObject({ file: BUILD_REVIEW, source: 'shipped' });
  });

  it('resolveBlueprint returns the root and every blueprint it references, as plain data', async () => {
    const { projectDir, userDir } = await makeDirs();
    const map = await loadBlueprints({ projectDir, userDir });
    const resolved = resolveBlueprint(map, 'standard');
    expect(resolved.root.id).toBe('standard');
    expect(Object.keys(resolved.refs)).toEqual(['build-review']);
    expect(resolved.refs['build-review']).toEqual(map.get('build-review')!.blueprint);
    // Survives a trip through JSON unchanged (workflow input), and is a copy.
    expect(JSON.parse(JSON.stringify(resolved))).toEqual(resolved);
    resolved.root.steps.pop();
    expect(map.get('standard')!.blueprint.steps).toHaveLength(5);
    expect(resolveBlueprint(map, 'build-review')).toEqual({ root: map.get('build-review')!.blueprint, refs: {} });
  });

  it('resolveBlueprint refuses an unknown id, suggesting a near one', async () => {
    const { projectDir, userDir } = await makeDirs();
    const map = await loadBlueprints({ projectDir, userDir });
    expect(() => resolveBlueprint(map, 'standart')).toThrow(UnknownBlueprintError);
    expect(() => resolveBlueprint(map, 'standart')).toThrow(/unknown blueprint "standart" \(did you mean "standard"\?\); known blueprints: build-review, standard/);
  });
});

describe('search path and override by id', () => {
  afterEach(() => {
    delete process.env[USER_DIR_ENV];
  });

  it('project beats user beats shipped', async () => {
    const { projectDir, userDir } = await makeDirs({
      user: { 'build-review.yaml': streamBlueprint('build-review', 'from the user folder', 'strict'), 'solo.yaml': streamBlueprint('solo', 'user solo') },
      project: { 'br.yml': streamBlueprint('build-review', 'from the project', 'balanced') },
    });
    const map = await loadBlueprints({ projectDir, userDir });
    expect(map.get('build-review')).toMatchObject({
      source: 'project',
      file: path.join(projectDir, '.slipway', 'blueprints', 'br.yml'),
      blueprint: { description: 'from the project', retry: { profile: 'balanced' } },
    });
    expect(map.get('solo')).toMatchObject({ source: 'user', blueprint: { description: 'user solo' } });
    expect(map.get('standard')!.source).toBe('shipped');
    // standard's ref resolves to the override.
    expect(resolveBlueprint(map, 'standard').refs['build-review']!.description).toBe('from the project');

    // Without the project folder, the user's copy wins over the shipped one.
    const userOnly = await loadBlueprints({ userDir });
    expect(userOnly.get('build-review')).toMatchObject({ source: 'user', blueprint: { description: 'from the user folder', retry: { profile: 'strict' } } });
  });

  it('the user folder comes from $SLIPWAY_BLUEPRINTS_USER_DIR, else ~/.config/slipway/blueprints', async () => {
    const { userDir } = await makeDirs({ user: { 'build-review.yaml': streamBlueprint('build-review', 'via the environment') } });
    process.env[USER_DIR_ENV] = userDir;
    expect(blueprintSearchPath()).toEqual([
      { source: 'shipped', dir: SHIPPED_BLUEPRINTS_DIR },
      { source: 'user', dir: userDir },
    ]);
    const map = await loadBlueprints();
    expect(map.get('build-review')!.blueprint.description).toBe('via the environment');
    delete process.env[USER_DIR_ENV];
    expect(blueprintSearchPath({ projectDir: '/repo' })).toEqual([
      { source: 'shipped', dir: SHIPPED_BLUEPRINTS_DIR },
      { source: 'user', dir: path.join(os.homedir(), '.config', 'slipway', 'blueprints') },
      { source: 'project', dir: path.join('/repo', '.slipway', 'blueprints') },
    ]);
  });

  it('a custom project blueprint with a new id loads, and refs between new blueprints resolve', async () => {
    const { projectDir, userDir } = await makeDirs({
      project: {
        'quick.yaml': streamBlueprint('quick', 'build and hand over, no gates'),
        'quick-objective.yaml': lines(
          'id: quick-objective',
          'level: objective',
          'steps:',
          '  - id: execute',
          '    type: blueprint_ref',
          '    ref: quick',
          '    foreach: work_item',
          '    next: merge',
          '  - id: merge',
          '    type: deterministic',
          '    action: merge_queue',
        ),
      },
    });
    const map = await loadBlueprints({ projectDir, userDir });
    expect(map.get('quick')).toMatchObject({ source: 'project', blueprint: { level: 'stream', max_fix_iterations: 3, on_exhausted: 'ask_human' } });
    const resolved = resolveBlueprint(map, 'quick-objective');
    expect(resolved.root.id).toBe('quick-objective');
    expect(Object.keys(resolved.refs)).toEqual(['quick']);
  });

  it('a bad file anywhere fails the load and is named, even when overridden', async () => {
    const { projectDir, userDir } = await makeDirs({
      user: { 'build-review.yaml': lines('id: build-review', 'level: stream', 'steps: []') },
      project: { 'build-review.yaml': streamBlueprint('build-review', 'fine') },
    });
    const err = await rejection(loadBlueprints({ projectDir, userDir }));
    expect(err.problems).toEqual([{ file: path.join(userDir, 'build-review.yaml'), line: 3, column: 8, field: 'steps', message: 'must list at least 1 item' }]);
    expect(err.message).toBe(`${path.join(userDir, 'build-review.yaml')}:3:8: steps: must list at least 1 item`);
  });

  it('problems between blueprints point at the ref, in the file that has it', async () => {
    // The project turns build-review into an objective blueprint: the shipped standard's
    // foreach ref (standard.yaml line 23) no longer names a stream blueprint.
    const { projectDir, userDir } = await makeDirs({
      project: {
        'build-review.yaml': lines(
          'id: build-review',
          'level: objective',
          'steps:',
          '  - id: done',
          '    type: deterministic',
          '    action: mark_complete',
        ),
      },
    });
    const err = await rejection(loadBlueprints({ projectDir, userDir }));
    expect(err.problems).toEqual([
      {
        file: STANDARD,
        line: 23,
        column: 10,
        step: 'execute',
        field: 'ref',
        message: '"build-review" is an objective blueprint; foreach runs one stream per work item, so it must name a stream blueprint',
      },
    ]);
  });

  it('reports a cycle of refs between blueprints once, at the ref that closes it', async () => {
    const nesting = (id: string, other: string) =>
      lines(
        `id: ${id}`,
        'level: stream',
        'steps:',
        '  - id: build',
        '    type: agent',
        '    role: builder',
        '    next: nested',
        '  - id: nested',
        '    type: blueprint_ref',
        `    ref: ${other}`,
        '    next: ready',
        '  - id: ready',
        '    type: deterministic',
        '    action: signal_merge_ready',
      );
    const { projectDir, userDir, projectBlueprints } = await makeDirs({ project: { 'a.yaml': nesting('alpha', 'beta'), 'b.yaml': nesting('beta', 'alpha') } });
    const err = await rejection(loadBlueprints({ projectDir, userDir }));
    expect(err.problems).toHaveLength(1);
    expect(err.message).toBe(
      `${path.join(projectBlueprints, 'b.yaml')}:10:10: step nested: ref: "alpha" closes a cycle of blueprint references: alpha -> beta -> alpha; a blueprint cannot contain itself`,
    );
  });

  it('two files with the same id in one folder', async () => {
    const { projectDir, userDir, projectBlueprints } = await makeDirs({
      project: { 'one.yaml': streamBlueprint('twin', 'first'), 'two.yaml': streamBlueprint('twin', 'second') },
    });
    const err = await rejection(loadBlueprints({ projectDir, userDir }));
    expect(err.message).toBe(
      `${path.join(projectBlueprints, 'two.yaml')}:1:5: id: blueprint id "twin" is also used by ${path.join(projectBlueprints, 'one.yaml')} in the same folder; ids must be unique within a folder`,
    );
  });

  it('a user folder path that is a file is an error naming it', async () => {
    const { projectDir } = await makeDirs();
    const file = path.join(projectDir, 'not-a-folder');
    await fs.writeFile(file, 'x');
    const err = await rejection(loadBlueprints({ projectDir, userDir: file }));
    expect(err.message).toBe(`${file}: expected a folder of blueprint files, found a file`);
  });
});

describe('every problem at once', () => {
  it('schema and graph problems together, sorted by line, with step ids', async () => {
    const { projectBlueprints } = await makeDirs({
      project: {
        'many.yaml': lines(
          'id: many', //                               1
          'level: stream', //                          2
          'max_fix_iterations: lots', //               3
          'steps:', //                                 4
          '  - id: build', //                          5
          '    type: agent', //                        6
          '    role: planner', //                      7
          '    next: gates', //                        8
          '  - id: gates', //                          9
          '    type: deterministic', //                10
          '    action: run_quality_gates', //          11
          '    on_fail: biuld', //                     12
          '    retry: { max_attempts: 0 }', //         13
          '    next: ready', //                        14
          '  - id: ready', //                          15
          '    type: deterministic', //                16
          '    action: signal_merge_ready', //         17
          '    optinal: true', //                      18
        ),
      },
    });
    const file = path.join(projectBlueprints, 'many.yaml');
    const err = await rejection(loadBlueprintFile(file));
    expect(err.message.split('\n')).toEqual([
      `${file}:3:21: max_fix_iterations: expected a number, got "lots"`,
      `${file}:7:11: step build: role: agent role "planner" is not allowed in a stream blueprint (it belongs only in objective blueprints)`,
      `${file}:12:14: step gates: on_fail: unknown step "biuld" (did you mean "build"?); steps are: build, gates, ready`,
      `${file}:13:28: step gates: retry.max_attempts: must be at least 1, got 0`,
      `${file}:18:5: step ready: optinal: unknown key "optinal" (did you mean "optional"?); expected one of: id, description, next, on_fail, max_fix_iterations, retry, optional, type, action`,
    ]);
  });

  it('an unreadable file', async () => {
    const file = path.join(root, 'missing.yaml');
    const err = await rejection(loadBlueprintFile(file));
    expect(err.problems).toEqual([{ file, message: 'cannot read the blueprint file: no such file' }]);
  });
});

// ---------------------------------------------------------------------------------------
// Malformed blueprints: one file each, one precise problem each.

interface BadCase {
  line?: number;
  column?: number;
  /** The step the problem is in (id, or `#n` when it has none). */
  step?: string;
  field?: string;
  message: RegExp;
  /** Found only when the other blueprints are known (loadBlueprints), not by loadBlueprintFile alone. */
  betweenBlueprints?: boolean;
  /** How many problems the file has in all (default 1). */
  count?: number;
}

const BAD: Record<string, BadCase> = {
  'unknown-next-step.yaml': { line: 13, column: 11, step: 'gates', field: 'next', message: /^unknown step "merge-ready"; steps are: build, gates, ready$/ },
  'unknown-on-fail-step.yaml': { line: 12, column: 14, step: 'gates', field: 'on_fail', message: /^unknown step "biuld" \(did you mean "build"\?\)/ },
  'unknown-start.yaml': { line: 4, column: 8, field: 'start', message: /^unknown step "compile"; steps are: build, gates, ready$/ },
  'next-only-cycle.yaml': {
    line: 13,
    column: 11,
    step: 'gates',
    field: 'next',
    message: /^"build" closes a loop of next steps \(build -> gates -> build\) with no fix-iteration bound; loops must go back through on_fail/,
  },
  'self-loop.yaml': { line: 13, column: 11, step: 'gates', field: 'next', message: /^"gates" is this step itself, a loop with no fix-iteration bound/ },
  'unknown-action.yaml': { line: 11, column: 13, step: 'gates', field: 'action', message: /^must be one of "run_quality_gates", .*"mark_complete", got "run_tests"$/ },
  'bad-type-max-fix-iterations.yaml': { line: 4, column: 21, field: 'max_fix_iterations', message: /^expected a number, got "three"$/ },
  'unknown-step-type.yaml': { line: 6, column: 11, step: 'build', field: 'type', message: /^must be one of "agent", "deterministic", "human", "blueprint_ref", got "robot"$/ },
  'missing-step-type.yaml': { line: 9, column: 5, step: 'gates', field: 'type', message: /^is required \(one of "agent", "deterministic", "human", "blueprint_ref"\)$/ },
  'missing-step-id.yaml': { line: 9, column: 5, step: '#2', field: 'id', message: /^is required \(a string\)$/ },
  'duplicate-step-ids.yaml': { line: 14, column: 9, step: 'build', field: 'id', message: /^duplicate step id "build" \(step #1 already has it\)/ },
  'unknown-step-key.yaml': { line: 12, column: 5, step: 'gates', field: 'on_fial', message: /^unknown key "on_fial" \(did you mean "on_fail"\?\); expected one of: id, description, next, on_fail/ },
  'unknown-top-level-key.yaml': { line: 4, column: 1, field: 'max_fix_iteration', message: /^unknown key "max_fix_iteration" \(did you mean "max_fix_iterations"\?\)/ },
  'role-not-allowed-at-level.yaml': { line: 7, column: 11, step: 'plan', field: 'role', message: /^agent role "planner" is not allowed in a stream blueprint \(it belongs only in objective blueprints\)$/ },
  'action-not-allowed-at-level.yaml': { line: 15, column: 13, step: 'merge', field: 'action', message: /^action "merge_queue" is not allowed in a stream blueprint \(it belongs only in objective blueprints\)$/ },
  'foreach-at-stream-level.yaml': { line: 12, column: 14, step: 'fan-out', field: 'foreach', message: /^not allowed in a stream blueprint: only an objective blueprint starts one stream per work item$/ },
  'bad-foreach-value.yaml': { line: 8, column: 14, step: 'execute', field: 'foreach', message: /^must be one of "work_item", got "stream"$/ },
  'unknown-ref.yaml': {
    line: 7,
    column: 10,
    step: 'execute',
    field: 'ref',
    message: /^unknown blueprint "build-reveiw" \(did you mean "build-review"\?\); known blueprints: build-review, standard, unknown-ref$/,
    betweenBlueprints: true,
  },
  'foreach-ref-not-stream.yaml': {
    line: 7,
    column: 10,
    step: 'execute',
    field: 'ref',
    message: /^"standard" is an objective blueprint; foreach runs one stream per work item, so it must name a stream blueprint$/,
    betweenBlueprints: true,
  },
  'inline-ref-level-mismatch.yaml': {
    line: 7,
    column: 10,
    step: 'execute',
    field: 'ref',
    message: /^"build-review" is a stream blueprint; without foreach it runs inside this objective blueprint, so it must be an objective blueprint too$/,
    betweenBlueprints: true,
  },
  'self-ref.yaml': { line: 11, column: 10, step: 'again', field: 'ref', message: /^"self-ref" is this blueprint; a blueprint cannot contain itself$/ },
  'bad-on-exhausted.yaml': { line: 15, column: 21, step: 'gates', field: 'retry.on_exhausted', message: /^must be one of "ask_human", "escalate", "fail", got "retry_forever"$/ },
  'bad-retry-profile.yaml': { line: 5, column: 12, field: 'retry.profile', message: /^must be one of "strict", "balanced", "self_healing", got "aggressive"$/ },
  'zero-max-attempts.yaml': { line: 9, column: 21, step: 'build', field: 'retry.max_attempts', message: /^must be at least 1, got 0$/ },
  'negative-max-fix-iterations.yaml': { line: 13, column: 25, step: 'gates', field: 'max_fix_iterations', message: /^must be at least 0, got -1$/ },
  'unreachable-step.yaml': { line: 14, column: 5, step: 'review', message: /^is unreachable: no next or on_fail path leads to it from the start step "build"$/ },
  'stream-without-merge-ready.yaml': { line: 4, column: 1, field: 'steps', message: /^a stream blueprint needs a deterministic step with action signal_merge_ready/ },
  'dispatch-without-merge-queue.yaml': { line: 12, column: 13, step: 'dispatch', field: 'action', message: /^starts streams, but no merge_queue step follows it through next/ },
  'foreach-without-merge-queue.yaml': { line: 8, column: 14, step: 'execute', field: 'foreach', message: /^starts streams, but no merge_queue step follows it through next/ },
  'mark-complete-with-next.yaml': { line: 16, column: 11, step: 'done', field: 'next', message: /^mark_complete ends the blueprint, so no step can follow it; remove next: scout$/ },
  'on-fail-on-mark-complete.yaml': { line: 16, column: 14, step: 'done', field: 'on_fail', message: /^mark_complete never fails, so on_fail: build would never be taken; remove it$/ },
  'empty-steps.yaml': { line: 4, column: 8, field: 'steps', message: /^must list at least 1 item$/ },
  'missing-level.yaml': { line: 2, column: 1, field: 'level', message: /^is required \(one of "objective", "stream"\)$/ },
  'yaml-syntax-error.yaml': { line: 9, column: 9, message: /^YAML syntax error: Nested mappings are not allowed in compact mappings$/, count: 2 },
  'not-a-mapping.yaml': { line: 2, column: 1, message: /^expected a mapping \(key: value pairs\) at the top level, found a list$/ },
  'empty-file.yaml': { message: /^the file is empty; expected a blueprint: a mapping with id, level and steps$/ },
  'bad-step-id.yaml': { line: 5, column: 9, step: '#1', field: 'id', message: /^"Build Step" must be lowercase letters, digits, "_" or "-", starting with a letter$/ },
};

function expectBadCase(err: BlueprintError, file: string, c: BadCase): void {
  expect(err.problems, err.message).toHaveLength(c.count ?? 1);
  const p: BlueprintProblem = err.problems[0]!;
  expect(p.file).toBe(file);
  expect({ line: p.line, column: p.column, step: p.step, field: p.field }).toEqual({ line: c.line, column: c.column, step: c.step, field: c.field });
  expect(p.message).toMatch(c.message);
  const where = c.line === undefined ? file : `${file}:${c.line}:${c.column}`;
  expect(err.message.split('\n')[0]).toBe([where, ...(c.step ? [`step ${c.step}`] : []), ...(c.field ? [c.field] : []), p.message].join(': '));
  expect(formatBlueprintProblem(p)).toBe(err.message.split('\n')[0]);
}

describe('malformed blueprints', () => {
  it('every fixture has a case, and there are at least 20', async () => {
    const files = (await fs.readdir(BAD_DIR)).filter((f) => f.endsWith('.yaml')).sort();
    expect(files).toEqual(Object.keys(BAD).sort());
    expect(files.length).toBeGreaterThanOrEqual(20);
  });

  for (const [name, c] of Object.entries(BAD)) {
    it(name, async () => {
      const fixture = path.join(BAD_DIR, name);
      if (c.betweenBlueprints) {
        // Valid on its own...
        await expect(loadBlueprintFile(fixture)).resolves.toBeDefined();
      } else {
        expectBadCase(await rejection(loadBlueprintFile(fixture)), fixture, c);
      }
      // ...and the same problem from the search path, in a project folder beside the shipped ones.
      const { projectDir, userDir, projectBlueprints } = await makeDirs({ project: { [name]: await fs.readFile(fixture, 'utf8') } });
      expectBadCase(await rejection(loadBlueprints({ projectDir, userDir })), path.join(projectBlueprints, name), c);
    });
  }
});

describe('validateBlueprint (pure)', () => {
  const objective = (ref: string): Blueprint => ({
    id: 'obj',
    level: 'objective',
    retry: { profile: 'balanced' },
    max_fix_iterations: 3,
    on_exhausted: 'ask_human',
    steps: [
      { id: 'execute', type: 'blueprint_ref', ref, foreach: 'work_item', next: 'merge' },
      { id: 'merge', type: 'deterministic', action: 'merge_queue' },
    ],
  });

  it('returns issues with a path and the step id', () => {
    expect(validateBlueprint(objective('nope'), { knownBlueprintIds: ['obj', 'build-review'] })).toEqual([
      {
        path: ['steps', 0, 'ref'],
        stepId: 'execute',
        message: 'unknown blueprint "nope"; known blueprints: build-review, obj',
      },
    ]);
    // Without a set of known ids, refs are not checked.
    expect(validateBlueprint(objective('nope'))).toEqual([]);
  });

  it('findRefCycles finds a cycle once', () => {
    const inline = (id: string, ref: string): Blueprint => ({
      ...objective(ref),
      id,
      steps: [
        { id: 'nest', type: 'blueprint_ref', ref, next: 'done' },
        { id: 'done', type: 'deterministic', action: 'mark_complete' },
      ],
    });
    const cycles = findRefCycles(new Map([['a', inline('a', 'b')], ['b', inline('b', 'c')], ['c', inline('c', 'a')]]));
    expect(cycles).toHaveLength(1);
    expect(cycles[0]).toMatchObject({ blueprintId: 'c', issue: { path: ['steps', 0, 'ref'], stepId: 'nest' } });
    expect(cycles[0]!.issue.message).toContain('a -> b -> c -> a');
  });
});

describe('JSON Schema', () => {
  it('the committed blueprints/blueprint.schema.json is up to date (npx tsx scripts/blueprint-json-schema.ts)', async () => {
    const committed = await fs.readFile(BLUEPRINT_JSON_SCHEMA_FILE, 'utf8');
    expect(committed).toBe(blueprintJsonSchemaText());
  });

  it('is input-shaped: fields with defaults are optional', () => {
    const schema = JSON.parse(blueprintJsonSchemaText()) as { required: string[]; properties: Record<string, unknown> };
    expect(schema.required).toEqual(['id', 'level', 'steps']);
    expect(Object.keys(schema.properties)).toEqual(expect.arrayContaining(['retry', 'max_fix_iterations', 'on_exhausted', 'start']));
  });
});

describe('validateBlueprintUse (pure): the level a blueprint runs at', () => {
  it('the shipped blueprints fit where they are used; swapped, every step that cannot run is named', async () => {
    const map = await loadBlueprints((await makeDirs()));
    expect(validateBlueprintUse(resolveBlueprint(map, 'standard'), 'objective')).toEqual([]);
    expect(validateBlueprintUse(resolveBlueprint(map, 'build-review'), 'stream')).toEqual([]);
    const swapped = validateBlueprintUse(resolveBlueprint(map, 'build-review'), 'objective');
    expect(swapped.map((u) => [u.blueprintId, u.issue.stepId, u.issue.path.join('.')])).toEqual([
      ['build-review', undefined, 'level'],
      ['build-review', 'build', 'steps.0.role'],
      ['build-review', 'review', 'steps.2.role'],
      ['build-review', 'merge_ready', 'steps.3.action'],
    ]);
    const asStream = validateBlueprintUse(resolveBlueprint(map, 'standard'), 'stream');
    expect(asStream[0]!.issue.message).toBe('"standard" is an objective blueprint, but it is used as a stream blueprint, which runs at stream level');
    expect(asStream.some((u) => u.issue.stepId === 'plan' && /a planner step cannot run at stream level/.test(u.issue.message))).toBe(true);
  });

  it('resolveBlueprintForUse throws a BlueprintUseError with positions in the file', async () => {
    const map = await loadBlueprints(await makeDirs());
    const err = await resolveBlueprintForUse(map, 'build-review', 'objective').catch((e) => e);
    expect(err).toBeInstanceOf(BlueprintUseError);
    expect(err.wrongLevel).toMatchObject({ id: 'build-review', file: BUILD_REVIEW, level: 'stream', expected: 'objective', candidates: ['standard'] });
    expect(err.problems[0]).toMatchObject({ file: BUILD_REVIEW, line: 3, column: 8, field: 'level' });
    expect(err.problems[1]).toMatchObject({ file: BUILD_REVIEW, line: 12, column: 11, step: 'build', field: 'role' });
    await expect(resolveBlueprintForUse(map, 'standard', 'objective')).resolves.toMatchObject({ root: { id: 'standard' } });
  });
});
