/**
 * `repository:` as a URL or a bare repository: the pure classification (credentials, schemes),
 * the objective file's errors naming the field and line (the remote is not contacted when the file
 * loads: the owner clones it, docs/adr/0028), and the clone itself, with nothing left behind.
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

  const clones = () => (existsSync(path.join(home, 'repositories')) ? readdirSync(path.join(home, 'repositories')).filter((f) => !f.endsWith('.sync')) : []);

  it('a bare repository by path or file:// URL loads as a remote without contacting it: no clone where the file is loaded', async () => {
    const bare = path.join(root, 'remote.git');
    for (const spec of [bare, `file://${bare}`]) {
      const input = await loadObjectiveFile(await objective(spec));
      expect(input.remote).toEqual({ url: spec, protocol: 'file' });
      expect(input.repository).toBe(spec);
      // The remote's default branch is resolved by the worker that clones it.
      expect(input.baseBranch).toBe('');
    }
    expect(clones()).toEqual([]);
  });

  it('the clone is made on the remote default branch, and a new commit on the remote is fetched before the base is resolved', async () => {
    const bare = path.join(root, 'remote.git');
    const before = await syncMirror({ url: bare, protocol: 'file' }, undefined);
    expect(path.dirname(before.root)).toBe(path.join(home, 'repositories'));
    expect(before.baseBranch).toBe('trunk');
    expect(git(before.root, 'rev-parse', 'HEAD')).toBe(git(bare, 'rev-parse', 'trunk'));
    const work = path.join(root, 'work');
    await fs.writeFile(path.join(work, 'NEW.md'), 'new\n');
    git(work, 'add', '.');
    git(work, 'commit', '-q', '-m', 'new');
    git(work, 'push', '-q', bare, 'trunk');
    const after = await syncMirror({ url: bare, protocol: 'file' }, undefined);
    expect(after.root).toBe(before.root);
    expect(git(after.root, 'rev-parse', 'trunk')).toBe(git(bare, 'rev-parse', 'trunk'));
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

  it('an unreachable URL is not contacted when the file loads (the owner reports it), and leaves no clone behind', async () => {
    const before = clones();
    const url = `file://${path.join(root, 'nowhere.git')}`;
    const input = await loadObjectiveFile(await objective(url));
    expect(input.remote).toEqual({ url, protocol: 'file' });
    expect(clones()).toEqual(before);
    // A failed first clone leaves nothing either (the owner's side, lib/remote-repository.ts).
    await expect(syncMirror({ url, protocol: 'file' }, undefined)).rejects.toThrow(/nowhere\.git/);
    expect(clones()).toEqual(before);
  });

  it('an invalid base_branch of a remote is refused naming the field, without contacting it', async () => {
    const file = path.join(root, 'objective-branch.yaml');
    await fs.writeFile(file, ['objective: Try', `repository: file://${path.join(root, 'nowhere.git')}`, 'agents:', '  builder: { provider: script, command: "true" }', 'streams:', '  - { id: a, task: t }', ''].join('\n'));
    const err = await loadObjectiveFile(file, { baseBranch: '-x' }).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(ObjectiveFileError);
    expect((err as Error).message).toContain('base_branch: "-x" is not a valid branch name (given on the command line)');
  });
});
