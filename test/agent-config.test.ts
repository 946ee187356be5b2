/**
 * Agent configuration without a server: `.slipway/config.yaml` merged under the objective file,
 * prompt templates (parsing, checking, rendering), `spec.command` word splitting, the
 * `.slipway/.env` parser and the redaction of its values.
 */
import { execFileSync } from 'node:child_process';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile, ObjectiveFileError } from '../config/objective-file';
import { splitCommandLine } from '../agents/command-line';
import { parseDotenv, ProjectEnvError } from '../agents/credentials';
import { agentProvider } from '../agents/registry';
import { checkTemplate, parseTemplate, renderTemplate, templateKeys } from '../agents/template';
import { redact, secretValuesWith } from '../activities/redact';
import { AgentSchema } from '../core/objective-schema';
import { trustRepository } from '../config/trust';

const lines = (...ls: string[]) => `${ls.join('\n')}\n`;

let root: string;
let counter = 0;

beforeAll(async () => {
  root = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-agent-config-')));
  process.env.SLIPWAY_HOME = path.join(root, 'home'); // trust records (config/trust.ts) stay in the test's folder
});
afterAll(async () => {
  if (root) await fs.rm(root, { recursive: true, force: true });
});

/** A repository with `files` (relative to it, e.g. `.slipway/config.yaml`) and an objective file beside it. */
async function project(objective: string, files: Record<string, string> = {}): Promise<{ file: string; repo: string; dir: string }> {
  const dir = path.join(root, `p${++counter}`);
  const repo = path.join(dir, 'repo');
  await fs.mkdir(repo, { recursive: true });
  const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: repo, stdio: 'pipe' });
  git('init', '-q', '-b', 'main');
  await fs.writeFile(path.join(repo, 'README.md'), '# r\n');
  git('add', '.');
  git('commit', '-q', '-m', 'init');
  for (const [rel, content] of Object.entries(files)) {
    const target = path.join(repo, rel); // `../x` lands beside the objective file
    await fs.mkdir(path.dirname(target), { recursive: true });
    await fs.writeFile(target, content);
  }
  const file = path.join(dir, 'objective.yaml');
  await fs.writeFile(file, objective);
  // These repositories' configs are the user's own: trusted, as `slipway trust` would (test/trust.test.ts covers untrusted ones).
  await trustRepository(repo);
  return { file, repo, dir };
}

async function problems(file: string): Promise<string[]> {
  try {
    await loadObjectiveFile(file);
  } catch (e) {
    expect(e).toBeInstanceOf(ObjectiveFileError);
    return (e as Error).message.split('\n');
  }
  throw new Error(`expected ${file} to be rejected`);
}

const HEAD = ['objective: x', 'repository: ./repo'];
const STREAMS = ['streams:', '  - id: a', '    task: do a'];

