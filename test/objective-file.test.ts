import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { execFileSync } from 'node:child_process';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadObjectiveFile, ObjectiveFileError, type ObjectiveFileProblem } from '../config/objective-file';
import { ID_PATTERN } from '../core/ids';
import { ITERATION_CAPS } from '../core/objective-schema';
import { SHIPPED_BLUEPRINTS_DIR } from '../blueprints/loader';

function git(dir: string, ...args: string[]): string {
  return execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: dir, stdio: 'pipe' }).toString().trim();
}

async function makeRepo(dir: string): Promise<string> {
  await fs.mkdir(dir, { recursive: true });
  git(dir, 'init', '-q', '-b', 'main');
  await fs.writeFile(path.join(dir, 'README.md'), '# demo\n');
  await fs.mkdir(path.join(dir, 'src'));
  await fs.writeFile(path.join(dir, 'src', 'index.ts'), 'export {};\n');
  git(dir, 'add', '.');
  git(dir, 'commit', '-q', '-m', 'init');
  return dir;
}

const lines = (...ls: string[]) => ls.join('\n') + '\n';

/** The reference file; line numbers in the tests below refer to it. */
const VALID = lines(
  'objective: Add dark mode', //          1
  'repository: ../repo', //               2
  'gates:', //                            3
  '  - name: test', //                    4
  '    command: npm test', //             5
  'agents:', //                           6
  '  builder:', //                        7
  '    provider: script', //              8
  '    command: ./build.sh', //           9
  'streams:', //                          10
  '  - id: ui', //                        11
  '    task: Build the toggle', //        12
  '  - id: api', //                       13
  '    task: Store the preference', //    14
  '    depends_on: [ui]', //              15
);

/** VALID with line `n` (1-based) replaced by `replacement` (may be several lines, or none). */
function replaceLine(n: number, ...replacement: string[]): string {
  const ls = VALID.trimEnd().split('\n');
  ls.splice(n - 1, 1, ...replacement);
  return lines(...ls);
}

let root: string;
let repo: string;
let objectivesDir: string;
let counter = 0;

beforeAll(async () => {
  root = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-objective-file-')));
  repo = await makeRepo(path.join(root, 'repo'));
  // The current branch is not main, so "defaults to the current branch" is visible.
  git(repo, 'checkout', '-q', '-b', 'feature');
  objectivesDir = path.join(root, 'objectives');
  await fs.mkdir(objectivesDir);
});

afterAll(async () => {
  if (root) await fs.rm(root, { recursive: true, force: true });
});

async function writeObjective(text: string, name = `objective-${++counter}.yaml`): Promise<string> {
  const file = path.join(objectivesDir, name);
  await fs.writeFile(file, text);
  return file;
}

async function loadError(file: string, overrides?: Parameters<typeof loadObjectiveFile>[1]): Promise<ObjectiveFileError> {
  try {
    await loadObjectiveFile(file, overrides);
  } catch (err) {
    expect(err).toBeInstanceOf(ObjectiveFileError);
    return err as ObjectiveFileError;
  }
  throw new Error(`expected ${file} to be rejected`);
}

/** Asserts one problem at `line` for `field` whose message matches, and that the formatted message carries it. */
function expectProblem(err: ObjectiveFileError, file: string, line: number | undefined, field: string | undefined, message: RegExp): ObjectiveFileProblem {
  const found = err.problems.find((p) => p.line === line && p.field === field && message.test(p.message));
  expect(found, `no problem at line ${line} for ${field} matching ${message} in:\n${err.message}`).toBeDefined();
  const prefix = line === undefined ? `${file}: ` : `${file}:${line}:${found!.column}: `;
  expect(err.message.split('\n')).toContain(`${prefix}${field ? `${field}: ` : ''}${found!.message}`);
  return found!;
}

