/**
 * `repository:` as a URL or a bare repository: the pure classification (credentials, schemes),
 * and the objective file's errors naming the field and line, with nothing left behind.
 * Network URLs are classified only: no network here, so fetching is tested with file:// only.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, promises as fs, readdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile, ObjectiveFileError } from '../config/objective-file';
import { classifyRepositorySpec } from '../core/repository-spec';
import { pushToRemote, syncMirror, transportOptions } from '../lib/remote-repository';

describe('classifyRepositorySpec', () => {
  const cases: Array<[string, unknown]> = [
    ['https://example.com/org/repo.git', { kind: 'url', protocol: 'https', hasCredentials: false, display: 'https://example.com/org/repo.git' }],
    ['https://user:s3cret@example.com/r.git', { kind: 'url', protocol: 'https', hasCredentials: true, display: 'https://example.com/r.git' }],
    ['https://ghp_token@example.com/r.git', { kind: 'url', protocol: 'https', hasCredentials: true, display: 'https://example.com/r.git' }],
    ['ssh://git@example.com/r.git', { kind: 'url', protocol: 'ssh', hasCredentials: false }],
    ['ssh://git:pw@example.com/r.git', { kind: 'url', protocol: 'ssh', hasCredentials: true }],
    ['git@github.com:org/repo.git', { kind: 'url', protocol: 'ssh', hasCredentials: false }],
    ['file:///srv/repo.git', { kind: 'url', protocol: 'file', hasCredentials: false }],
    ['../repo', { kind: 'path', path: '../repo' }],
    ['/abs/repo.git', { kind: 'path' }],
    ['~/code/repo', { kind: 'path' }],
    ['./with:colon', { kind: 'path' }],
  ];
  for (const [spec, expected] of cases) {
    it(spec, () => expect(classifyRepositorySpec(spec)).toMatchObject(expected as object));
  }
  it('refuses other schemes naming them', () => {
    expect(() => classifyRepositorySpec('ext::sh -c touch% /tmp/pwned')).not.toThrow(); // a path: it does not exist, refused later
    expect(() => classifyRepositorySpec('ftp://example.com/r.git')).toThrow(/unsupported URL scheme "ftp:\/\/"/);
  });
  it('allows only the URL\'s own transport', () => {
    expect(transportOptions('file')).toEqual(['-c', 'protocol.allow=never', '-c', 'protocol.file.allow=always']);
    expect(transportOptions('https')).toEqual(['-c', 'protocol.allow=never', '-c', 'protocol.https.allow=always']);
  });
});

describe('objective file with a remote repository', () => {
  let root: string;
  let home: string;
  const previousHome = process.env.SLIPWAY_HOME;
  const git = (dir: string, ...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: dir, stdio: 'pipe' }).toString().trim();

  beforeAll(async () => {
    root = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-remote-file-')));
    home = path.join(root, 'home');
    process.env.SLIPWAY_HOME = home;
    const work = path.join(root, 'work');
    await fs.mkdir(work);
    git(work, 'init', '-q', '-b', 'trunk');
    await fs.writeFile(path.join(work, 'README.md'), '# r\n');
    git(work, 'add', '.');
    git(work, 'commit', '-q', '-m', 'init');
    git(root, 'clone', '-q', '--bare', work, 'remote.git');
  });
  afterAll(async () => {
    if (previousHome === undefined) delete process.env.SLIPWAY_HOME;
    else process.env.SLIPWAY_HOME = previousHome;
    await fs.rm(root, { recursive: true, force: true });
  });

  const objective = async (repository: string) => {
    const file = path.join(root, `objective-${Math.random().toString(36).slice(2)}.yaml`);
    await fs.writeFile(file, ['objective: Try', `repository: ${repository}`, 'agents:', '  builder: { provider: script, command: "true" }', 'streams:', '  - { id: a, task: t }', ''].join('\n'));
    return file;
  };
  const problemsOf = async (file: string) => {
    const err = await loadObjectiveFile(file).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(ObjectiveFileError);
    return err as ObjectiveFileError;
  };

  it('a bare repository by path or file:// URL loads onto a clone in $SLIPWAY_HOME/repositories, on the remote default branch', async () => {
    for (const spec of [path.join(root, 'remote.git'), `file://${path.join(root, 'remote.git')}`]) {
      const input = await loadObjectiveFile(await objective(spec));
      expect(path.dirname(input.repository)).toBe(path.join(home, 'repositories'));
      expect(input.baseBranch).toBe('trunk');
      expect(git(input.repository, 'rev-parse', 'HEAD')).toBe(git(path.join(root, 'remote.git'), 'rev-parse', 'trunk'));
    }
  });

  it('a new commit on the remote is fetched before the base is resolved', async () => {
    const bare = path.join(root, 'remote.git');
    const before = await loadObjectiveFile(await objective(bare));
    const work = path.join(root, 'work');
    await fs.writeFile(path.join(work, 'NEW.md'), 'new\n');
    git(work, 'add', '.');
    git(work, 'commit', '-q', '-m', 'new');
    git(work, 'push', '-q', bare, 'trunk');
    const after = await loadObjectiveFile(await objective(bare));
    expect(after.repository).toBe(before.repository);
    expect(git(after.repository, 'rev-parse', 'trunk')).toBe(git(bare, 'rev-parse', 'trunk'));
  });

  it('pushes a branch back, and refuses (reporting it) when the remote branch moved on: never forced', async () => {
    const bare = path.join(root, 'remote.git');
    const { root: clone } = await syncMirror({ url: bare, protocol: 'file' }, undefined);
    git(clone, 'branch', '-f', 'slipway/p/integration', 'trunk');
    expect(await pushToRemote(clone, 'file', 'slipway/p/integration')).toEqual({});
    expect(git(bare, 'rev-parse', 'slipway/p/integration')).toBe(git(clone, 'rev-parse', 'slipway/p/integration'));
    // Someone else's commit lands on the remote branch; ours diverges from it.
    const theirs = git(bare, 'commit-tree', '-p', 'slipway/p/integration', '-m', 'theirs', 'slipway/p/integration^{tree}');
    git(bare, 'update-ref', 'refs/heads/slipway/p/integration', theirs);
    git(clone, 'commit-tree', '-m', 'x', 'trunk^{tree}'); // objects only
    git(clone, 'update-ref', 'refs/heads/slipway/p/integration', git(clone, 'commit-tree', '-p', 'trunk', '-m', 'ours', 'trunk^{tree}'));
    const pushed = await pushToRemote(clone, 'file', 'slipway/p/integration');
    expect(pushed.error).toMatch(/rejected|fetch first|non-fast-forward/);
    expect(git(bare, 'rev-parse', 'slipway/p/integration')).toBe(theirs);
  });

  it('refuses a URL with embedded credentials, naming the field and line, never echoing the secret', async () => {
    const file = await objective('https://me:hunter2secret@example.com/r.git');
    const err = await problemsOf(file);
    expect(err.message).toMatch(new RegExp(`${file.replace(/[.]/g, '\\.')}:2:\\d+: repository: https://example\\.com/r\\.git embeds credentials; .*credential helper`));
    expect(err.message).not.toContain('hunter2secret');
  });

  it('an unreachable URL is a configuration error on the field, leaving no clone behind', async () => {
    const before = existsSync(path.join(home, 'repositories')) ? readdirSync(path.join(home, 'repositories')) : [];
    const file = await objective(`file://${path.join(root, 'nowhere.git')}`);
    const err = await problemsOf(file);
    expect(err.message).toMatch(/:2:\d+: repository: cannot fetch file:\/\/.*nowhere\.git: /);
    const after = existsSync(path.join(home, 'repositories')) ? readdirSync(path.join(home, 'repositories')) : [];
    expect(after.filter((f) => !f.endsWith('.sync'))).toEqual(before.filter((f) => !f.endsWith('.sync')));
  });
});