describe('.slipway/config.yaml agent defaults', () => {
  it('fills the roles the objective file leaves out, field by field, with defaults applied after the merge', async () => {
    const { file } = await project(lines(...HEAD, 'agents:', '  builder:', '    max_iterations: 2', '    extra_args: [--verbose-off]', ...STREAMS), {
      '.slipway/config.yaml': lines(
        'agents:',
        '  builder:',
        '    provider: claude-code',
        '    model: claude-opus-4-1',
        '    extra_args: [--max-turns, "40"]',
        '    idle_timeout_minutes: 5',
        '  reviewer:',
        '    provider: codex',
        '    permission_mode: read-only',
      ),
    });
    const input = await loadObjectiveFile(file);
    expect(input.agents.builder).toMatchObject({
      provider: 'claude-code',
      model: 'claude-opus-4-1',
      extra_args: ['--verbose-off'], // lists are replaced, not joined
      idle_timeout_minutes: 5,
      max_iterations: 2,
      timeout_minutes: 30,
      completion_signals: ['<promise>COMPLETE</promise>'],
      max_output_retries: 2,
    });
    expect(input.agents.reviewer).toMatchObject({ provider: 'codex', permission_mode: 'read-only', max_iterations: 1 });
  });

  it('a different provider in the objective file drops the config\'s provider-bound fields; a new prompt drops its prompt and args', async () => {
    const { file } = await project(
      lines(...HEAD, 'agents:', '  builder:', '    provider: pi', '  reviewer:', '    prompt: "Review {{TASK}}"', ...STREAMS),
      {
        '.slipway/config.yaml': lines(
          'agents:',
          '  builder:',
          '    provider: opencode',
          '    model: anthropic/claude-sonnet-4-5',
          '    permission_mode: auto',
          '    timeout_minutes: 12',
          '  reviewer:',
          '    provider: claude-code',
          '    prompt: "Look at {{THING}}"',
          '    args: { THING: the diff }',
        ),
      },
    );
    const input = await loadObjectiveFile(file);
    expect(input.agents.builder).toMatchObject({ provider: 'pi', timeout_minutes: 12 });
    expect(input.agents.builder?.model).toBeUndefined();
    expect(input.agents.builder?.permission_mode).toBeUndefined();
    expect(input.agents.reviewer).toMatchObject({ provider: 'claude-code', prompt: 'Review {{TASK}}', args: {} });
  });

  it('merges args key by key, and reads prompt_file relative to the file that names it', async () => {
    const { file } = await project(lines(...HEAD, 'agents:', '  builder:', '    args: { B: from-objective }', ...STREAMS), {
      '.slipway/config.yaml': lines('agents:', '  builder:', '    provider: script', '    command: ./b.sh', '    prompt_file: prompts/b.md', '    args: { A: from-config, B: from-config }'),
      '.slipway/prompts/b.md': 'A={{A}} B={{B}} task={{TASK}}\n',
    });
    const input = await loadObjectiveFile(file);
    expect(input.agents.builder?.args).toEqual({ A: 'from-config', B: 'from-objective' });
    expect(input.agents.builder?.prompt).toBe('A={{A}} B={{B}} task={{TASK}}\n');
    expect(path.isAbsolute(input.agents.builder!.prompt_file!)).toBe(true);
    expect(input.agents.builder?.prompt_file).toMatch(/\.slipway\/prompts\/b\.md$/);
  });

  it('a builder and a planner from the config alone are enough (no agents, no streams in the objective file)', async () => {
    const { file } = await project(lines(...HEAD), {
      '.slipway/config.yaml': lines('agents:', '  builder: { provider: claude-code }', '  planner: { provider: codex }'),
    });
    const input = await loadObjectiveFile(file);
    expect(Object.keys(input.agents).sort()).toEqual(['builder', 'planner']);
    expect(input.streams).toEqual([]);
  });

  it('without a builder anywhere, or streams and a planner, says where to configure them', async () => {
    const { file, repo } = await project(lines(...HEAD));
    const msgs = await problems(file);
    expect(msgs).toContain(`${file}:1:1: agents.builder: is required: configure the builder agent here or in ${path.join(repo, '.slipway', 'config.yaml')}`);
    expect(msgs.some((m) => m.includes('streams: list at least one stream, or configure agents.planner'))).toBe(true);
  });

  it('reports config file problems at their line, and merged problems in the file the field came from', async () => {
    const { file, repo } = await project(lines(...HEAD, 'agents:', '  builder:', '    provider: opencode', '    model: gpt-5', ...STREAMS), {
      '.slipway/config.yaml': lines(
        'agents:', //                       1
        '  builder:', //                    2
        '    provider: opencode', //        3
        '    permision_mode: auto', //      4  typo
        '  reviewer:', //                   5
        '    provider: claude-code', //     6
        '    max_iterations: 3', //         7  structured answers come from one run
        '  scout:', //                      8
        '    provider: codex', //           9
        '    permission_mode: yolo', //     10
        'gates: []', //                     11 not a config key
      ),
    });
    const config = path.join(repo, '.slipway', 'config.yaml');
    const msgs = await problems(file);
    expect(msgs).toContain(`${file}:6:12: agents.builder.model: opencode needs model as "provider/model", got "gpt-5"`);
    expect(msgs).toContain(`${config}:4:5: agents.builder.permision_mode: unknown key "permision_mode" (expected one of: provider, command, model, permission_mode, extra_args, timeout_minutes, idle_timeout_minutes, max_iterations, completion_signals, completion_grace_seconds, prompt, prompt_file, args, max_output_retries)`);
    expect(msgs).toContain(`${config}:7:21: agents.reviewer.max_iterations: must be 1 for the reviewer: it answers once, with <review>…</review>`);
    expect(msgs.some((m) => m.startsWith(`${config}:10:22: agents.scout.permission_mode: codex does not know permission_mode "yolo"`))).toBe(true);
    expect(msgs.some((m) => m.startsWith(`${config}:11:1: gates: unknown key "gates"`))).toBe(true);
  });

  it('checks prompt templates: keys without a value (file:line:col), unused args, built-in names, both prompt kinds, missing files', async () => {
    const { file, dir } = await project(
      lines(
        ...HEAD, //                                      1-2
        'agents:', //                                    3
        '  builder:', //                                 4
        '    provider: claude-code', //                  5
        '    prompt_file: prompts/build.md', //          6
        '    args: { TICKET: T-1, EXTRA: x, TASK: y }', //  7
        '  reviewer:', //                                8
        '    provider: claude-code', //                  9
        '    prompt: "Review.\\nAlso {{task}}"', //      10
        '  scout:', //                                   11
        '    provider: claude-code', //                  12
        '    prompt: a', //                              13
        '    prompt_file: nowhere.md', //                14
        '  planner:', //                                 15
        '    provider: claude-code', //                  16
        '    prompt_file: missing.md', //                17
        ...STREAMS,
      ),
      { '../prompts/build.md': 'Fix {{TICKET}}\n\nfor {{TIKET}} on !`git status` and !` `\n' },
    );
    const template = path.join(dir, 'prompts', 'build.md');
    const msgs = await problems(file);
    expect(msgs).toContain(`${template}:3:5: {{TIKET}} has no value; give it in "args", or use a built-in: SOURCE_BRANCH, TARGET_BRANCH, OBJECTIVE, OBJECTIVE_ID, STREAM, TASK, ITERATION, MAX_ITERATIONS, FIX_ITERATION, GATE_OUTPUT, REVIEW_FEEDBACK, LEDGER, GUIDANCE, FEEDBACK, REBUILD`);
    expect(msgs).toContain(`${template}:3:36: empty !\`command\` expansion`);
    expect(msgs.some((m) => m.startsWith(`${file}:7:`) && m.includes('agents.builder.args.EXTRA: unknown key "EXTRA": the prompt never uses {{EXTRA}}'))).toBe(true);
    expect(msgs.some((m) => m.includes('agents.builder.args.TASK: "TASK" is a built-in argument; choose another name'))).toBe(true);
    expect(msgs.some((m) => m.startsWith(`${file}:10:`) && m.includes('agents.reviewer.prompt: line 2 of the prompt: {{task}} has no value (did you mean {{TASK}}?)'))).toBe(true);
    expect(msgs.some((m) => m.includes('agents.scout.prompt_file: set either "prompt" or "prompt_file", not both'))).toBe(true);
    expect(msgs.some((m) => m.startsWith(`${file}:17:`) && m.includes(`agents.planner.prompt_file: cannot read ${path.join(dir, 'missing.md')}: no such file`))).toBe(true);
  });
});

