/**
 * The contract every sandbox provider passes (local, local + bubblewrap, and later Daytona
 * and Kubernetes). Call `describeSandboxContract(name, makeProvider)` from a test file.
 *
 * The suite makes a real git repository in a temp folder and a folder next to it that stands
 * for "outside the sandbox". `makeProvider` is called once for the suite and again to check
 * that a fresh instance rediscovers what the first one made.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { FileTooLargeError } from '../../activities/sandbox/file-io';
import { PathEscapeError } from '../../activities/sandbox/paths';
import { SessionRequestError } from '../../activities/sandbox/session';
import { SANDBOX_WORKSPACE } from '../../activities/sandbox/bubblewrap';
import { clearSandboxGitLocks } from '../../activities/sandbox/commit-work';
import type { SandboxCreateRequest, SandboxHandle, SandboxProvider, SandboxSession } from '../../activities/sandbox/provider';
import { exists, gitIn, makeRepo, processesWith, tempDir, waitFor } from './helpers';

export interface SandboxContractOptions {
  /**
   * True while a process whose command line contains `marker` still runs anywhere the
   * sandbox's commands run. Default: scans this host's /proc (right for local providers).
   */
  processRunning?: (marker: string) => Promise<boolean>;
  /**
   * Where the sandbox's commands see its workspace, for a remote provider whose path is its own
   * (Daytona: ~/workspace in the remote sandbox). Default: the fixed confined path, else the root.
   */
  workspacePath?: (handle: SandboxHandle) => Promise<string>;
}

const hostProcessRunning = async (marker: string) => (await processesWith(marker)).length > 0;

