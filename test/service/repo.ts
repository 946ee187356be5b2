/** Small git fixtures for the service tests (kept apart from test/sandbox, which has its own). */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, realpathSync, writeFileSync, mkdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const IDENTITY = ['-c', 'user.name=t', '-c', 'user.email=t@t'];

export function sh(cwd: string, command: string): string {
  return execFileSync('/bin/sh', ['-c', command], { cwd, encoding: 'utf8' }).trim();
}

export function gitIn(cwd: string, ...args: string[]): string {
  return execFileSync('git', ['-C', cwd, ...IDENTITY, ...args], { encoding: 'utf8' }).trim();
}

export function tempDir(prefix: string): string {
  return realpathSync(mkdtempSync(path.join(os.tmpdir(), `slipway-${prefix}-`)));
}

/** A repository with a couple of commits, a .gitignore and an ignored dependency folder. */
export function makeServiceRepo(parent = tempDir('svc-repo')): string {
  const repo = path.join(parent, 'repo');
  execFileSync('git', ['init', '-q', '-b', 'main', repo]);
  mkdirSync(path.join(repo, 'src'), { recursive: true });
  writeFileSync(path.join(repo, 'README.md'), 'hello\n');
  writeFileSync(path.join(repo, 'src', 'a.txt'), 'one\n');
  writeFileSync(path.join(repo, 'src', 'b.txt'), 'bee\n');
  writeFileSync(path.join(repo, '.gitignore'), 'node_modules/\ndist/\n');
  gitIn(repo, 'add', '-A');
  gitIn(repo, 'commit', '-q', '-m', 'first');
  mkdirSync(path.join(repo, 'node_modules', 'dep'), { recursive: true });
  writeFileSync(path.join(repo, 'node_modules', 'dep', 'index.js'), 'module.exports = 1;\n');
  return repo;
}