describe('prompt templates', () => {
  const values = { TASK: "it's $(rm -rf /) `x` {{GATE_OUTPUT}}", GATE_OUTPUT: 'gate said !`touch pwned`', NAME: 'Ada' };

  it('finds keys and commands with their positions', () => {
    const t = parseTemplate('Hi {{ NAME }}!\n!`echo {{TASK}}` and {{TASK}}');
    expect(templateKeys(t)).toEqual([
      { key: 'NAME', line: 1, column: 4 },
      { key: 'TASK', context: 'plain', line: 2, column: 8 },
      { key: 'TASK', line: 2, column: 22 },
    ]);
  });

  it('renders in one pass: values and command output are never expanded again; values reach commands as variables', async () => {
    const commands: string[] = [];
    const out = await renderTemplate(parseTemplate('{{NAME}}: {{TASK}} | {{GATE_OUTPUT}} | !`printf %s {{TASK}}`'), values, async (command, _at, env) => {
      commands.push(command);
      return execFileSync('/bin/sh', ['-c', command], { encoding: 'utf8', env: { ...process.env, ...env } }) + '\n\n';
    });
    expect(commands).toEqual(['printf %s "${SLIPWAY_ARG_TASK}"']);
    expect(out).toBe("Ada: it's $(rm -rf /) `x` {{GATE_OUTPUT}} | gate said !`touch pwned` | it's $(rm -rf /) `x` {{GATE_OUTPUT}}");
  });

  it('suggests the built-in for a key in the wrong case, and lists args the template never uses', () => {
    expect(checkTemplate('{{Task}} {{A}}', { A: '1', B: '2' })).toEqual({
      problems: [{ line: 1, column: 1, message: expect.stringMatching(/^\{\{Task\}\} has no value \(did you mean \{\{TASK\}\}\?\)/) }],
      unusedArgs: ['B'],
    });
  });
});