export function describeSandboxContract(
  name: string,
  makeProvider: () => SandboxProvider | Promise<SandboxProvider>,
  options: SandboxContractOptions = {},
): void {
  const processRunning = options.processRunning ?? hostProcessRunning;

  describe(`sandbox contract: ${name}`, () => {
    let parent: string;
    let repo: string;
    let first: string;
    let second: string;
    let outside: string;
    let provider: SandboxProvider;
    let shared: SandboxHandle;
    let counter = 0;

    const request = (label: string, extra: Partial<SandboxCreateRequest> = {}): SandboxCreateRequest => ({
      sandboxId: `contract.${label}`,
      repository: repo,
      group: 'contract',
      name: label,
      branch: `slipway/contract/${label}`,
      base: 'main',
      ...extra,
    });
    const marker = () => `${900 + ++counter}.${process.pid}${Math.floor(Math.random() * 1e5)}`;

    beforeAll(async () => {
      parent = tempDir('contract');
      ({ repo, first, second } = makeRepo(parent));
      outside = path.join(parent, 'outside');
      await fs.mkdir(outside);
      await fs.writeFile(path.join(outside, 'secret.txt'), 'secret\n');
      await fs.mkdir(path.join(outside, 'deep'));
      provider = await makeProvider();
      shared = await provider.create(request('shared'));
    });

    afterAll(async () => {
      if (parent) await fs.rm(parent, { recursive: true, force: true });
    });

    describe('create', () => {
      it('creates a sandbox on a new branch at the base commit', async () => {
        const handle = await provider.create(request('from-commit', { base: first }));
        expect(handle.reused).toBe(false);
        expect(handle.branch).toBe('slipway/contract/from-commit');
        expect(handle.baseCommit).toBe(first);
        expect(handle.headCommit).toBe(first);
        expect(path.isAbsolute(handle.root)).toBe(true);
        expect(gitIn(repo, 'rev-parse', 'refs/heads/slipway/contract/from-commit')).toBe(first);
        const head = await provider.exec(handle, { command: 'git rev-parse HEAD && git symbolic-ref --short HEAD', shell: true });
        expect(head.exitCode).toBe(0);
        expect(head.stdout.trim().split('\n')).toEqual([first, 'slipway/contract/from-commit']);
        expect((await provider.readFile(handle, 'src/a.txt')).toString()).toBe('one\n');
      });

      it('starts from a branch name at its tip', async () => {
        expect(shared.baseCommit).toBe(second);
        expect(shared.headCommit).toBe(second);
        expect((await provider.readFile(shared, 'src/a.txt')).toString()).toBe('one\ntwo\n');
      });

      it('is idempotent: the same request reuses the sandbox and creates nothing twice', async () => {
        const req = request('idempotent');
        const one = await provider.create(req);
        await provider.writeFile(one, 'work-in-progress.txt', 'keep me');
        const worktreesBefore = gitIn(repo, 'worktree', 'list', '--porcelain');
        const branchesBefore = gitIn(repo, 'branch', '--list', '--format=%(refname)');
        const two = await provider.create(req);
        expect(two.reused).toBe(true);
        expect(two.root).toBe(one.root);
        expect(two.branch).toBe(one.branch);
        expect(two.headCommit).toBe(one.headCommit);
        expect((await provider.readFile(two, 'work-in-progress.txt')).toString()).toBe('keep me');
        expect(gitIn(repo, 'worktree', 'list', '--porcelain')).toBe(worktreesBefore);
        expect(gitIn(repo, 'branch', '--list', '--format=%(refname)')).toBe(branchesBefore);
        expect((await provider.list(repo)).filter((s) => s.root === one.root)).toHaveLength(1);
      });
    });

    describe('exec', () => {
      it('streams stdout and stderr lines in order', async () => {
        const lines: string[] = [];
        const result = await provider.exec(shared, {
          command: 'for i in 1 2 3 4 5; do echo "out $i"; done; echo "err 1" >&2; printf "no newline"',
          shell: true,
          onLine: (stream, line) => lines.push(`${stream}:${line}`),
        });
        expect(result.exitCode).toBe(0);
        expect(lines.filter((l) => l.startsWith('stdout:'))).toEqual(['stdout:out 1', 'stdout:out 2', 'stdout:out 3', 'stdout:out 4', 'stdout:out 5', 'stdout:no newline']);
        expect(lines.filter((l) => l.startsWith('stderr:'))).toEqual(['stderr:err 1']);
        expect(result.stdout).toBe('out 1\nout 2\nout 3\nout 4\nout 5\nno newline');
      });

      it('runs an executable with arguments, no shell', async () => {
        const result = await provider.exec(shared, { command: 'printf', args: ['%s|', 'a b', '$HOME', ';'] });
        expect(result.exitCode).toBe(0);
        expect(result.stdout).toBe('a b|$HOME|;|');
      });

      it('reports the exit code', async () => {
        const result = await provider.exec(shared, { command: 'exit 7', shell: true });
        expect(result.exitCode).toBe(7);
        expect(result.timedOut).toBe(false);
        expect(result.cancelled).toBe(false);
      });

      it('feeds stdin', async () => {
        const result = await provider.exec(shared, { command: 'cat', stdin: 'hello\nworld\n' });
        expect(result.stdout).toBe('hello\nworld\n');
      });

      it('passes env', async () => {
        const result = await provider.exec(shared, { command: 'printf "%s" "$SLIPWAY_CONTRACT_VAR"', shell: true, env: { SLIPWAY_CONTRACT_VAR: 'value with spaces' } });
        expect(result.stdout).toBe('value with spaces');
      });

      it('runs in the sandbox root by default and in a relative cwd', async () => {
        const atRoot = await provider.exec(shared, { command: 'pwd -P', shell: true });
        // A confined sandbox sees itself at a fixed path, never its host path (ADR 0006).
        const confined = (provider as { confined?: boolean }).confined === true;
        const expected = options.workspacePath ? await options.workspacePath(shared) : confined ? SANDBOX_WORKSPACE : await fs.realpath(shared.root).catch(() => shared.root);
        expect(atRoot.stdout.trim()).toBe(expected);
        await provider.writeFile(shared, 'deep/er/file.txt', 'x');
        const inSub = await provider.exec(shared, { command: 'pwd -P && ls', shell: true, cwd: 'deep/er' });
        expect(inSub.stdout.trim().split('\n')).toEqual([path.join(atRoot.stdout.trim(), 'deep', 'er'), 'file.txt']);
      });

      it('refuses a cwd that escapes the sandbox', async () => {
        await expect(provider.exec(shared, { command: 'pwd', cwd: '../..' })).rejects.toBeInstanceOf(PathEscapeError);
        await expect(provider.exec(shared, { command: 'pwd', cwd: '/' })).rejects.toBeInstanceOf(PathEscapeError);
        await expect(provider.exec(shared, { command: 'pwd', cwd: 'src/../../..' })).rejects.toBeInstanceOf(PathEscapeError);
        const link = await provider.exec(shared, { command: `ln -sfn '${outside}' cwd-out`, shell: true });
        expect(link.exitCode).toBe(0);
        await expect(provider.exec(shared, { command: 'pwd', cwd: 'cwd-out' })).rejects.toBeInstanceOf(PathEscapeError);
      });

      it('kills the whole process group on timeout', async () => {
        // The timeout must fire after the command started, or the test proves nothing; starting
        // (podman exec, an API server's exec) can outlast a short timeout on a loaded machine,
        // so a run that ended before 'started' is retried with a longer one.
        for (const timeoutMs of [400, 2_000, 10_000]) {
          const m = marker();
          const result = await provider.exec(shared, { command: `sleep ${m} & echo started; sleep 60`, shell: true, timeoutMs });
          expect(result.timedOut).toBe(true);
          expect(result.exitCode).not.toBe(0);
          if (!result.stdout.includes('started') && timeoutMs < 10_000) continue;
          expect(result.stdout).toContain('started');
          expect(await waitFor(async () => !(await processRunning(m)))).toBe(true);
          return;
        }
      });

      it('kills the whole process group on cancellation', async () => {
        const m = marker();
        const controller = new AbortController();
        const result = await provider.exec(shared, {
          command: `sleep ${m} & echo started; sleep 60`,
          shell: true,
          signal: controller.signal,
          onLine: (_stream, line) => {
            if (line === 'started') setTimeout(() => controller.abort(), 50);
          },
        });
        expect(result.cancelled).toBe(true);
        expect(result.timedOut).toBe(false);
        expect(await waitFor(async () => !(await processRunning(m)))).toBe(true);
      });

      it('does not start a command when already cancelled', async () => {
        const controller = new AbortController();
        controller.abort();
        const result = await provider.exec(shared, { command: 'touch should-not-exist', shell: true, signal: controller.signal });
        expect(result.cancelled).toBe(true);
        await expect(provider.readFile(shared, 'should-not-exist')).rejects.toThrow();
      });
    });

    // A provider without interactive sessions (SandboxProvider.sessions === false) refuses them
    // with a SessionRequestError; the suite checks that instead of running the session tests.
    const sessions = () => provider.sessions !== false;
    it('refuses interactive sessions with a clear error when the provider has none', async (ctx) => {
      if (sessions()) return ctx.skip();
      await expect(provider.openSession(shared, { command: 'true' })).rejects.toBeInstanceOf(SessionRequestError);
    });

    describe('sessions', () => {
      // The provider is made in beforeAll, so which of the two applies is known only here.
      beforeEach((ctx) => {
        if (!sessions()) ctx.skip();
      });
      /** Everything the session printed so far (stdout and stderr), read as it comes. */
      const output = (session: SandboxSession) => {
        const seen = { text: '', ended: Promise.all([ended(session.stdout), ended(session.stderr)]) };
        session.stdout.on('data', (d: Buffer) => (seen.text += d.toString()));
        session.stderr.on('data', (d: Buffer) => (seen.text += d.toString()));
        return seen;
      };
      const ended = (stream: NodeJS.ReadableStream) => new Promise<void>((resolve) => stream.once('end', resolve));
      const confined = () => (provider as { confined?: boolean }).confined === true;

      it('echoes what it is given on stdin and reports the exit code', async () => {
        const session = await provider.openSession(shared, { command: 'cat; echo err >&2; exit 7', shell: true });
        expect(session.pty).toBe(false);
        const out: Buffer[] = [];
        const err: Buffer[] = [];
        session.stdout.on('data', (d: Buffer) => out.push(d));
        session.stderr.on('data', (d: Buffer) => err.push(d));
        const done = Promise.all([ended(session.stdout), ended(session.stderr)]);
        session.stdin.write(Buffer.from([0x68, 0x69, 0x00, 0xff, 0x0a]));
        session.stdin.end('bye\n');
        expect(await session.exit).toEqual({ exitCode: 7, signal: null });
        await done;
        expect([...Buffer.concat(out)]).toEqual([0x68, 0x69, 0x00, 0xff, 0x0a, ...Buffer.from('bye\n')]);
        expect(Buffer.concat(err).toString()).toBe('err\n');
      });

      it('under a pty the command sees a terminal, and resize changes its size', async () => {
        const session = await provider.openSession(shared, {
          command: 'test -t 0 && test -t 1 && echo "tty: yes"; echo "term: $TERM"; while read line; do stty size; done',
          shell: true,
          pty: { cols: 80, rows: 24 },
        });
        expect(session.pty).toBe(true);
        const seen = output(session);
        session.stdin.write('\n');
        expect(await waitFor(async () => seen.text.includes('24 80'), 30_000), seen.text).toBe(true);
        expect(seen.text).toContain('tty: yes');
        expect(seen.text).toContain('term: xterm-256color');
        session.resize(132, 50);
        // The resize reaches the terminal on its own pipe: ask again until the new size shows.
        expect(await waitFor(async () => (session.stdin.write('\n'), seen.text.includes('50 132')), 30_000), seen.text).toBe(true);
        session.stdin.write('\x04'); // ^D: end of input at the terminal
        expect((await session.exit).exitCode).toBe(0);
        expect(() => session.resize(0, 10)).toThrow(/resize.cols/);
      });

      it.each([
        ['a partial line', 'last words', 'LAST WORDS'],
        ['whole lines', 'one\ntwo\n', 'TWO'],
        ['nothing', '', undefined],
      ])('under a pty, closing stdin after %s ends the input as ^D typed at a terminal does', async (_what, input, upper) => {
        const session = await provider.openSession(shared, { command: 'tr a-z A-Z; echo "input ended"', shell: true, pty: { cols: 80, rows: 24 } });
        const seen = output(session);
        session.stdin.end(input);
        expect((await session.exit).exitCode).toBe(0);
        await seen.ended;
        expect(seen.text).toContain('input ended');
        // What tr read (the terminal's echo is in lower case).
        if (upper !== undefined) expect(seen.text).toContain(upper);
      });

      it('under a pty, SIGINT reaches the foreground command as ^C does; the exit code comes back', async () => {
        const session = await provider.openSession(shared, {
          command: 'trap "echo interrupted; exit 4" INT; echo ready; while :; do sleep 1; done',
          shell: true,
          pty: { cols: 80, rows: 24 },
        });
        const seen = output(session);
        expect(await waitFor(async () => seen.text.includes('ready'), 30_000)).toBe(true);
        session.signal('SIGINT');
        expect((await session.exit).exitCode).toBe(4);
        await seen.ended;
        expect(seen.text).toContain('interrupted');
      });

      it('signal reaches the command without a pty', async () => {
        const session = await provider.openSession(shared, { command: 'trap "echo terminated; exit 5" TERM; echo ready; while :; do sleep 1; done', shell: true });
        const seen = output(session);
        expect(await waitFor(async () => seen.text.includes('ready'), 30_000)).toBe(true);
        session.signal('SIGTERM');
        expect((await session.exit).exitCode).toBe(5);
        expect(seen.text).toContain('terminated');
      });

      it.each([false, true])('kill leaves no process behind (pty: %s)', async (pty) => {
        const m = marker();
        const session = await provider.openSession(shared, { command: `sleep ${m} & echo started; sleep 60`, shell: true, ...(pty ? { pty: { cols: 80, rows: 24 } } : {}) });
        const seen = output(session);
        expect(await waitFor(async () => seen.text.includes('started'), 30_000)).toBe(true);
        expect(await processRunning(m)).toBe(true);
        session.kill();
        await session.exit;
        expect(await waitFor(async () => !(await processRunning(m)), 30_000)).toBe(true);
      });

      it('runs where exec runs, and a confined session sees no host path', async () => {
        const session = await provider.openSession(shared, { command: `pwd -P; ls '${outside}' || echo no-outside; cat '${path.join(outside, 'secret.txt')}' || echo no-secret`, shell: true, pty: { cols: 80, rows: 24 } });
        const seen = output(session);
        await session.exit;
        await seen.ended;
        const lines = seen.text.split(/\r?\n/);
        if (confined()) {
          expect(lines[0]).toBe(SANDBOX_WORKSPACE);
          expect(seen.text).toContain('no-outside');
          expect(seen.text).toContain('no-secret');
          expect(lines).not.toContain('secret');
          expect(seen.text).not.toContain(shared.root);
        } else {
          expect(lines[0]).toBe(options.workspacePath ? await options.workspacePath(shared) : await fs.realpath(shared.root));
        }
        await expect(provider.openSession(shared, { command: 'pwd', cwd: '../..' })).rejects.toBeInstanceOf(PathEscapeError);
      });
    });

    describe('files', () => {
      it('writes, reads and deletes files, creating folders', async () => {
        await provider.writeFile(shared, 'files/a/b.txt', 'content');
        await provider.writeFile(shared, 'files/bin.dat', Buffer.from([0, 1, 2, 255]));
        expect((await provider.readFile(shared, 'files/a/b.txt')).toString()).toBe('content');
        expect([...(await provider.readFile(shared, 'files/bin.dat'))]).toEqual([0, 1, 2, 255]);
        const seen = await provider.exec(shared, { command: 'cat files/a/b.txt', shell: true });
        expect(seen.stdout).toBe('content');
        await provider.writeFile(shared, 'files/a/b.txt', 'replaced');
        expect((await provider.readFile(shared, 'files/a/b.txt')).toString()).toBe('replaced');
        await provider.deleteFile(shared, 'files/a/b.txt');
        await expect(provider.readFile(shared, 'files/a/b.txt')).rejects.toThrow(/ENOENT|no such file/i);
        await provider.deleteFile(shared, 'files/a/b.txt'); // deleting what is gone is fine
      });

      it('sees files written by commands', async () => {
        await provider.exec(shared, { command: 'printf made > by-command.txt', shell: true });
        expect((await provider.readFile(shared, 'by-command.txt')).toString()).toBe('made');
      });

      it('lists a folder (links not followed, reserved names left out) and opens a file with its size first, capped', async () => {
        const made = await provider.exec(shared, { command: 'mkdir -p listed/sub listed/.git && printf 12345 > listed/five && ln -sfn five listed/ln', shell: true });
        expect(made.exitCode, made.stderr).toBe(0);
        const reserved = { reservedNames: ['.git', '.slipway'] };
        expect(await provider.listFiles(shared, 'listed', reserved)).toEqual([
          { name: 'five', type: 'file', size: 5 },
          { name: 'ln', type: 'symlink', size: expect.any(Number) },
          { name: 'sub', type: 'directory', size: expect.any(Number) },
        ]);
        await expect(provider.listFiles(shared, 'listed/five')).rejects.toThrow(/ENOTDIR|not a directory/);
        const opened = await provider.openFile(shared, 'listed/ln', { maxBytes: 5 });
        expect(opened.size).toBe(5);
        expect(Buffer.concat(await opened.stream.toArray()).toString()).toBe('12345');
        await expect(provider.openFile(shared, 'listed/five', { maxBytes: 4 })).rejects.toBeInstanceOf(FileTooLargeError);
        for (const op of [() => provider.readFile(shared, 'listed/.git/x', reserved), () => provider.writeFile(shared, 'listed/.git/x', 'no', reserved), () => provider.listFiles(shared, 'listed/.git', reserved)]) {
          await expect(op()).rejects.toBeInstanceOf(PathEscapeError);
        }
      });

      it('accepts names that merely start with two dots', async () => {
        await provider.writeFile(shared, '..dotted', 'ok');
        expect((await provider.readFile(shared, '..dotted')).toString()).toBe('ok');
      });
    });

    describe('path escapes are refused with PathEscapeError', () => {
      const secret = () => path.join(outside, 'secret.txt');
      const ops = (p: string) => [
        () => provider.readFile(shared, p),
        () => provider.writeFile(shared, p, 'pwned'),
        () => provider.deleteFile(shared, p),
      ];

      beforeAll(async () => {
        const links = [
          `ln -sfn '${secret()}' link-out`, // a link to a file outside
          `ln -sfn '${outside}' dir-out`, // a symlinked parent directory
          `ln -sfn '${path.join(outside, 'created-by-dangling')}' dangling-out`, // dangling, outside
          `ln -sfn chain-2 chain-1 && ln -sfn '${path.join(outside, 'created-by-chain')}' chain-2`, // dangling chain
          `ln -sfn ../../../../../../../../../../../tmp relative-out`, // relative, climbing out
          `mkdir -p inner && ln -sfn ../dir-out/secret.txt inner/via-parent`, // inside link to an outside link
          // `..` after a link climbs from where the link leads (outside/deep/.. = outside), not lexically.
          `ln -sfn '${path.join(outside, 'deep')}' deep-out && ln -sfn deep-out/../created-by-dotdot dotdot-out`,
        ];
        const result = await provider.exec(shared, { command: links.join(' && '), shell: true });
        expect(result.exitCode, result.stderr).toBe(0);
      });

      it('refuses ..', async () => {
        for (const p of ['../x', '../../../../etc/passwd', 'src/../../x', '..']) {
          for (const op of ops(p)) await expect(op()).rejects.toBeInstanceOf(PathEscapeError);
        }
      });

      it('refuses absolute paths', async () => {
        for (const p of ['/etc/passwd', secret(), path.join(shared.root, 'README.md')]) {
          for (const op of ops(p)) await expect(op()).rejects.toBeInstanceOf(PathEscapeError);
        }
      });

      it('refuses a symlink inside pointing outside', async () => {
        await expect(provider.readFile(shared, 'link-out')).rejects.toBeInstanceOf(PathEscapeError);
        await expect(provider.writeFile(shared, 'link-out', 'pwned')).rejects.toBeInstanceOf(PathEscapeError);
        await expect(provider.readFile(shared, 'inner/via-parent')).rejects.toBeInstanceOf(PathEscapeError);
        await expect(provider.writeFile(shared, 'inner/via-parent', 'pwned')).rejects.toBeInstanceOf(PathEscapeError);
        await expect(provider.readFile(shared, 'relative-out')).rejects.toBeInstanceOf(PathEscapeError);
        expect(await fs.readFile(secret(), 'utf8')).toBe('secret\n');
      });

      it('refuses dangling symlinks pointing outside, directly or through a chain', async () => {
        for (const p of ['dangling-out', 'chain-1', 'chain-2', 'dotdot-out']) {
          await expect(provider.writeFile(shared, p, 'pwned')).rejects.toBeInstanceOf(PathEscapeError);
          await expect(provider.readFile(shared, p)).rejects.toBeInstanceOf(PathEscapeError);
        }
        expect(await exists(path.join(outside, 'created-by-dangling'))).toBe(false);
        expect(await exists(path.join(outside, 'created-by-chain'))).toBe(false);
        expect(await exists(path.join(outside, 'created-by-dotdot'))).toBe(false);
      });

      it('refuses a path through a symlinked parent directory', async () => {
        for (const p of ['dir-out/secret.txt', 'dir-out/new.txt', 'dir-out/sub/new.txt', 'relative-out/x']) {
          for (const op of ops(p)) await expect(op()).rejects.toBeInstanceOf(PathEscapeError);
        }
        expect(await exists(path.join(outside, 'new.txt'))).toBe(false);
        expect(await exists(path.join(outside, 'sub'))).toBe(false);
        expect(await fs.readFile(secret(), 'utf8')).toBe('secret\n');
      });

      it('deleting a symlink removes the link, never its target', async () => {
        await provider.exec(shared, { command: `ln -sfn '${secret()}' link-to-delete`, shell: true });
        await provider.deleteFile(shared, 'link-to-delete');
        const left = await provider.exec(shared, { command: 'ls -A', shell: true });
        expect(left.stdout.split('\n')).not.toContain('link-to-delete');
        expect(await fs.readFile(secret(), 'utf8')).toBe('secret\n');
      });
    });

    describe('git locks', () => {
      it("a dead git's stale lock is removed before the next git; a held or young one stays", async () => {
        const h = await provider.create(request('locks'));
        // Where this sandbox's git keeps its locks, as the sandbox sees them.
        const where = await provider.exec(h, { command: 'git', args: ['rev-parse', '--git-path', 'index.lock', '--git-path', 'HEAD.lock', '--git-path', 'config.lock'] });
        expect(where.exitCode, where.stderr).toBe(0);
        const [index, held, young] = where.stdout.trim().split('\n') as [string, string, string];
        // index.lock and HEAD.lock as a killed git leaves them (a minute old); config.lock young
        // whatever an exec costs here: written "in ten minutes" (a clock ahead counts as young).
        const made = await provider.exec(h, { command: '/bin/sh', args: ['-c', 'now=$(date +%s); touch -d "@$((now - 60))" "$1" "$2" && touch -d "@$((now + 600))" "$3"', '_', index, held, young] });
        expect(made.exitCode, made.stderr).toBe(0);
        const present = async () => (await provider.exec(h, { command: '/bin/sh', args: ['-c', 'for f in "$@"; do [ -e "$f" ] && echo "$f"; done; true', '_', index, held, young] })).stdout.trim().split('\n').filter(Boolean);
        expect(await present()).toEqual([index, held, young]);
        // A live git holds its lock open: a process of the sandbox holds HEAD.lock.
        const holder = new AbortController();
        let ready!: () => void;
        const holding = new Promise<void>((r) => (ready = r));
        const hold = provider.exec(h, {
          command: '/bin/sh',
          args: ['-c', 'exec 3<"$1"; echo ready; exec sleep 600', '_', held],
          signal: holder.signal,
          onLine: (_s, line) => line === 'ready' && ready(),
        });
        await holding;
        try {
          await clearSandboxGitLocks(provider, h.root, { inside: true });
          expect(await present()).toEqual([held, young]);
        } finally {
          holder.abort();
          await hold;
        }
        // Its holder gone, the same lock is stale.
        await clearSandboxGitLocks(provider, h.root, { inside: true });
        expect(await present()).toEqual([young]);
        const git = await provider.exec(h, { command: 'git', args: ['-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q', '--allow-empty', '-m', 'after'] });
        expect(git.exitCode, git.stderr).toBe(0);
      });
    });

    describe('destroy and list', () => {
      it('lists live sandboxes, and a new provider instance rediscovers them', async () => {
        const a = await provider.create(request('listed-a'));
        const b = await provider.create(request('listed-b', { base: first }));
        const listed = await provider.list(repo);
        for (const h of [a, b]) {
          const entry = listed.find((s) => s.root === h.root);
          expect(entry, `${h.root} in list`).toBeDefined();
          expect(entry!.branch).toBe(h.branch);
          expect(entry!.head).toBe(h.headCommit);
        }
        const fresh = await makeProvider();
        const rediscovered = await fresh.list(repo);
        expect(rediscovered.map((s) => s.root)).toEqual(expect.arrayContaining([a.root, b.root, shared.root]));
        const again = await fresh.create(request('listed-a'));
        expect(again.reused).toBe(true);
        expect(again.root).toBe(a.root);
        const run = await fresh.exec(again, { command: 'git rev-parse HEAD', shell: true });
        expect(run.stdout.trim()).toBe(a.headCommit);
      });

      it('destroy removes the folder and unregisters the worktree but keeps the collected branch', async () => {
        const handle = await provider.create(request('doomed'));
        await provider.writeFile(handle, 'scratch.txt', 'x');
        const committed = await provider.exec(handle, { command: 'git add scratch.txt && git -c user.name=t -c user.email=t@t commit -q -m scratch && git rev-parse HEAD', shell: true });
        expect(committed.exitCode, committed.stderr).toBe(0);
        const head = committed.stdout.trim();
        expect((await provider.collect(handle)).head).toBe(head);
        await provider.destroy({ repository: repo, root: handle.root });
        expect(await exists(handle.root)).toBe(false);
        expect(gitIn(repo, 'worktree', 'list', '--porcelain')).not.toContain(handle.root);
        expect((await provider.list(repo)).map((s) => s.root)).not.toContain(handle.root);
        expect(gitIn(repo, 'rev-parse', 'refs/heads/slipway/contract/doomed')).toBe(head);
        await provider.destroy({ repository: repo, root: handle.root }); // twice is fine
        // Creating it again picks the kept branch up where it was.
        const back = await provider.create(request('doomed'));
        expect(back.reused).toBe(false);
        expect(back.headCommit).toBe(head);
      });
    });
  });
}
