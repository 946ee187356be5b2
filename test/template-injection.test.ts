/**
 * Prompt templates cannot inject: a `{{KEY}}` inside a `` !`command` `` expansion reaches the
 * command as an environment variable it references, never as shell syntax. Hostile values (task
 * text, planner output, gate output, review findings are all attacker-controlled) are run through
 * real /bin/sh in unquoted, double-quoted, nested `$(...)` and `${...}` positions: none may create
 * the `pwned` file, and each must arrive verbatim. Keys inside single quotes or `$((...))` are
 * rejected when the objective loads, naming the file and position, and are never run.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { MockActivityEnvironment } from '@temporalio/testing';
import { describe, expect, it } from 'vitest';
import { createAgentActivities, type AgentRunInput } from '../activities/agents/run-agent';
import { checkTemplate, parseTemplate, renderTemplate, TemplateError } from '../agents/template';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import { ObjectiveFileError, loadObjectiveFile } from '../config/objective-file';
import { AgentSchema } from '../core/objective-schema';
import { gitIn, tempDir } from './helpers/repo';

/** Each tries to run `touch pwned` (relative: the command's cwd is the sandbox). */
const HOSTILE: Record<string, string> = {
  'command substitution': '$(touch pwned)',
  backticks: '`touch pwned`',
  'double-quote breakout': '"; touch pwned; "',
  'single-quote breakout': "'; touch pwned; '",
  newline: 'fine\ntouch pwned\n# ',
  'newline + substitution': 'a\n$(touch pwned)\nb',
  'parameter expansion': '${PATH:+$(touch pwned)}',
  'glob and redirect': '* > pwned',
  'backslash escapes': '\\"; touch pwned; \\`touch pwned\\`',
  'old quoting breakout': `'"$(touch pwned)"'`,
  'template syntax': '{{TASK}} !`touch pwned`',
  'leading dash': '-n $(touch pwned)',
};

/** Templates that print the value back; `{{V}}` stands unquoted, in double quotes, nested. */
const ACCEPTED: Record<string, string> = {
  unquoted: "!`printf '%s' {{V}}`",
  'double-quoted': "!`printf '%s' \"{{V}}\"`",
  'inside double quotes with text around': "!`printf '%s' \"<{{V}}>\"`",
  'in $(...)': "!`printf '%s' \"$(printf '%s' \"{{V}}\")\"`",
  'unquoted in $(...)': "!`printf '%s' \"$(printf '%s' {{V}})\"`",
  'in ${...:-word}': "!`printf '%s' \"${SLIPWAY_UNSET_X:-{{V}}}\"`",
  'next to a letter': "!`printf '%s' {{V}}x`",
};
const EXPECTED_WRAP: Record<string, (v: string) => string> = {
  'inside double quotes with text around': (v) => `<${v}>`,
  'next to a letter': (v) => `${v}x`,
};

/** Runs expansions as the agent activity does: /bin/sh in the sandbox, with the values' variables. */
async function render(template: string, value: string, sandbox: string): Promise<string> {
  const sandboxes = new LocalSandboxProvider();
  return renderTemplate(parseTemplate(template), { V: value }, async (command, _at, env) => {
    const run = await sandboxes.exec({ root: sandbox }, { command, shell: true, env });
    if (run.exitCode !== 0) throw new Error(`${command} exited ${run.exitCode}: ${run.stderr}`);
    return run.stdout;
  });
}

function expectNotPwned(dir: string): void {
  expect(readdirSync(dir).filter((f) => f.includes('pwned'))).toEqual([]);
}

describe('hostile values in accepted positions', () => {
  const cases = Object.entries(ACCEPTED).flatMap(([where, template]) => Object.entries(HOSTILE).map(([what, value]) => ({ where, template, what, value })));

  it.each(cases)('$where: $what — runs nothing, arrives verbatim', async ({ where, template, value }) => {
    const sandbox = tempDir('slipway-inject-');
    expect(checkTemplate(template, { V: value }).problems).toEqual([]);
    const out = await render(template, value, sandbox);
    expect(out).toBe((EXPECTED_WRAP[where] ?? ((v: string) => v))(value).replace(/\n+$/, ''));
    expectNotPwned(sandbox);
  });

  it('a value never becomes command text: the command holds a variable reference only', async () => {
    const seen: Array<{ command: string; env: Record<string, string> }> = [];
    await renderTemplate(parseTemplate('!`echo "{{V}}" {{V}}`'), { V: '$(touch pwned)' }, async (command, _at, env) => {
      seen.push({ command, env });
      return '';
    });
    expect(seen).toEqual([{ command: 'echo "${SLIPWAY_ARG_V}" "${SLIPWAY_ARG_V}"', env: { SLIPWAY_ARG_V: '$(touch pwned)' } }]);
  });
});