describe('agent command lines', () => {
  it('splits spec.command like a shell (quotes, escapes), never through one', () => {
    expect(splitCommandLine(`node "/opt/my tools/fake.mjs" --format 'claude code' a\\ b "x\\"y"`)).toEqual(['node', '/opt/my tools/fake.mjs', '--format', 'claude code', 'a b', 'x"y']);
    expect(() => splitCommandLine('node "unterminated')).toThrow(/unterminated " quote/);
  });

  it('puts the words after the executable before the provider\'s own arguments', () => {
    const spec = AgentSchema.parse({ provider: 'codex', command: 'node /fake.mjs --format codex', model: 'gpt-5' });
    const cmd = agentProvider('codex').buildCommand({ role: 'builder', spec, prompt: 'p', cwd: '/', env: {}, resumeSessionId: 's1' });
    expect(cmd).toMatchObject({ command: 'node', args: ['/fake.mjs', '--format', 'codex', 'exec', '--json', '--model', 'gpt-5', 'resume', 's1', '-'], stdin: 'p' });
  });
});

describe('.slipway/.env', () => {
  it('parses the common dotenv forms', () => {
    const env = parseDotenv(
      lines('# comment', '', 'A=plain value # trailing comment', "export B='single # kept'", 'C="line1\\nline2 \\"q\\""', 'D="multi', 'line"', 'E=', 'F = spaced'),
      '.env',
    );
    expect(env).toEqual({ A: 'plain value', B: 'single # kept', C: 'line1\nline2 \\"q\\"', D: 'multi\nline', E: '', F: 'spaced' });
  });

  it('names the line of a malformed entry, never its content', () => {
    const secret = 'sk-live-abcdef123456';
    let error: unknown;
    try {
      parseDotenv(lines('OK=1', `this is ${secret}`), '/r/.slipway/.env');
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ProjectEnvError);
    expect((error as Error).message).toBe('/r/.slipway/.env:2: expected NAME=value (NAME: letters, digits and "_")');
    expect((error as Error).message).not.toContain(secret);
  });

  it('redacts its values (all but plain settings), each line of multi-line ones, and the worker\'s secret-looking variables', () => {
    const key = '-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----';
    const secrets = secretValuesWith(
      { DATABASE_URL: 'postgres://u:pw9@db/x', NODE_ENV: 'development', RETRIES: '12345678', GH_TOKEN: 'plainword', SSH_KEY: key },
      { ANTHROPIC_API_KEY: 'sk-ant-000111', HOME: '/home/someone' },
    );
    const text = `db=postgres://u:pw9@db/x env=development retries=12345678 gh=plainword ant=sk-ant-000111 home=/home/someone line=MIIEvQIBADANBgkqhkiG9w0BAQEFAASC`;
    expect(redact(text, secrets)).toBe('db=[redacted] env=development retries=12345678 gh=[redacted] ant=[redacted] home=/home/someone line=[redacted]');
  });
});

describe('agent command lines (shell-quote)', () => {
  it('keeps $NAME literal, keeps globs and # as words, and refuses shell operators', () => {
    expect(splitCommandLine('node x.mjs $HOME "$X/y" *.log #tag')).toEqual(['node', 'x.mjs', '$HOME', '$X/y', '*.log', '#tag']);
    expect(() => splitCommandLine('node x.mjs | tee log')).toThrow(/contains "\|", but it is not run through a shell/);
    expect(() => splitCommandLine("node 'half")).toThrow(/unterminated ' quote/);
    expect(splitCommandLine(`node "a\\"b" 'c"d'`)).toEqual(['node', 'a"b', 'c"d']);
  });
});
