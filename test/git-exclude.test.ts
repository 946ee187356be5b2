/**
 * `.git/info/exclude` hides Slipway's state under `.slipway/`, never the files a team shares
 * there (`config.yaml`, `blueprints/`, prompts), and replaces an older Slipway's `/.slipway/` line.
 */
import { execFileSync } from 'node:child_process';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { commonDirOf, ensureSlipwayExcluded } from '../lib/git';
import { SLIPWAY_STATE } from '../core/ids';
import { PROJECT_ROOT } from './helpers/repo';

const roots: string[] = [];
afterAll(async () => {
  for (const r of roots) await fs.rm(r, { recursive: true, force: true });
});

function git(dir: string, ...args: string[]): string {
  return execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: dir, encoding: 'utf8' }).trim();
}

async function makeRepo(): Promise<string> {
  const dir = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-exclude-')));
  roots.push(dir);
  git(dir, 'init', '-q', '-b', 'main');
  await fs.writeFile(path.join(dir, 'README.md'), '# r\n');
  git(dir, 'add', '.');
  git(dir, 'commit', '-q', '-m', 'init');
  return dir;
}

async function put(dir: string, rel: string, text = 'x\n') {
  await fs.mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
  await fs.writeFile(path.join(dir, rel), text);
}

const SHARED = ['.slipway/config.yaml', '.slipway/blueprints/fast.yaml', '.slipway/prompts/builder.md'];
/** One file in every place Slipway writes state. */
const STATE = SLIPWAY_STATE.map((e) => `.slipway/${e.endsWith('/') ? `${e}inner/file` : e}`);

async function expectOnlySharedVisible(repo: string) {
  for (const f of [...SHARED, ...STATE]) await put(repo, f);
  const untracked = git(repo, 'status', '--porcelain', '--untracked-files=all').split('\n').filter(Boolean);
  expect(untracked.sort()).toEqual(SHARED.map((f) => `?? ${f}`).sort());
  // A team can commit them without --force.
  git(repo, 'add', '.slipway/config.yaml', '.slipway/blueprints');
  expect(git(repo, 'diff', '--cached', '--name-only').split('\n').sort()).toEqual(['.slipway/blueprints/fast.yaml', '.slipway/config.yaml']);
}

const excludeOf = (repo: string) => fs.readFile(path.join(repo, '.git', 'info', 'exclude'), 'utf8');