describe('loadObjectiveFile: valid files', () => {
  it('resolves paths, applies defaults and derives id and base branch', async () => {
    const file = await writeObjective(VALID, 'Add Dark_Mode!.yaml');
    const now = new Date(Date.UTC(2025, 0, 2, 3, 4, 5));
    const input = await loadObjectiveFile(file, { now });

    expect(input.id).toBe('add-dark_mode-20250102-030405');
    expect(input.id).toMatch(ID_PATTERN);
    expect(input.objective).toBe('Add dark mode');
    expect(input.repository).toBe(await fs.realpath(repo));
    expect(input.baseBranch).toBe('feature');
    expect(input.objectiveDir).toBe(objectivesDir);
    expect(input.sourceFile).toBe(file);
    expect(input.maxParallelStreams).toBe(3);
    expect(input.maxFixIterations).toBeUndefined(); // the blueprints decide unless the file says
    expect(input.gates).toEqual([{ name: 'test', command: 'npm test', timeout_seconds: 600 }]);
    expect(input.postMergeGates).toEqual(input.gates);
    expect(input.agents).toEqual({
      builder: {
        provider: 'script', command: './build.sh', extra_args: [], timeout_minutes: 30, idle_timeout_minutes: 15, max_iterations: 1,
        completion_signals: ['<promise>COMPLETE</promise>'], completion_grace_seconds: 5, args: {}, max_output_retries: 2,
      },
    });
    expect(input.streams).toEqual([
      { id: 'ui', task: 'Build the toggle', depends_on: [] },
      { id: 'api', task: 'Store the preference', depends_on: ['ui'] },
    ]);

    // Loading is read-only.
    expect(git(repo, 'status', '--porcelain', '--ignored')).toBe('');
    await expect(fs.access(path.join(repo, '.slipway'))).rejects.toThrow();
  });

  it('uses id, base_branch, post_merge_gates and limits from the file', async () => {
    const file = await writeObjective(
      VALID +
        lines(
          'id: dark-mode',
          'base_branch: main',
          'max_parallel_streams: 5',
          'max_fix_iterations: 0',
          'post_merge_gates:',
          '  - name: e2e',
          '    command: npm run e2e',
          '    timeout_seconds: 60',
        ),
    );
    const input = await loadObjectiveFile(file);
    expect(input.id).toBe('dark-mode');
    expect(input.baseBranch).toBe('main');
    expect(input.maxParallelStreams).toBe(5);
    expect(input.maxFixIterations).toBe(0);
    expect(input.postMergeGates).toEqual([{ name: 'e2e', command: 'npm run e2e', timeout_seconds: 60 }]);
    expect(input.gates).toEqual([{ name: 'test', command: 'npm test', timeout_seconds: 600 }]);
  });

  it('sandbox readable: host paths bound read-only under bubblewrap, beside the objective folder; ignored unconfined', async () => {
    const confined = await loadObjectiveFile(await writeObjective(`${VALID}sandbox:\n  confinement: bubblewrap\n  writable: [/srv/agent-home]\n  readable: [/opt/agents, ~/.codex/config.toml]\n`));
    expect(confined.sandbox).toMatchObject({ writable: ['/srv/agent-home'], readable: [objectivesDir, '/opt/agents', path.join(os.homedir(), '.codex/config.toml')] });
    const unconfined = await loadObjectiveFile(await writeObjective(`${VALID}sandbox:\n  readable: [/opt/agents]\n`));
    expect(unconfined.sandbox?.readable).toBeUndefined();
    const bad = await writeObjective(`${VALID}sandbox:\n  confinement: bubblewrap\n  readable: [relative/path]\n`);
    expect((await loadError(bad)).message).toMatch(/sandbox\.readable\[0\]/);
  });

  it('applies overrides; the repository override is relative to the cwd and resolves to the repository root', async () => {
    const file = await writeObjective(replaceLine(2, 'repository: ../does-not-matter') + 'id: from-file\nbase_branch: nope\n');
    const input = await loadObjectiveFile(file, {
      repository: path.relative(process.cwd(), path.join(repo, 'src')),
      id: 'from-cli',
      baseBranch: 'main',
    });
    expect(input.repository).toBe(await fs.realpath(repo));
    expect(input.id).toBe('from-cli');
    expect(input.baseBranch).toBe('main');
  });

  it('takes the repository from the override alone when the file has no repository:, and still requires one of them', async () => {
    const file = await writeObjective(replaceLine(2));
    const input = await loadObjectiveFile(file, { repository: repo });
    expect(input.repository).toBe(await fs.realpath(repo));
    const err = await loadError(file);
    expect(err.problems.map((p) => p.field)).toContain('repository');
  });

  it('derives a valid id from a long or odd file name', async () => {
    const file = await writeObjective(VALID, `${'_Very Long Name '.repeat(8)}.objective.yml`);
    const input = await loadObjectiveFile(file, { now: new Date(Date.UTC(2024, 11, 31, 23, 59, 58)) });
    expect(input.id).toMatch(ID_PATTERN);
    expect(input.id.length).toBeLessThanOrEqual(63);
    expect(input.id).toMatch(/^very-long-name-.*-20241231-235958$/);
  });
});

