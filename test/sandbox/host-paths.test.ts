/**
 * A tenant inside a confined sandbox must not learn where it lives on the host: the worktree's
 * path, the repository's or $SLIPWAY_HOME (ADR 0006, "Fixed paths"). Unconfined sandboxes keep
 * host paths; they isolate nothing.
 *
 * Never skips: without bubblewrap it fails and says how to install it.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BWRAP_MISSING_MESSAGE, findExecutable, SANDBOX_WORKSPACE, toSandboxPath } from '../../activities/sandbox/bubblewrap';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { sandboxGitDir } from '../../activities/sandbox/sandbox-git';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { gitIn, IDENTITY_ENV, makeRepo, sandboxRequest, tempDir } from './helpers';

describe('host paths stay outside a confined sandbox', () => {
  let parent: string;
  let repo: string;
  let home: string;
  let confined: LocalSandboxProvider;
  let h: SandboxHandle;
  const savedHome = process.env.SLIPWAY_HOME;

  beforeAll(async () => {
    if (!findExecutable('bwrap')) throw new Error(`the containment suite needs bubblewrap: ${BWRAP_MISSING_MESSAGE}`);
    parent = tempDir('host-paths');
    ({ repo } = makeRepo(parent));
    home = path.join(parent, 'slipway-home');
    await fs.mkdir(home);
    process.env.SLIPWAY_HOME = home;
    confined = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false });
    h = await confined.create(sandboxRequest(repo, 'tenant'));
  });

  afterAll(async () => {
    if (savedHome === undefined) delete process.env.SLIPWAY_HOME;
    else process.env.SLIPWAY_HOME = savedHome;
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  /** Every host path a tenant must not learn. */
  const secrets = () => [h.root, repo, home, parent];

  it('shows nothing of them in env, cwd, .git, git, worktree list or error messages', async () => {
    await fs.mkdir(path.join(h.root, 'sub'));
    // As the API and agent runners pass them: the root in HOME, SLIPWAY_SANDBOX_ROOT, arguments.
    const r = await confined.exec(h, {
      command: '/bin/sh',
      args: [
        '-c',
        [
          'echo "arg=$1"',
          'env',
          'pwd; pwd -P; echo "PWD=$PWD"',
          'cat /workspace/.git',
          'git rev-parse --git-dir --git-common-dir --show-toplevel --absolute-git-dir',
          'git worktree list --porcelain',
          'git status --porcelain',
          'git log -1 --format=%H',
          'cat /workspace/no-such-file; ls /nowhere; git -C /nowhere status; cd "$1/sub" && pwd',
          'echo data > new.txt && git add new.txt && git commit -qm "from inside" && git log -1 --format=%s',
          'readlink /proc/self/cwd',
        ].join('\n'),
        'probe',
        `${h.root}/sub`,
      ],
      cwd: 'sub',
      env: { ...IDENTITY_ENV, HOME: h.root, SLIPWAY_SANDBOX_ROOT: h.root, SLIPWAY_GRANTS_FILE: `${h.root}/.slipway/grants.json`, REPO_HINT: `${repo}/README.md` },
    });
    const out = `${r.stdout}\n${r.stderr}`;
    for (const secret of secrets()) expect(out, `names ${secret}`).not.toContain(secret);
    expect(r.stdout).toContain(`arg=${SANDBOX_WORKSPACE}/sub`);
    expect(r.stdout).toContain(`HOME=${SANDBOX_WORKSPACE}\n`);
    expect(r.stdout).toContain(`SLIPWAY_SANDBOX_ROOT=${SANDBOX_WORKSPACE}\n`);
    expect(r.stdout).toContain(`SLIPWAY_GRANTS_FILE=${SANDBOX_WORKSPACE}/.slipway/grants.json\n`);
    // A value naming the repository itself means nothing inside: dropped, not half-translated.
    expect(r.stdout).not.toContain('REPO_HINT=');
    expect(r.stdout).toContain(`PWD=${SANDBOX_WORKSPACE}/sub\n`);
    expect(r.stdout).toMatch(/^gitdir: \/run\/slipway\/git\/worktrees\/[^\n/]+$/m);
    expect(r.stdout).toContain(`${SANDBOX_WORKSPACE}\n`);
    expect(r.stdout).toContain('from inside');
    // The commit made inside comes back through collect, with the private paths unchanged.
    const { head } = await confined.collect(h);
    expect(gitIn(repo, 'log', '-1', '--format=%s', head)).toBe('from inside');
  });

  it('mends the record of a sandbox made before fixed paths, which named its host path', async () => {
    const records = path.join(sandboxGitDir(repo, h.root), 'worktrees');
    const [id] = await fs.readdir(records);
    await fs.writeFile(path.join(records, id!, 'gitdir'), `${h.root}/.git\n`);
    const r = await confined.exec(h, { command: 'git worktree list --porcelain', shell: true });
    expect(r.stdout).toContain(`worktree ${SANDBOX_WORKSPACE}\n`);
    expect(r.stdout).not.toContain(h.root);
  });

  it('leaves no file it can read naming them: the private git directory, the workspace, /etc, /tmp', async () => {
    await confined.exec(h, { command: 'git status >/dev/null; git gc -q >/dev/null 2>&1; true', shell: true });
    // The repository's path is not under the worktree's, so it reaches the command untranslated.
    // A canary proves the search reads the files: it is the one hit.
    const canary = `canary-${process.pid}-${Date.now()}`;
    await fs.writeFile(path.join(h.root, 'canary.txt'), canary);
    const r = await confined.exec(h, { command: 'grep', args: ['-rIlsF', '-e', repo, '-e', home, '-e', canary, '/run/slipway', SANDBOX_WORKSPACE, '/etc', '/tmp'] });
    expect(r.stdout).toBe(`${SANDBOX_WORKSPACE}/canary.txt\n`);
  });

  it('keeps .git read-only: the tenant cannot point git at another directory', async () => {
    const r = await confined.exec(h, { command: 'echo "gitdir: /tmp" > .git; rm -f .git; mv .git x; cat .git', shell: true });
    expect(r.stdout).toMatch(/^gitdir: \/run\/slipway\/git\/worktrees\//);
    expect(r.stderr).toMatch(/Read-only file system|Device or resource busy/);
  });

  it('takes a cwd in the sandbox\'s own terms, and still refuses one outside it', async () => {
    expect((await confined.exec(h, { command: 'pwd', cwd: `${SANDBOX_WORKSPACE}/sub` })).stdout).toBe(`${SANDBOX_WORKSPACE}/sub\n`);
    expect((await confined.exec(h, { command: 'pwd', cwd: SANDBOX_WORKSPACE })).stdout).toBe(`${SANDBOX_WORKSPACE}\n`);
    await expect(confined.exec(h, { command: 'pwd', cwd: `${SANDBOX_WORKSPACE}/../etc` })).rejects.toThrow(/refused/);
    await expect(confined.exec(h, { command: 'pwd', cwd: h.root })).rejects.toThrow(/refused/);
  });

  it('translates host paths only at path boundaries', () => {
    expect(toSandboxPath(['/r/w'], '/r/w')).toBe('/workspace');
    expect(toSandboxPath(['/r/w'], '--dir=/r/w/src:/r/w')).toBe('--dir=/workspace/src:/workspace');
    expect(toSandboxPath(['/r/w'], '/r/wx/a /r/w.bak')).toBe('/r/wx/a /r/w.bak');
    expect(toSandboxPath(['/tmp/a', '/private/tmp/a'], 'cd /private/tmp/a/s')).toBe('cd /workspace/s');
  });
});
