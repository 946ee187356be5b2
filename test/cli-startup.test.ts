/**
 * The compiled CLI loads only what a command uses (ADR 0016): help needs no Temporal SDK, no
 * activities, no billing database. Checked by what the child process actually required, not by
 * time (speed is measured in bench/cli.ts).
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { COMPILED_BIN, ensureBuilt } from './helpers/build';
import { tempDir } from './helpers/repo';
import { GROUPS } from '../cli/main';
import { GROUP_DESCRIPTIONS } from '../cli/verbs';

/** Runs the compiled CLI with a hook that writes every module it loaded, when it exits. */
function loadedModules(args: string[]): { code: number | null; stdout: string; modules: string[] } {
  const dir = tempDir('slipway-startup-');
  const hook = path.join(dir, 'hook.cjs');
  const out = path.join(dir, 'modules.json');
  writeFileSync(hook, `process.on('exit', () => require('node:fs').writeFileSync(${JSON.stringify(out)}, JSON.stringify(Object.keys(require.cache))));\n`);
  const run = spawnSync(process.execPath, ['--require', hook, COMPILED_BIN, ...args], { cwd: dir, encoding: 'utf8' });
  return { code: run.status, stdout: run.stdout, modules: JSON.parse(readFileSync(out, 'utf8')) as string[] };
}

const heavy = (modules: string[]) => modules.filter((m) => /[\\/](@temporalio|@electric-sql|pg|fastify)[\\/]|[\\/]dist[\\/]activities[\\/]/.test(m));

describe('compiled CLI start-up', () => {
  beforeAll(() => ensureBuilt(), 600_000);

  it('runs from dist/, not through tsx', () => {
    const run = loadedModules(['--version']);
    expect(run.code).toBe(0);
    // One version, package.json's (the release the golden histories are filed under).
    expect(run.stdout.trim()).toBe((JSON.parse(readFileSync(path.join(__dirname, '..', 'package.json'), 'utf8')) as { version: string }).version);
    expect(run.modules.some((m) => m.includes(`${path.sep}dist${path.sep}cli${path.sep}main.js`))).toBe(true);
    expect(run.modules.filter((m) => m.includes(`${path.sep}tsx${path.sep}`))).toEqual([]);
  });

  it.each([[['--help']], [['run', '--help']], [['status', '--help']], [['list', '--help']], [['help', 'dev']], [['sandbox', '--help']]])(
    'slipway %j loads no Temporal SDK, activities or database client',
    (args) => {
      const run = loadedModules(args);
      expect(run.code).toBe(0);
      expect(run.stdout).toContain('Usage: slipway');
      expect(heavy(run.modules)).toEqual([]);
      // The hook sees modules at all (a broken hook would pass the check above vacuously).
      expect(run.modules.some((m) => m.includes(`${path.sep}commander${path.sep}`))).toBe(true);
    },
  );

  // Group verbs register their commands from their own modules; those load the SDK, the
  // database and the objective loader only when a command runs.
  it.each([['api'], ['mcp'], ['schedules'], ['account'], ['token'], ['project'], ['profile'], ['usage'], ['template'], ['budget'], ['codec-server']])(
    'slipway %s --help loads no Temporal SDK, database client or HTTP server',
    (verb) => {
      const run = loadedModules([verb, '--help']);
      expect(run.code).toBe(0);
      expect(run.stdout).toContain(`Usage: slipway ${verb}`);
      expect(run.modules.filter((m) => /[\\/](@temporalio|@electric-sql|pg|fastify)[\\/]/.test(m))).toEqual([]);
      expect(run.modules.some((m) => m.includes(`${path.sep}commander${path.sep}`))).toBe(true);
    },
  );

  it('top-level help still lists the lazily registered groups, and a group runs its real subcommands', () => {
    const help = loadedModules(['--help']);
    for (const verb of ['worktree', 'trust', 'api', 'account', 'schedules', 'template', 'codec-server']) expect(help.stdout).toMatch(new RegExp(`^  ${verb}\\b`, 'm'));
    const trust = loadedModules(['trust', '--help']);
    expect(trust.code).toBe(0);
    expect(trust.stdout).toContain('--revoke');
  });

  it('every group verb has a description and every description a group (hidden legacy names aside)', () => {
    const verbs = GROUPS.flatMap((g) => g.verbs).filter((v) => v !== 'snapshot');
    expect([...verbs].sort()).toEqual(Object.keys(GROUP_DESCRIPTIONS).sort());
  });

  it('each listed group verb registers its real commands under the same description', () => {
    for (const [verb, description] of Object.entries(GROUP_DESCRIPTIONS)) {
      const run = spawnSync(process.execPath, [COMPILED_BIN, verb, '--help'], { encoding: 'utf8' });
      expect(run.status, `${verb}: ${run.stderr}`).toBe(0);
      expect(run.stdout, verb).toContain(`Usage: slipway ${verb}`);
      expect(run.stdout.replace(/\s+/g, ' '), verb).toContain(description);
    }
  });

  it('an unknown verb is bad input with a suggestion, the groups included', () => {
    const run = spawnSync(process.execPath, [COMPILED_BIN, 'worktre'], { encoding: 'utf8' });
    expect(run.status).toBe(2);
    expect(run.stderr).toContain('worktree');
  });
});