describe('loadObjectiveFile: errors', () => {
  it('missing objective points at the top-level mapping', async () => {
    const file = await writeObjective(replaceLine(1));
    const err = await loadError(file);
    expect(err.problems).toHaveLength(1);
    expectProblem(err, file, 1, 'objective', /is required \(a string\)/);
  });

  it('wrong type points at the value', async () => {
    const file = await writeObjective(replaceLine(3, 'max_parallel_streams: "three"', 'gates:'));
    const err = await loadError(file);
    const p = expectProblem(err, file, 3, 'max_parallel_streams', /expected a number, got "three"/);
    expect(p.column).toBe(23);
    expect(err.message).toBe(`${file}:3:23: max_parallel_streams: expected a number, got "three"`);
  });

  it('iteration caps name the field and the cap (bounded stream history)', async () => {
    const file = await writeObjective(replaceLine(3, `max_fix_iterations: ${ITERATION_CAPS.maxFixIterations + 1}`, 'gates:').replace('    command: ./build.sh', `    command: ./build.sh\n    max_iterations: ${ITERATION_CAPS.maxIterations + 1}`));
    const err = await loadError(file);
    expectProblem(err, file, 3, 'max_fix_iterations', new RegExp(`^must be at most ${ITERATION_CAPS.maxFixIterations}, got ${ITERATION_CAPS.maxFixIterations + 1}$`));
    expectProblem(err, file, 11, 'agents.builder.max_iterations', new RegExp(`^must be at most ${ITERATION_CAPS.maxIterations}, got ${ITERATION_CAPS.maxIterations + 1}$`));
  });

  it('unknown top-level key is named', async () => {
    const file = await writeObjective(replaceLine(3, 'priority: high', 'gates:'));
    const err = await loadError(file);
    expectProblem(err, file, 3, 'priority', /unknown key "priority" \(expected one of: id, objective, repository/);
  });

  it('unknown stream key is named', async () => {
    const file = await writeObjective(replaceLine(15, '    dependson: [ui]'));
    const err = await loadError(file);
    expectProblem(err, file, 15, 'streams[1].dependson', /unknown key "dependson" \(expected one of: id, task, depends_on\)/);
  });

  it('unknown dependency points at its list item', async () => {
    const file = await writeObjective(replaceLine(15, '    depends_on:', '      - ui', '      - db'));
    const err = await loadError(file);
    expect(err.problems).toHaveLength(1);
    const p = expectProblem(err, file, 17, 'streams[1].depends_on[1]', /unknown stream "db"/);
    expect(p.column).toBe(9);
  });

  it('duplicate stream id points at the second id', async () => {
    const file = await writeObjective(replaceLine(13, '  - id: ui'));
    const err = await loadError(file);
    expectProblem(err, file, 13, 'streams[1].id', /duplicate stream id "ui"/);
  });

  it('dependency cycle points at depends_on', async () => {
    const file = await writeObjective(replaceLine(12, '    task: Build the toggle', '    depends_on: [api]'));
    const err = await loadError(file);
    expectProblem(err, file, 13, 'streams[0].depends_on', /dependency cycle: ui -> api -> ui/);
  });

  it('reserved stream id', async () => {
    const file = await writeObjective(replaceLine(11, '  - id: integration'));
    const err = await loadError(file);
    expectProblem(err, file, 11, 'streams[0].id', /"integration" is reserved/);
  });

  it('invalid stream id characters', async () => {
    const file = await writeObjective(replaceLine(13, '  - id: Web API'));
    const err = await loadError(file);
    expectProblem(err, file, 13, 'streams[1].id', /"Web API" must be lowercase letters/);
  });

  it('script agent without command points at the agent', async () => {
    const file = await writeObjective(replaceLine(9));
    const err = await loadError(file);
    expectProblem(err, file, 7, 'agents.builder.command', /the script provider needs a "command"/);
  });

  it('YAML syntax error reports line and column', async () => {
    const file = await writeObjective(replaceLine(9, '   command: ./build.sh'));
    const err = await loadError(file);
    const p = expectProblem(err, file, 9, undefined, /YAML syntax error: All mapping items must start at the same column/);
    expect(p.column).toBe(1);
  });

  it('duplicate YAML key is a syntax error at the second key', async () => {
    const file = await writeObjective(VALID + 'objective: again\n');
    const err = await loadError(file);
    expectProblem(err, file, 16, undefined, /Map keys must be unique/);
  });

  it('empty file and non-mapping root', async () => {
    const empty = await writeObjective('# nothing yet\n');
    const err = await loadError(empty);
    expect(err.message).toBe(`${empty}: the file is empty; expected a mapping with objective, repository, agents and streams`);

    const list = await writeObjective('\n- objective: x\n');
    const err2 = await loadError(list);
    expectProblem(err2, list, 2, undefined, /expected a mapping .* found a list/);
  });

  it('missing file names the file', async () => {
    const file = path.join(objectivesDir, 'nope.yaml');
    const err = await loadError(file);
    expect(err.message).toBe(`${file}: cannot read the objective file: no such file`);
    expect(err.problems).toEqual([{ file, message: 'cannot read the objective file: no such file' }]);
  });

  it('repository that does not exist', async () => {
    const file = await writeObjective(replaceLine(2, 'repository: ../missing'));
    const err = await loadError(file);
    expectProblem(err, file, 2, 'repository', new RegExp(`${path.join(root, 'missing')} does not exist`));
  });

  it('repository that is a file, or not a git repository', async () => {
    const plain = await fs.mkdtemp(path.join(root, 'plain-'));
    const fileRepo = await writeObjective(replaceLine(2, 'repository: ../repo/README.md'));
    expectProblem(await loadError(fileRepo), fileRepo, 2, 'repository', /README\.md is not a directory/);

    const file = await writeObjective(replaceLine(2, `repository: ${plain}`));
    const err = await loadError(file);
    expectProblem(err, file, 2, 'repository', /is not a git repository/);

    // Overrides have no line in the file.
    const err2 = await loadError(await writeObjective(VALID), { repository: plain });
    expect(err2.problems[0]!.field).toBe('repository');
    expect(err2.problems[0]!.line).toBeUndefined();
    expect(err2.problems[0]!.message).toMatch(/is not a git repository .*\(given on the command line\)/);
  });

  it('base branch that does not exist names the branch and repository', async () => {
    const file = await writeObjective(replaceLine(2, 'repository: ../repo', 'base_branch: release'));
    const err = await loadError(file);
    expectProblem(err, file, 3, 'base_branch', new RegExp(`branch "release" does not resolve to a commit in ${repo}`));
  });

  it('a detached HEAD without base_branch asks for base_branch', async () => {
    const detached = await makeRepo(path.join(root, 'detached'));
    git(detached, 'checkout', '-q', '--detach');
    const file = await writeObjective(replaceLine(2, 'repository: ../detached'));
    const err = await loadError(file);
    expectProblem(err, file, 1, 'base_branch', /detached HEAD; set base_branch/);
  });

  it('an unborn branch without base_branch asks for a commit or base_branch', async () => {
    const unborn = path.join(root, 'unborn');
    await fs.mkdir(unborn);
    git(unborn, 'init', '-q', '-b', 'trunk');
    const file = await writeObjective(replaceLine(2, 'repository: ../unborn'));
    const err = await loadError(file);
    expectProblem(err, file, 1, 'base_branch', /current branch "trunk" .* has no commits yet/);
  });

  it('rejects an invalid id override', async () => {
    const file = await writeObjective(VALID);
    const err = await loadError(file, { id: 'Not Valid' });
    expect(err.problems).toEqual([{ file, field: 'id', message: expect.stringMatching(/"Not Valid" \(given on the command line\) must be lowercase/) }]);
  });

  it('reports several problems at once, in file order', async () => {
    const file = await writeObjective(
      lines(
        'objective: ""', //                         1  empty objective
        'repository: ../missing', //                2  does not exist
        'max_parallel_streams: three', //           3  wrong type
        'agents:', //                               4
        '  builder:', //                            5  script without command
        '    provider: script', //                  6
        '    modle: fast', //                       7  unknown key
        'streams:', //                              8
        '  - id: ui', //                            9
        '    task: Build the toggle', //            10
        '    depends_on: [db]', //                  11 unknown dependency
      ),
    );
    const err = await loadError(file);
    expectProblem(err, file, 1, 'objective', /must not be empty/);
    expectProblem(err, file, 2, 'repository', /does not exist/);
    expectProblem(err, file, 3, 'max_parallel_streams', /expected a number, got "three"/);
    expectProblem(err, file, 5, 'agents.builder.command', /needs a "command"/);
    expectProblem(err, file, 7, 'agents.builder.modle', /unknown key "modle"/);
    expectProblem(err, file, 11, 'streams[0].depends_on[0]', /unknown stream "db"/);
    expect(err.problems).toHaveLength(6);
    expect(err.message.split('\n')).toHaveLength(6);
    expect(err.problems.map((p) => p.line)).toEqual([1, 2, 3, 5, 7, 11]);
  });

  it('reports dependency problems even when a stream has other errors', async () => {
    const file = await writeObjective(replaceLine(12, '    task:', '    depends_on: [api]'));
    const err = await loadError(file);
    expectProblem(err, file, 12, 'streams[0].task', /expected a string, got an empty value/);
    expectProblem(err, file, 13, 'streams[0].depends_on', /dependency cycle: ui -> api -> ui/);
    expect(err.problems).toHaveLength(2);
  });
});

describe('loadObjectiveFile: input limits and encoding', () => {
  it('a multi-megabyte objective text names the field and the file size, without a stack trace', async () => {
    const big = 'x'.repeat(3 * 1024 * 1024);
    const file = await writeObjective(replaceLine(1, `objective: ${big}`));
    const err = await loadError(file);
    expectProblem(err, file, 1, 'objective', /^too long: 3,145,728 characters, at most 50,000 allowed/);
    expectProblem(err, file, undefined, undefined, /^the file is 3,14\d,\d{3} bytes, at most 1,048,576 allowed/);
    expect(err.message).not.toMatch(/\n\s+at /);
    expect(err.message.length).toBeLessThan(1000); // the text itself is not echoed
  });

  it('a task text over the limit names its stream', async () => {
    const file = await writeObjective(replaceLine(14, `    task: ${'y'.repeat(20_001)}`));
    const err = await loadError(file);
    expectProblem(err, file, 14, 'streams[1].task', /^too long: 20,001 characters, at most 20,000 allowed/);
    expect(err.problems).toHaveLength(1);
  });

  it('texts at the limits are accepted', async () => {
    const file = await writeObjective(replaceLine(1, `objective: ${'o'.repeat(50_000)}`).replace('Store the preference', 't'.repeat(20_000)));
    const input = await loadObjectiveFile(file);
    expect(input.objective).toHaveLength(50_000);
    expect(input.streams[1]!.task).toHaveLength(20_000);
  });

  it('a file that is not UTF-8 is refused at its first invalid byte', async () => {
    const file = path.join(objectivesDir, `latin1-${++counter}.yaml`);
    // "Café" in Latin-1 on line 12: é is the single byte 0xE9.
    await fs.writeFile(file, Buffer.from(replaceLine(12, '    task: Build the Café toggle'), 'latin1'));
    const err = await loadError(file);
    expectProblem(err, file, 12, undefined, /^the file is not valid UTF-8 \(byte 0xe9\); save it as UTF-8$/);
    expect(err.problems[0]!.column).toBe(24);
    expect(err.problems).toHaveLength(1);
  });

  it('UTF-8 text, with or without a byte order mark, is read as written', async () => {
    const file = path.join(objectivesDir, `utf8-${++counter}.yaml`);
    await fs.writeFile(file, Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(replaceLine(1, 'objective: Ajouter le mode sombre — café ☕'))]));
    expect((await loadObjectiveFile(file)).objective).toBe('Ajouter le mode sombre — café ☕');
  });

  it('whitespace-only commands are refused: gates, setup, verify, script agents', async () => {
    const file = await writeObjective(
      lines(
        'objective: Add dark mode', //                                        1
        'repository: ../repo', //                                             2
        'gates:', //                                                          3
        '  - name: test', //                                                  4
        '    command: "   "', //                                              5
        '  - { name: lint, command: "\\t" }', //                               6
        'post_merge_gates: [{ name: e2e, command: " " }]', //                 7
        'agents:', //                                                         8
        '  builder: { provider: script, command: " " }', //                   9
        'sandbox:', //                                                        10
        '  project_setup: { commands: [" "], verify: ["npm ci", "  "] }', // 11
        'streams:', //                                                        12
        '  - { id: ui, task: Build the toggle }', //                          13
      ),
    );
    const err = await loadError(file);
    const blank = /^must not be only whitespace: give a command to run$/;
    expectProblem(err, file, 5, 'gates[0].command', blank);
    expectProblem(err, file, 6, 'gates[1].command', blank);
    expectProblem(err, file, 7, 'post_merge_gates[0].command', blank);
    expectProblem(err, file, 9, 'agents.builder.command', blank);
    expectProblem(err, file, 11, 'sandbox.project_setup.commands[0]', blank);
    expectProblem(err, file, 11, 'sandbox.project_setup.verify[1]', blank);
    expect(err.problems).toHaveLength(6);
  });
});