describe('positions where a value cannot be passed safely', () => {
  const REJECTED: Record<string, string> = {
    'single quotes': "!`echo '{{V}}'`",
    'single quotes with text around': "!`echo 'a {{V}} b'`",
    'single quotes inside $(...)': "!`echo \"$(echo '{{V}}')\"`",
    "ANSI-C $'...'": "!`echo $'{{V}}'`",
    'after a backslash': '!`echo \\{{V}}`',
    'arithmetic': '!`echo $(( {{V}} + 1 ))`',
  };

  it.each(Object.entries(REJECTED))('%s: reported at load, refused at render, never run', async (_where, template) => {
    const problems = checkTemplate(template, { V: '1' }).problems;
    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatchObject({ line: 1, message: expect.stringMatching(/^\{\{V\}\} (is inside single quotes|is inside \$\(\(\.\.\.\)\)|follows a backslash)/) });
    for (const value of Object.values(HOSTILE)) {
      const sandbox = tempDir('slipway-inject-');
      let ran = false;
      const rendering = renderTemplate(parseTemplate(template), { V: value }, async () => {
        ran = true;
        return '';
      });
      await expect(rendering).rejects.toBeInstanceOf(TemplateError);
      expect(ran).toBe(false);
      expectNotPwned(sandbox);
    }
  });

  it('quotes that only look like quotes do not confuse the context', () => {
    // A double-quoted apostrophe does not open single quotes; an escaped quote does not either.
    expect(checkTemplate(`!\`echo "it's {{V}}"\``, { V: '1' }).problems).toEqual([]);
    expect(checkTemplate(`!\`echo it\\'s {{V}}\``, { V: '1' }).problems).toEqual([]);
    expect(checkTemplate(`!\`echo 'closed' {{V}} 'again'\``, { V: '1' }).problems).toEqual([]);
    // ...but the key after an opening quote is inside it.
    expect(checkTemplate(`!\`echo "x" '{{V}}'\``, { V: '1' }).problems).toHaveLength(1);
  });

  it('the objective loader names the prompt file, line and column', async () => {
    const repo = tempDir('slipway-repo-');
    gitIn(repo, 'init', '-q', '-b', 'main');
    gitIn(repo, '-c', 'user.email=t@example.com', '-c', 'user.name=t', 'commit', '-q', '--allow-empty', '-m', 'init');
    const dir = tempDir('slipway-objective-');
    writeFileSync(path.join(dir, 'build.md'), "Task:\n  !`grep -r '{{TASK}}' .`\n");
    writeFileSync(
      path.join(dir, 'objective.yaml'),
      ['objective: x', `repository: ${repo}`, 'agents:', '  builder: { provider: script, command: "true", prompt_file: build.md }', 'streams:', '  - { id: a, task: t }', ''].join('\n'),
    );
    const loading = loadObjectiveFile(path.join(dir, 'objective.yaml'));
    await expect(loading).rejects.toBeInstanceOf(ObjectiveFileError);
    await expect(loading).rejects.toThrow(`${path.join(dir, 'build.md')}:2:14: {{TASK}} is inside single quotes`);
  });
});

describe('through the agent activity', () => {
  it('a hostile task in a double-quoted expansion reaches the prompt verbatim and runs nothing', async () => {
    const repo = tempDir('slipway-repo-');
    gitIn(repo, 'init', '-q', '-b', 'main');
    const sandbox = path.join(repo, 'wt');
    mkdirSync(sandbox);
    const objectiveDir = tempDir('slipway-objective-');
    const task = `"; touch pwned; " $(touch pwned) \`touch pwned\` '; touch pwned; '\ntouch pwned`;
    const spec = AgentSchema.parse({
      provider: 'script',
      command: 'cat > "$SLIPWAY_OBJECTIVE_DIR/prompt.txt"',
      prompt: 'Task: !`printf \'%s\' "{{TASK}}"`\nAgain: !`printf \'%s\' {{TASK}}`\n',
    });
    const input: AgentRunInput = {
      role: 'builder',
      spec,
      sandboxPath: sandbox,
      repository: repo,
      objectiveDir,
      objective: { id: 'o', text: 'objective' },
      stream: { id: 's', task, branch: 'slipway/o/s' },
      targetBranch: 'slipway/o/integration',
      iteration: 1,
    };
    const activities = createAgentActivities({ sandboxes: new LocalSandboxProvider() });
    await new MockActivityEnvironment().run(activities.runAgent, input);
    expect(readFileSync(path.join(objectiveDir, 'prompt.txt'), 'utf8')).toBe(`Task: ${task}\nAgain: ${task}\n`);
    expectNotPwned(sandbox);
    expectNotPwned(repo);
    expect(existsSync(path.join(process.cwd(), 'pwned'))).toBe(false);
  });
});
