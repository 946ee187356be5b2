/** Real git repositories in temporary folders, and a byte-for-byte picture of a user's checkout. */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, lstatSync, readlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const PROJECT_ROOT = path.resolve(__dirname, '..', '..');
export const DEMO_DIR = path.join(PROJECT_ROOT, 'examples', 'demo');

export function tempDir(prefix = 'slipway-test-'): string {
  return mkdtempSync(path.join(os.tmpdir(), prefix));
}

export function sh(cwd: string, command: string, args: string[]): string {
  return execFileSync(command, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
}

export const gitIn = (cwd: string, ...args: string[]) => sh(cwd, 'git', args);

/** The demo's toolkit repository, made by examples/demo/make-repo.sh. */
export function makeDemoRepo(): string {
  const dir = path.join(tempDir('slipway-repo-'), 'toolkit');
  sh(PROJECT_ROOT, 'bash', [path.join(DEMO_DIR, 'make-repo.sh'), dir]);
  return dir;
}

export interface CheckoutPicture {
  branch: string;
  head: string;
  index: string;
  status: string;
  stash: string;
  files: Record<string, string>;
}

/** Everything a user would notice changing in their checkout: branch, HEAD, index, files (tracked or not), stash. */
export function pictureCheckout(repo: string): CheckoutPicture {
  const files: Record<string, string> = {};
  const walk = (dir: string) => {
    for (const entry of readdirSync(dir)) {
      const full = path.join(dir, entry);
      const rel = path.relative(repo, full);
      if (rel === '.git' || rel === '.slipway') continue;
      const stat = lstatSync(full);
      if (stat.isDirectory()) walk(full);
      else if (stat.isSymbolicLink()) files[rel] = `link:${readlinkSync(full)}`;
      else files[rel] = `${stat.mode.toString(8)}:${createHash('sha256').update(readFileSync(full)).digest('hex')}`;
    }
  };
  walk(repo);
  return {
    branch: gitIn(repo, 'rev-parse', '--abbrev-ref', 'HEAD'),
    head: gitIn(repo, 'rev-parse', 'HEAD'),
    index: gitIn(repo, 'ls-files', '--stage'),
    status: gitIn(repo, 'status', '--porcelain', '--untracked-files=all'),
    stash: gitIn(repo, 'stash', 'list'),
    files,
  };
}

/** Leaves the user's checkout "busy": staged, unstaged and untracked changes, and a stash entry. */
export function dirtyTheCheckout(repo: string): void {
  execFileSync('bash', ['-c', [
    'echo "stashed work" >> README.md',
    'git -c user.name=u -c user.email=u@u stash push -q -m "user stash"',
    'echo "// staged edit" >> src/slug.js && git add src/slug.js',
    'echo "unstaged edit" >> README.md',
    'echo "scratch" > notes.txt',
  ].join(' && ')], { cwd: repo });
}

/** A repository with one commit on `main` and nothing else. */
export function makeTinyRepo(): string {
  const repo = tempDir('slipway-tiny-repo-');
  gitIn(repo, 'init', '-q', '-b', 'main');
  writeFileSync(path.join(repo, 'README.md'), '# r\n');
  gitIn(repo, 'add', '.');
  gitIn(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q', '-m', 'init');
  return repo;
}