describe('loadObjectiveFile: the blueprint is checked for the level it runs at', () => {
  const USER_DIR_ENV = 'SLIPWAY_BLUEPRINTS_USER_DIR';
  let saved: string | undefined;
  let userDir: string;
  beforeAll(async () => {
    saved = process.env[USER_DIR_ENV];
    userDir = path.join(root, 'user-blueprints');
    await fs.mkdir(userDir, { recursive: true });
    const write = (name: string, ...ls: string[]) => fs.writeFile(path.join(userDir, name), lines(...ls));
    // Valid on their own (the loader accepts them), but not where an objective would use them.
    await write('solo.yaml', 'id: solo', 'level: stream', 'steps:', '  - id: build', '    type: agent', '    role: builder', '    next: ready', '  - id: ready', '    type: deterministic', '    action: signal_merge_ready');
    await write('wrapper.yaml', 'id: wrapper', 'level: objective', 'steps:', '  - id: nest', '    type: blueprint_ref', '    ref: plan-only', '    next: merge', '  - id: merge', '    type: deterministic', '    action: merge_queue');
    await write('plan-only.yaml', 'id: plan-only', 'level: objective', 'steps:', '  - id: plan', '    type: agent', '    role: planner');
    await write('fan.yaml', 'id: fan', 'level: objective', 'steps:', '  - id: each', '    type: blueprint_ref', '    ref: outer', '    foreach: work_item', '    next: merge', '  - id: merge', '    type: deterministic', '    action: merge_queue');
    await write('outer.yaml', 'id: outer', 'level: stream', 'steps:', '  - id: inner', '    type: blueprint_ref', '    ref: solo', '    next: ready', '  - id: ready', '    type: deterministic', '    action: signal_merge_ready');
    process.env[USER_DIR_ENV] = userDir;
  });
  afterAll(() => {
    if (saved === undefined) delete process.env[USER_DIR_ENV];
    else process.env[USER_DIR_ENV] = saved;
  });
  const withBlueprint = (id: string) => writeObjective(replaceLine(2, 'repository: ../repo', `blueprint: ${id}`));

  it('a stream blueprint named as the objective\'s is refused at the blueprint line, with the steps that could not run', async () => {
    const file = await withBlueprint('build-review');
    const err = await loadError(file);
    expectProblem(err, file, 3, 'blueprint', /^"build-review" is a stream blueprint; an objective runs an objective blueprint \(objective blueprints: fan, plan-only, standard, wrapper\)$/);
    const buildReview = path.join(SHIPPED_BLUEPRINTS_DIR, 'build-review.yaml');
    expect(err.message.split('\n')).toContain(`${buildReview}:12:11: step build: role: a builder step cannot run at objective level (an objective's blueprint)`);
    expect(err.message.split('\n')).toContain(`${buildReview}:27:13: step merge_ready: action: action "signal_merge_ready" cannot run at objective level (an objective's blueprint)`);
    expect(err.message).not.toMatch(/build-review\.yaml:3:/); // the level itself is said once, in the objective file
  });

  it('a custom stream blueprint with a builder step, named as the objective\'s, is refused', async () => {
    const file = await withBlueprint('solo');
    const err = await loadError(file);
    expectProblem(err, file, 3, 'blueprint', /^"solo" is a stream blueprint; an objective runs an objective blueprint/);
    expect(err.message).toContain(`${path.join(userDir, 'solo.yaml')}:6:11: step build: role: a builder step cannot run at objective level`);
  });

  it('an objective blueprint that runs another objective blueprint for each work item is refused at that blueprint\'s level', async () => {
    const file = await withBlueprint('wrapper');
    const err = await loadError(file);
    expectProblem(err, file, 3, 'blueprint', /^"wrapper" cannot run as this objective's blueprint: 2 problems below$/);
    const planOnly = path.join(userDir, 'plan-only.yaml');
    expect(err.message).toContain(`${planOnly}:2:8: level: "plan-only" is an objective blueprint, but it is used as the stream blueprint of step nest in "wrapper", which runs at stream level`);
    expect(err.message).toContain(`${planOnly}:6:11: step plan: role: a planner step cannot run at stream level`);
  });

  it('a stream blueprint that nests another blueprint is refused (a stream workflow runs its own steps only)', async () => {
    const file = await withBlueprint('fan');
    const err = await loadError(file);
    expect(err.message).toContain(`${path.join(userDir, 'outer.yaml')}:4:5: step inner: a stream workflow cannot run a nested blueprint ("solo")`);
  });

  it('the shipped standard blueprint still loads', async () => {
    const input = await loadObjectiveFile(await withBlueprint('standard'));
    expect(input.blueprint.root.id).toBe('standard');
  });
});

describe('loadObjectiveFile: sandbox provider (ADR 0012)', () => {
  const withSandbox = (...section: string[]) => lines(...VALID.trimEnd().split('\n'), 'sandbox:', ...section.map((l) => `  ${l}`));

  it('defaults to local; provider: podman carries network, limits and the objective folder (read-only) to the sandboxes', async () => {
    expect((await loadObjectiveFile(await writeObjective(VALID))).sandbox?.provider).toBeUndefined();
    const input = await loadObjectiveFile(await writeObjective(withSandbox('provider: podman', 'network: false', 'limits:', '  memory_mb: 512', '  processes: 128')));
    expect(input.sandbox).toMatchObject({ provider: 'podman', network: false, readable: [objectivesDir], limits: { memoryBytes: 512 * 1024 ** 2, pids: 128 } });
  });

  it('refuses local-only options with a container provider, naming the field and line', async () => {
    const file = await writeObjective(withSandbox('provider: podman', 'confinement: bubblewrap', 'warm_pool: 2', 'limits:', '  disk_mb: 100'));
    const err = await loadError(file);
    expectProblem(err, file, 18, 'sandbox.confinement', /a container is its own confinement/);
    expectProblem(err, file, 21, 'sandbox.limits.disk_mb', /not supported by provider: podman/);
    // Containers have a warm pool (ADR 0025): warm_pool is no refusal there.
    expect(err.message).not.toContain('warm_pool');
  });

  it('takes warm_pool with provider: podman or docker (the container pool) and refuses it with daytona', async () => {
    for (const provider of ['podman', 'docker']) {
      expect((await loadObjectiveFile(await writeObjective(withSandbox(`provider: ${provider}`, 'warm_pool: 2')))).sandbox).toMatchObject({ provider, warmPool: 2 });
    }
    const file = await writeObjective(withSandbox('provider: daytona', 'warm_pool: 2'));
    expectProblem(await loadError(file), file, 18, 'sandbox.warm_pool', /Daytona sandboxes have no warm pool/);
  });

  it('refuses an unknown provider', async () => {
    const file = await writeObjective(withSandbox('provider: firecracker'));
    expectProblem(await loadError(file), file, 17, 'sandbox.provider', /local|podman|docker/);
  });
});