describe('ensureSlipwayExcluded', () => {
  it("hides only Slipway's state: config.yaml, blueprints and prompts stay visible and committable", async () => {
    const repo = await makeRepo();
    await ensureSlipwayExcluded(repo);
    const text = await excludeOf(repo);
    expect(text).not.toMatch(/^\/\.slipway\/$/m);
    await expectOnlySharedVisible(repo);
    // Again: nothing changes.
    await ensureSlipwayExcluded(repo);
    expect(await excludeOf(repo)).toBe(text);
  });

  it('replaces the /.slipway/ line of an older Slipway in place, keeping the user\'s own lines', async () => {
    const repo = await makeRepo();
    const old = ['# git ls-files --others --exclude-from=.git/info/exclude', '*.log', '# added by Slipway: its worktrees and state', '/.slipway/', '/build/', ''].join('\n');
    await fs.writeFile(path.join(repo, '.git', 'info', 'exclude'), old);
    await ensureSlipwayExcluded(repo);
    const lines = (await excludeOf(repo)).split('\n');
    expect(lines).not.toContain('/.slipway/');
    expect(lines).not.toContain('# added by Slipway: its worktrees and state');
    expect(lines.slice(0, 2)).toEqual(['# git ls-files --others --exclude-from=.git/info/exclude', '*.log']);
    expect(lines[2]).toMatch(/^# added by Slipway: /);
    expect(lines.slice(3, 3 + SLIPWAY_STATE.length)).toEqual(SLIPWAY_STATE.map((e) => `/.slipway/${e}`));
    expect(lines.slice(3 + SLIPWAY_STATE.length)).toEqual(['/build/', '']);
    await expectOnlySharedVisible(repo);
    const migrated = await excludeOf(repo);
    await ensureSlipwayExcluded(repo);
    expect(await excludeOf(repo)).toBe(migrated);
  });

  it('adds entries a newer Slipway knows to an existing list', async () => {
    const repo = await makeRepo();
    await fs.writeFile(path.join(repo, '.git', 'info', 'exclude'), '# added by Slipway: its state\n/.slipway/worktrees/\n*.tmp');
    await ensureSlipwayExcluded(repo);
    const lines = (await excludeOf(repo)).split('\n').filter(Boolean);
    expect(lines.filter((l) => l === '/.slipway/worktrees/')).toHaveLength(1);
    expect(lines).toContain('*.tmp');
    for (const e of SLIPWAY_STATE) expect(lines).toContain(`/.slipway/${e}`);
    await expectOnlySharedVisible(repo);
  });

  it("a sandbox worktree's grants.json stays out of its commits", async () => {
    const repo = await makeRepo();
    await ensureSlipwayExcluded(repo);
    const wt = path.join(repo, '.slipway', 'worktrees', 'obj', 's');
    git(repo, 'worktree', 'add', '-q', '-b', 'slipway/obj/s', wt);
    await put(wt, '.slipway/grants.json', '{"token":"secret"}\n');
    await put(wt, 'src/work.txt');
    git(wt, 'add', '-A');
    expect(git(wt, 'diff', '--cached', '--name-only')).toBe('src/work.txt');
    expect(git(repo, 'status', '--porcelain', '--untracked-files=all')).toBe('');
  });

  it('lists every place the code writes under .slipway/ (a new one must be added to SLIPWAY_STATE)', async () => {
    const files: string[] = [];
    for (const dir of ['activities', 'core', 'workers', 'api', 'cli']) {
      for (const entry of await fs.readdir(path.join(PROJECT_ROOT, dir), { recursive: true })) if (String(entry).endsWith('.ts')) files.push(path.join(PROJECT_ROOT, dir, String(entry)));
    }
    const written = new Set<string>();
    const patterns = [/\$\{SLIPWAY_DIR\}\/([\w.-]+)/g, /SLIPWAY_DIR,\s*'([\w.-]+)'/g, /'\.slipway',\s*'([\w.-]+)'/g, /'\.slipway\/([\w.-]+)/g];
    for (const file of files) {
      if (file.endsWith(path.join('sandbox', 'limits.ts'))) continue; // its own SLIPWAY_DIR: a cgroup folder
      const text = await fs.readFile(file, 'utf8');
      for (const re of patterns) for (const m of text.matchAll(re)) written.add(m[1]!);
    }
    const shared = ['config.yaml', 'blueprints'];
    const state = SLIPWAY_STATE.map((e) => e.replace(/\/$/, ''));
    expect(written.size).toBeGreaterThan(5);
    expect([...written].filter((name) => !shared.includes(name) && !state.includes(name)).sort()).toEqual([]);
  });

  it('asks git for the git dir each time: a repository deleted and made again at the same path is never written through a remembered answer', async () => {
    const repo = await makeRepo();
    await ensureSlipwayExcluded(repo);
    // Remembered for the readers (lock clears, confined execs)...
    expect(await commonDirOf(repo)).toBe(path.join(repo, '.git'));
    // ...the repository goes, and a plain folder takes its place.
    await fs.rm(repo, { recursive: true, force: true });
    await fs.mkdir(repo);
    await expect(ensureSlipwayExcluded(repo)).rejects.toThrow();
    // Nothing made where no repository is (a stray .git/info would be found by git as one).
    expect(await fs.readdir(repo)).toEqual([]);
    // And made again as a linked worktree of another repository: its own common dir is the answer.
    await fs.rmdir(repo);
    const other = await makeRepo();
    git(other, 'worktree', 'add', '-q', repo);
    await ensureSlipwayExcluded(repo);
    expect(await fs.readFile(path.join(other, '.git', 'info', 'exclude'), 'utf8')).toContain('/.slipway/');
    expect(await commonDirOf(repo)).toBe(path.join(other, '.git'));
  });
});
