/**
 * The commit identity Slipway gives agent runs, commits in sandboxes and merges: the repository's
 * `user.name` and `user.email` as `git config <key>` answers them (every scope, the last value of
 * a key wins), read in one git call; Slipway's own identity where one is missing or empty; and in
 * `commitIdentityEnv`, the worker's GIT_AUTHOR_* and GIT_COMMITTER_* win over Slipway's.
 */
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { SLIPWAY_GIT_IDENTITY, commitIdentity, commitIdentityEnv, commitIdentityVariables } from '../lib/git';
import { makeTinyRepo, tempDir } from './helpers/repo';

const IDENTITY_VARS = ['GIT_AUTHOR_NAME', 'GIT_AUTHOR_EMAIL', 'GIT_COMMITTER_NAME', 'GIT_COMMITTER_EMAIL'];
let saved: Record<string, string | undefined>;

beforeEach(() => {
  saved = Object.fromEntries(['HOME', 'XDG_CONFIG_HOME', ...IDENTITY_VARS].map((k) => [k, process.env[k]]));
  // A global config of the test's own: the machine's (which may name a user) is not read.
  const home = tempDir('slipway-identity-home-');
  process.env.HOME = home;
  process.env.XDG_CONFIG_HOME = path.join(home, '.config');
  for (const k of IDENTITY_VARS) delete process.env[k];
});
afterEach(() => {
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
});

const config = (repo: string, ...args: string[]) => execFileSync('git', ['-C', repo, 'config', ...args]);

describe('commit identity', () => {
  it("is the repository's, the last value of a key winning, across scopes", async () => {
    // makeTinyRepo names no user in the repository's config.
    const repo = makeTinyRepo();
    writeFileSync(path.join(process.env.HOME!, '.gitconfig'), '[user]\n\tname = Global Name\n\temail = global@example.com\n');
    expect(await commitIdentity(repo)).toEqual({ name: 'Global Name', email: 'global@example.com' });
    // The repository's own config comes after the global one; of two values the last wins.
    config(repo, '--add', 'user.name', 'First Local');
    config(repo, '--add', 'user.name', 'Second  Local = name');
    expect(await commitIdentity(repo)).toEqual({ name: 'Second  Local = name', email: 'global@example.com' });
    expect(await commitIdentityVariables(repo)).toEqual({
      GIT_AUTHOR_NAME: 'Second  Local = name',
      GIT_COMMITTER_NAME: 'Second  Local = name',
      GIT_AUTHOR_EMAIL: 'global@example.com',
      GIT_COMMITTER_EMAIL: 'global@example.com',
    });
    // Found: nothing for the environment to add.
    expect(await commitIdentityEnv(repo)).toEqual({});
    // What `git config user.name` answers is what Slipway reads.
    expect(execFileSync('git', ['-C', repo, 'config', 'user.name'], { encoding: 'utf8' }).trim()).toBe('Second  Local = name');
  });

  it("is Slipway's where a key is missing, empty or has no value, and in a folder that is no repository", async () => {
    const repo = makeTinyRepo();
    expect(await commitIdentity(repo)).toEqual(SLIPWAY_GIT_IDENTITY);
    // A key without a value (`name` alone) and an empty one count as missing.
    writeFileSync(path.join(process.env.HOME!, '.gitconfig'), '[user]\n\tname\n\temail = \n');
    expect(await commitIdentity(repo)).toEqual(SLIPWAY_GIT_IDENTITY);
    config(repo, 'user.email', 'local@example.com');
    expect(await commitIdentity(repo)).toEqual({ name: SLIPWAY_GIT_IDENTITY.name, email: 'local@example.com' });
    expect(await commitIdentity(tempDir('slipway-not-a-repo-'))).toEqual(SLIPWAY_GIT_IDENTITY);
  });

  it("commitIdentityEnv fills only what neither the repository nor the worker's environment names", async () => {
    const repo = makeTinyRepo();
    expect(await commitIdentityEnv(repo)).toEqual({
      GIT_AUTHOR_NAME: SLIPWAY_GIT_IDENTITY.name,
      GIT_COMMITTER_NAME: SLIPWAY_GIT_IDENTITY.name,
      GIT_AUTHOR_EMAIL: SLIPWAY_GIT_IDENTITY.email,
      GIT_COMMITTER_EMAIL: SLIPWAY_GIT_IDENTITY.email,
    });
    process.env.GIT_AUTHOR_NAME = 'From The Environment';
    config(repo, 'user.email', 'local@example.com');
    expect(await commitIdentityEnv(repo)).toEqual({ GIT_COMMITTER_NAME: SLIPWAY_GIT_IDENTITY.name });
  });
});
