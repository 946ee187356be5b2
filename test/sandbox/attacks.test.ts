/**
 * A hostile agent inside a confined (bubblewrap) stream sandbox. Every attack here worked
 * before ADR 0006; each must now fail, leave the user's repository byte-identical (refs, objects,
 * `git fsck`, the checkout) and leave Slipway working.
 *
 * This suite never skips: without bubblewrap it fails and says how to install it.
 */
import { execFileSync, spawn } from 'node:child_process';
import { promises as fs } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createActivities } from '../../activities';
import { MockActivityEnvironment } from '@temporalio/testing';
import { createAgentActivities, type AgentRunInput } from '../../activities/agents/run-agent';
import { AgentSchema } from '../../core/objective-schema';
import { openBillingDb } from '../../activities/billing/db';
import { createAccount, createApiToken, hashToken } from '../../activities/billing/records';
import { connectBillingSocket, billingSocketPath, serveBillingSocket } from '../../activities/billing/socket';
import { BWRAP_MISSING_MESSAGE, findExecutable } from '../../activities/sandbox/bubblewrap';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { DENIED_SYSCALLS } from '../../activities/sandbox/seccomp';
import { closeInheritedFds } from '../../activities/sandbox/close-fds';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { isInside } from '../../activities/sandbox/paths';
import { sandboxAgentHome } from '../../activities/sandbox/sandbox-git';
import { exists, gitIn, hostileLibrary, makeRepo, processesHolding, processName, processesWith, sandboxRequest, sh, snapshotCheckout, tempDir, waitFor } from './helpers';

const INTEGRATION = 'slipway/obj/integration';

/** Everything of the repository an attack could change: refs, objects, config, hooks, checkout. */
async function pictureRepository(repo: string) {
  return {
    refs: gitIn(repo, 'for-each-ref', '--format=%(objectname) %(refname)'),
    objects: sh(repo, 'find .git/objects -type f | sort | xargs sha256sum'),
    config: await fs.readFile(path.join(repo, '.git/config'), 'utf8'),
    hooks: sh(repo, 'ls -A .git/hooks | sort'),
    checkout: await snapshotCheckout(repo),
  };
}

describe('a hostile agent in a confined stream sandbox', () => {
  let parent: string;
  let repo: string;
  let home: string;
  let confined: LocalSandboxProvider;
  let h: SandboxHandle;
  let neighbour: SandboxHandle;
  let before: Awaited<ReturnType<typeof pictureRepository>>;
  let counter = 0;
  const req = (label: string) => sandboxRequest(repo, label);
  const run = (command: string, handle: SandboxHandle = h) => confined.exec(handle, { command, shell: true });
  /** A file on the host that a hook run outside the sandbox would create. */
  const hostMarker = () => path.join(parent, `ran-outside-${++counter}`);

  beforeAll(async () => {
    if (!findExecutable('bwrap')) throw new Error(`the containment suite needs bubblewrap: ${BWRAP_MISSING_MESSAGE}`);
    parent = tempDir('attacks');
    ({ repo } = makeRepo(parent));
    gitIn(repo, 'branch', INTEGRATION, 'main');
    home = path.join(parent, 'slipway-home');
    await fs.mkdir(home);
    await fs.writeFile(path.join(home, 'billing.db'), 'BILLING-SECRET');
    await fs.mkdir(path.join(repo, '.slipway'), { recursive: true });
    await fs.writeFile(path.join(repo, '.slipway', '.env'), 'API_KEY=ENV-SECRET\n');
    process.env.SLIPWAY_HOME = home;
    confined = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false });
    h = await confined.create(req('hostile'));
    neighbour = await confined.create(req('neighbour'));
    await fs.writeFile(path.join(neighbour.root, 'grants.json'), 'GRANT-SECRET');
    before = await pictureRepository(repo);
  });

  afterAll(async () => {
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  /** After every attack: the repository is as it was and intact. */
  async function expectRepositoryUntouched(): Promise<void> {
    const now = await pictureRepository(repo);
    expect(now.config).toBe(before.config);
    expect(now.hooks).toBe(before.hooks);
    expect(now.checkout).toEqual(before.checkout);
    expect(now.refs).toBe(before.refs);
    expect(now.objects).toBe(before.objects);
    expect(gitIn(repo, 'fsck', '--strict', '--no-dangling')).toBe('');
    expect(gitIn(repo, 'log', '--format=%s', 'main')).toBe('second\nfirst');
  }

  it('cannot read or write any descriptor the worker had open (a database file, a connection)', async () => {
    // The worker holds a database file and a connection it inherited without close-on-exec (from
    // a wrapper script, as bash hands them over), at descriptors 20, 21 and 100: above 9, which a
    // POSIX sh cannot even name. (Node marks low descriptors, and what it passes in `stdio`,
    // close-on-exec at start-up, so a wrapper with high ones is the honest way to make such a worker.)
    const db = path.join(parent, 'worker.db');
    await fs.writeFile(db, 'DB-SECRET');
    const got: Buffer[] = [];
    const server = net.createServer((c) => c.on('error', () => undefined).on('data', (d) => got.push(d)).write('SOCKET-SECRET'));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const probe = [
      'echo "fds: $(ls /proc/self/fd | tr "\\n" " ")"',
      'for n in $(ls /proc/self/fd) 20 21 100; do',
      '  [ "$n" -le 2 ] && continue',
      '  [ -e /proc/self/fd/$n ] && echo "open $n -> $(readlink /proc/self/fd/$n)"',
      '  timeout 5 head -c 8 <&$n 2>/dev/null | grep -q . && echo "read $n"',
      '  (echo pwned >&$n) 2>/dev/null && echo "wrote $n"',
      'done; echo probed',
    ].join('\n');
    try {
      const worker = spawn('bash', ['-c', 'exec 20<>"$DB" 21<>"/dev/tcp/127.0.0.1/$PORT" 100<>"$DB"; exec "$0" --import tsx "$1"', process.execPath, path.join(__dirname, 'fixtures', 'exec-with-inherited-fds.ts')], {
        env: { ...process.env, DB: db, PORT: String((server.address() as net.AddressInfo).port), SLIPWAY_TEST_HANDLE: JSON.stringify(h), SLIPWAY_TEST_COMMAND: `bash -c '${probe.replace(/'/g, `'\\''`)}'` },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let err = '';
      worker.stdout!.on('data', (c) => (out += c));
      worker.stderr!.on('data', (c) => (err += c));
      const code = await new Promise((r) => worker.once('exit', r));
      expect(code, err).toBe(0);
      const result = JSON.parse(out) as { control: number[]; exitCode: number; stdout: string; stderr: string };
      // The worker really held them: an ordinary child of it inherits all three.
      expect(result.control).toEqual(expect.arrayContaining([20, 21, 100]));
      expect(result.exitCode, result.stderr).toBe(0);
      expect(result.stdout).toContain('probed');
      expect(result.stdout).not.toMatch(/^(open|read|wrote) /m);
      expect(result.stdout).toMatch(/^fds: 0 1 2 3 $/m); // 3: ls's own listing of the folder
    } finally {
      server.close();
    }
    expect(await fs.readFile(db, 'utf8')).toBe('DB-SECRET');
    expect(Buffer.concat(got).toString()).not.toContain('pwned');
  }, 120_000);

  it('cannot run code on the host through the step that closes descriptors (bash startup variables)', async () => {
    const marker = hostMarker();
    const script = path.join(parent, 'bash-env.sh');
    await fs.writeFile(script, `touch ${marker}\n`);
    const r = await confined.exec(h, {
      command: 'echo inside',
      shell: true,
      env: { BASH_ENV: script, ENV: script, SHELLOPTS: 'xtrace', PS4: `$(touch ${marker})`, 'BASH_FUNC_eval%%': `() { touch ${marker}; }`, 'BASH_FUNC_exec%%': `() { touch ${marker}; }` },
    });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toBe('inside\n');
    expect(await exists(marker)).toBe(false);
  });

  // ADR 0027: the descriptor step, the limits wrapper and bwrap run on the host before any
  // namespace exists; the tenant's environment must not reach them.
  it('cannot run code on the host through the dynamic loader (LD_PRELOAD, LD_AUDIT in its environment)', async () => {
    const marker = hostMarker();
    const lib = hostileLibrary(parent, marker);
    // The library works: any host process given it creates the marker (then it is removed again).
    const control = hostMarker();
    execFileSync('/bin/true', { env: { LD_PRELOAD: hostileLibrary(await fs.mkdtemp(path.join(parent, 'control-')), control) } });
    expect(await exists(control)).toBe(true);
    const limited = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false, limits: { pids: 256, fileSizeBytes: 64 * 1024 * 1024, cpuSeconds: 600 } }, backgroundFill: false });
    for (const provider of [confined, limited]) {
      const r = await provider.exec(h, {
        command: 'echo "preload=$LD_PRELOAD audit=$LD_AUDIT"',
        shell: true,
        env: { LD_PRELOAD: lib, LD_AUDIT: lib, GCONV_PATH: parent, LOCPATH: parent, GLIBC_TUNABLES: 'glibc.malloc.check=3', MALLOC_CHECK_: '3' },
      });
      expect(r.exitCode, r.stderr).toBe(0);
      // The command gets the environment it was given; the library is not in its view, so inside the loader only says so.
      expect(r.stdout).toBe(`preload=${lib} audit=${lib}\n`);
      expect(await exists(marker)).toBe(false);
    }
  });

  it('the descriptor step sources no startup file of the host (~/.bashrc, read by bash for a socket stdin and SHLVL below 2)', async () => {
    const homeDir = await fs.mkdtemp(path.join(parent, 'home-'));
    const marker = hostMarker();
    await fs.writeFile(path.join(homeDir, '.bashrc'), `touch ${marker}\n`);
    const env = { HOME: homeDir, SHLVL: '0', PATH: '/usr/bin:/bin' };
    // Node's stdio pipes are socketpairs: a plain bash -p here does source that .bashrc (the control).
    execFileSync(findExecutable('bash')!, ['-p', '-c', 'true'], { env, stdio: 'pipe' });
    expect(await exists(marker)).toBe(true);
    await fs.rm(marker);
    const step = closeInheritedFds([0, 1, 2], '/bin/true', []);
    execFileSync(step.command, step.args, { env, stdio: 'pipe' });
    expect(await exists(marker)).toBe(false);
  });

  it('its environment is in no process\'s argv, and in none of Slipway\'s host-side processes', async () => {
    const secret = `TENANT-SECRET-${process.pid}-${Date.now()}`;
    const tag = `3600.${process.pid}${counter++}`;
    const stop = new AbortController();
    const running = confined.exec(h, { command: 'sleep', args: [tag], env: { API_TOKEN: secret }, signal: stop.signal });
    try {
      // The command itself runs (the last exec of the chain), so every helper before it has started.
      expect(await waitFor(async () => {
        for (const pid of await processesWith(tag)) if ((await processName(pid)) === 'sleep') return true;
        return false;
      }, 60_000)).toBe(true);
      expect(await processesHolding(secret, 'cmdline')).toEqual([]);
      const holders = await processesHolding(secret, 'environ');
      // Only the command holds it; bwrap (the descriptor step and limits wrapper exec'd into it, same pid) never had it.
      expect(await Promise.all(holders.map(processName))).toEqual(['sleep']);
      const helpers = [];
      for (const pid of await processesWith(tag)) if ((await processName(pid)) === 'bwrap') helpers.push(pid);
      expect(helpers.length).toBeGreaterThan(0);
    } finally {
      stop.abort();
      await running;
    }
  }, 120_000);

  it('an objective\'s agent with LD_PRELOAD in the repository\'s .slipway/.env: it runs nowhere on the host, the agent still gets the value', async () => {
    const marker = hostMarker();
    const lib = hostileLibrary(await fs.mkdtemp(path.join(parent, 'agent-lib-')), marker);
    const envFile = path.join(repo, '.slipway', '.env');
    const saved = await fs.readFile(envFile, 'utf8');
    await fs.writeFile(envFile, `${saved}LD_PRELOAD=${lib}\nLD_AUDIT=${lib}\n`);
    try {
      const input: AgentRunInput = {
        role: 'builder',
        spec: AgentSchema.parse({ provider: 'script', command: 'printf "%s" "$LD_PRELOAD" > agent-saw-preload.txt' }),
        sandboxPath: h.root,
        repository: repo,
        objectiveDir: await fs.mkdtemp(path.join(parent, 'objective-')),
        objective: { id: 'obj', text: 'objective' },
        stream: { id: 'hostile', task: 'task', branch: h.branch },
        targetBranch: INTEGRATION,
        iteration: 1,
      };
      const agents = createAgentActivities({ sandboxes: confined });
      const result = (await new MockActivityEnvironment().run(agents.runAgent, input)) as Awaited<ReturnType<typeof agents.runAgent>>;
      expect(result.exitCode).toBe(0);
      expect(await fs.readFile(path.join(h.root, 'agent-saw-preload.txt'), 'utf8')).toBe(lib);
      expect(await exists(marker)).toBe(false);
    } finally {
      await fs.writeFile(envFile, saved);
      await fs.rm(path.join(h.root, 'agent-saw-preload.txt'), { force: true });
    }
  }, 120_000);

  it('cannot delete or rewrite the repository\'s objects', async () => {
    const r = await run(
      'rm -rf "$(git rev-parse --git-common-dir)/objects/"* ; for d in /run/slipway/objects/*; do rm -rf "$d"/* 2>&1; chmod -R u+w "$d" 2>&1; done; true',
    );
    expect(r.stdout).toMatch(/Read-only file system/);
    await expectRepositoryUntouched();
    // The agent broke only its own private git directory; a new sandbox starts whole again.
    await confined.destroy({ repository: repo, root: h.root });
    h = await confined.create(req('hostile'));
    const log = await run('git log --format=%s -1 main');
    expect(log.stdout.trim()).toBe('second');
    before = await pictureRepository(repo);
  });

  it('cannot move main or the integration branch, even through collect', async () => {
    const r = await run(
      `echo hostile > hostile.txt && git add hostile.txt && git -c user.name=x -c user.email=x@x commit -q -m unreviewed && git update-ref refs/heads/${INTEGRATION} HEAD && git update-ref refs/heads/main HEAD && git rev-parse HEAD`,
    );
    expect(r.exitCode, r.stderr).toBe(0);
    const unreviewed = r.stdout.trim();
    expect(gitIn(repo, 'rev-parse', INTEGRATION)).toBe(gitIn(repo, 'rev-parse', 'main'));
    // Collect brings the sandbox's own branch in, nothing else.
    const collected = await confined.collect(h);
    expect(collected.head).toBe(unreviewed);
    expect(gitIn(repo, 'rev-parse', h.branch)).toBe(unreviewed);
    const { refs, ...rest } = await pictureRepository(repo);
    expect(refs.split('\n').filter((l) => !l.endsWith(`refs/heads/${h.branch}`))).toEqual(before.refs.split('\n').filter((l) => !l.endsWith(`refs/heads/${h.branch}`)));
    expect(rest.config).toBe(before.config);
    expect(rest.checkout).toEqual(before.checkout);
    expect(gitIn(repo, 'fsck', '--strict', '--no-dangling')).toBe('');
    // Put the branch back for the other attacks.
    gitIn(repo, 'update-ref', `refs/heads/${h.branch}`, h.baseCommit);
    before = await pictureRepository(repo);
  });

  it('cannot get its git config, hooks or fsmonitor run by Slipway\'s git', async () => {
    const marker = hostMarker();
    // Writes on the host (if run outside) and in the worktree (if run inside by Slipway's own git).
    const payload = `sh -c 'touch ${marker} ${h.root}/hook-ran; sleep 100000'`;
    const r = await run(
      [
        `git config core.fsmonitor "${payload}"`,
        `git config core.hooksPath "$PWD/hooks"`,
        'mkdir -p hooks',
        `printf '#!/bin/sh\\n${payload}\\n' > hooks/pre-commit && chmod +x hooks/pre-commit`,
        `printf '#!/bin/sh\\n${payload}\\n' > "$(git rev-parse --git-common-dir)/hooks-post" ; true`,
        // The worktree's .git link pointed at a repository with the same config.
        `mkdir -p evil && printf '[core]\\n\\tfsmonitor = "${payload.replace(/'/g, "'\\''")}"\\n' > evil/config`,
      ].join(' && '),
    );
    expect(r.exitCode, r.stderr).toBe(0);
    const activities = createActivities({ sandboxes: confined });
    // Every Slipway operation on the sandbox: commit, collect, reset onto the integration branch.
    await activities.commitWork({ path: h.root, message: 'leftovers' });
    await activities.resetOntoIntegration({ path: h.root, onto: INTEGRATION });
    expect(await exists(path.join(h.root, 'hook-ran'))).toBe(false);
    await fs.writeFile(path.join(h.root, '.git'), `gitdir: ${path.join(h.root, 'evil')}\n`);
    await confined.collect(h).catch(() => undefined);
    await confined.destroy({ repository: repo, root: h.root });
    expect(await exists(marker)).toBe(false);
    h = await confined.create(req('hostile'));
    before = await pictureRepository(repo);
    await expectRepositoryUntouched();
  });

  it('sees nothing of the host: no shadow file, no $SLIPWAY_HOME, no other sandbox, no checkout, no home', async () => {
    const targets = [
      '/etc/shadow',
      path.join(home, 'billing.db'),
      path.join(neighbour.root, 'grants.json'),
      path.join(repo, 'README.md'),
      path.join(repo, '.slipway', '.env'),
      path.join(os.homedir(), '.bashrc'),
      '/root/.bashrc',
      '/proc/1/root/etc/hostname',
    ];
    const r = await run(targets.map((t) => `cat '${t}' 2>/dev/null`).join('; ') + '; ls /proc/1/root/ 2>/dev/null | head -3; true');
    for (const secret of ['BILLING-SECRET', 'GRANT-SECRET', 'ENV-SECRET', 'hello', 'root:']) expect(r.stdout).not.toContain(secret);
    // The home folder is a private, empty tmpfs; the sandboxes' folder holds this sandbox only.
    const listing = await run(`ls -A '${os.homedir()}' | wc -l; ls -A '${path.dirname(h.root)}'`);
    expect(listing.stdout.split('\n')[0]).toBe('0');
    expect(listing.stdout).not.toContain('neighbour');
  });

  it('runs as an unprivileged uid with no capabilities: no remount, no mknod, no mount', async () => {
    const r = await run(
      'id -u; grep CapEff /proc/self/status; mount -o remount,rw / 2>&1 && echo REMOUNTED; mknod dev-null c 1 3 2>&1 && echo MKNOD; mount -t tmpfs x /tmp 2>&1 && echo MOUNTED; echo x > /usr/pwned 2>&1 || true',
    );
    const lines = r.stdout.split('\n');
    expect(lines[0]).toBe('1000');
    expect(lines[1]).toMatch(/^CapEff:\s+0+$/);
    expect(r.stdout).not.toMatch(/REMOUNTED|MKNOD|MOUNTED/);
    expect(await exists('/usr/pwned')).toBe(false);
  });

  it('cannot hard-link host files, shared objects or its private git directory, or escape through /proc/self/root', async () => {
    const r = await run(
      `ln /etc/passwd passwd-link 2>&1; ln "$(ls -d /run/slipway/objects/0/*/* | head -1)" obj-link 2>&1; ln "$(git rev-parse --absolute-git-dir)/HEAD" head-link 2>&1; ln "$(git rev-parse --git-common-dir)/config" config-link 2>&1; cat /proc/self/root/etc/shadow /proc/self/root${repo}/README.md /proc/1/root${repo}/README.md 2>/dev/null; true`,
    );
    // Each link would cross a mount (system, shared objects, the private git directory): EXDEV.
    expect(r.stdout.match(/Invalid cross-device link$/gm)?.length, r.stdout).toBe(4);
    for (const link of ['passwd-link', 'obj-link', 'head-link', 'config-link']) expect(await exists(path.join(h.root, link))).toBe(false);
    expect(r.stdout).not.toContain('hello');
  });

  it("cannot reach the embedded billing database, its socket or another account's tokens", async () => {
    // A real embedded billing database with a token, served on its socket as `slipway api` serves it.
    const billingDir = path.join(home, 'billing');
    const db = await openBillingDb({ dataDir: home });
    const served = await serveBillingSocket(db, billingSocketPath(billingDir));
    try {
      await createAccount(db, { id: 'other-tenant' });
      const { token } = await createApiToken(db, 'other-tenant', { name: 'secret' });
      const hash = hashToken(token);
      // The socket answers on the host (so the attempts below could succeed if it were reachable).
      const fromHost = await connectBillingSocket(billingSocketPath(billingDir)).query<{ token_hash: string }>('SELECT token_hash FROM api_tokens');
      expect(fromHost.rows.map((r) => r.token_hash)).toContain(hash);
      const socket = billingSocketPath(billingDir);
      // A client as the CLI would make it, run from inside the sandbox.
      await fs.writeFile(
        path.join(h.root, 'probe.js'),
        `const s = require('net').connect(${JSON.stringify(socket)}); s.on('connect', () => { console.log('CONNECTED'); s.end(); }); s.on('error', (e) => console.log('refused', e.code));`,
      );
      const r = await run(`ls -la '${billingDir}' 2>&1; cat '${billingDir}'/* 2>/dev/null | grep -c '${hash}'; node probe.js 2>&1; grep -rl '${hash}' /tmp /run /var/tmp 2>/dev/null; rm -f probe.js; true`);
      expect(r.stdout).toContain('refused ENOENT');
      expect(r.stdout).not.toContain('CONNECTED');
      expect(r.stdout).not.toContain(hash.slice(0, 16));
      expect(r.stdout).toMatch(/No such file or directory/);
    } finally {
      await served.close();
      await db.close();
    }
  });

  it('meets a seccomp filter: each denied system call fails with EPERM, while git, node and sh keep working', async () => {
    const arch = process.arch === 'arm64' ? 'aarch64' : 'x86_64';
    // perl's syscall() makes the raw calls (zero arguments: nothing happens even where allowed).
    const probe = `perl -e 'for (@ARGV) { my $r = syscall($_, 0, 0, 0, 0, 0); print "$_ ", ($r == -1 ? $!+0 : "ok"), "\\n" }' ${DENIED_SYSCALLS.map((c) => c[arch]).join(' ')}`;
    const r = await run(`grep -E '^Seccomp(_filters)?:' /proc/self/status; ${probe}`);
    expect(r.stdout).toMatch(/^Seccomp:\s+2$/m);
    for (const c of DENIED_SYSCALLS) expect(r.stdout, `${c.name}: ${r.stdout}`).toMatch(new RegExp(`^${c[arch]} 1$`, 'm'));
    const special = await run(
      `unshare -U true 2>&1; echo "unshare $?"; perl -e 'my $b = "x"; syscall(${arch === 'x86_64' ? 16 : 29}, 0, 0x5412, $b) == -1 and print "tiocsti ", $!+0, "\\n"' < /dev/null; perl -e 'syscall(435, 0, 0) == -1 and print "clone3 ", $!+0, "\\n"'`,
    );
    expect(special.stdout).toMatch(/Operation not permitted/);
    expect(special.stdout).toMatch(/^unshare 1$/m);
    expect(special.stdout).toMatch(/^tiocsti 1$/m);
    expect(special.stdout).toMatch(/^clone3 38$/m);
    // Without the filter the same probes get other answers: the test above could fail.
    const open = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false, seccomp: false }, backgroundFill: false });
    const unfiltered = await open.exec(h, { command: `grep '^Seccomp:' /proc/self/status; unshare -U true; echo "unshare $?"; perl -e 'my $b = "x"; syscall(${arch === 'x86_64' ? 16 : 29}, 0, 0x5412, $b) == -1 and print "tiocsti ", $!+0, "\\n"' < /dev/null; perl -e 'syscall(435, 0, 0) == -1 and print "clone3 ", $!+0, "\\n"'`, shell: true });
    expect(unfiltered.stdout).toMatch(/^Seccomp:\s+0$/m);
    expect(unfiltered.stdout).toMatch(/^unshare 0$/m);
    expect(unfiltered.stdout).not.toMatch(/^clone3 38$/m);
    expect(unfiltered.stdout).toMatch(/^tiocsti 25$/m); // ENOTTY: /dev/null is no terminal
    // Ordinary work: a shell, git (commit), node spawning a child and a worker thread (clone3 -> clone).
    const work = await run(
      `echo ok > seccomp-ok.txt && git add seccomp-ok.txt && git -c user.name=a -c user.email=a@a commit -q -m seccomp && git log --format=%s -1 && node -e "const { Worker } = require('worker_threads'); console.log(require('child_process').execSync('echo child').toString().trim()); new Worker('process.exit(0)', { eval: true }).on('exit', (c) => console.log('worker', c))" && git reset -q --hard HEAD~1`,
    );
    expect(work.stderr).toBe('');
    expect(work.stdout).toBe('seccomp\nchild\nworker 0\n');
  });

  it('cannot reach services on the host\'s loopback (Temporal, the API, Postgres) with the network off', async () => {
    const server = net.createServer((socket) => socket.end('SERVICE'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const port = (server.address() as net.AddressInfo).port;
      const r = await run(`bash -c 'exec 3<>/dev/tcp/127.0.0.1/${port} && cat <&3' 2>&1`);
      expect(r.stdout).not.toContain('SERVICE');
    } finally {
      server.close();
    }
  });

  it.each([
    ['confined', true],
    ['unconfined', false],
  ])('leaves no process behind (%s): a daemon dies with its command, and everything dies with a SIGKILLed worker', async (_label, isConfined) => {
    const run = (command: string) => (isConfined ? confined : new LocalSandboxProvider({ backgroundFill: false })).exec(h, { command, shell: true });
    const daemonMarker = `98${process.pid}7${isConfined ? 1 : 2}`;
    const r = await run(`setsid sh -c 'sleep ${daemonMarker}' > /dev/null 2>&1 & echo started`);
    expect(r.stdout.trim()).toBe('started');
    expect(await waitFor(async () => (await processesWith(`sleep ${daemonMarker}`)).length === 0)).toBe(true);

    // A worker stand-in that runs an agent in the sandbox and is then killed with SIGKILL.
    const agentMarker = `97${process.pid}5${isConfined ? 3 : 4}`;
    const script = `
      const { LocalSandboxProvider } = require(${JSON.stringify(path.resolve('activities/sandbox/local.ts'))});
      new LocalSandboxProvider({ ${isConfined ? "confinement: { kind: 'bubblewrap', network: false }, " : ''}backgroundFill: false })
        .exec({ root: ${JSON.stringify(h.root)} }, { command: 'sleep ${agentMarker}', shell: true });
    `;
    const worker = spawn(process.execPath, ['--import', 'tsx', '-e', script], { stdio: 'ignore' });
    try {
      expect(await waitFor(async () => (await processesWith(`sleep ${agentMarker}`)).length > 0, 30_000)).toBe(true);
      worker.kill('SIGKILL');
      expect(await waitFor(async () => (await processesWith(`sleep ${agentMarker}`)).length === 0, 10_000)).toBe(true);
    } finally {
      worker.kill('SIGKILL');
    }
  });

  it('meets enforced limits: a fork bomb, a memory hog and a disk filler fail, and nothing of them survives', async () => {
    const limited = new LocalSandboxProvider({
      confinement: { kind: 'bubblewrap', network: false, limits: { pids: 64, memoryBytes: 128 * 1024 ** 2, fileSizeBytes: 4 * 1024 ** 2 } },
      backgroundFill: false,
    });
    const marker = `96${process.pid}31`;
    const bomb = await limited.exec(h, { command: `n=0; while [ $n -lt 500 ]; do sleep ${marker} </dev/null >/dev/null 2>&1 & n=$((n+1)); done; echo done`, shell: true });
    expect(bomb.stderr).toMatch(/fork|Resource temporarily unavailable/i);
    expect(await waitFor(async () => (await processesWith(`sleep ${marker}`)).length === 0)).toBe(true);
    const hog = await limited.exec(h, { command: 'node', args: ['-e', 'const a = []; for (;;) a.push(Buffer.alloc(16 * 1024 * 1024, 1));'] });
    expect(hog.exitCode === 0).toBe(false);
    const filler = await limited.exec(h, { command: 'head -c 50000000 /dev/zero > big.bin', shell: true });
    expect(filler.exitCode).not.toBe(0);
    expect((await fs.stat(path.join(h.root, 'big.bin'))).size).toBeLessThanOrEqual(4 * 1024 ** 2);
    await fs.rm(path.join(h.root, 'big.bin'));
  });

  it('keeps 50 MB of output from flooding the worker: the capture is capped and says so', async () => {
    const r = await run('head -c 50000000 /dev/zero | tr "\\0" a; echo; echo END');
    expect(r.exitCode).toBe(0);
    expect(r.stdout.length).toBeLessThan(200_000);
    expect(r.stdout).toContain('[truncated]');
    expect(r.stdout.trim().endsWith('END')).toBe(true);
  });

  it('a terminal session gets a terminal of its own inside the sandbox, never one of the host (ADR 0014)', async () => {
    const session = await confined.openSession(h, {
      command: 'sh',
      args: ['-c', 'echo "pts=$(stat -c %d /dev/pts) tty=$(stat -L -c %d /proc/$$/fd/0) err=$(stat -L -c %d /proc/$$/fd/2) name=$(tty)"; ls /dev/pts'],
      pty: { cols: 80, rows: 24 },
    });
    let out = '';
    session.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const ended = new Promise((resolve) => session.stdout.once('end', resolve));
    expect((await session.exit).exitCode).toBe(0);
    await ended;
    const m = /pts=(\d+) tty=(\d+) err=(\d+) name=(\S+)/.exec(out);
    expect(m, out).not.toBeNull();
    const hostPts = (await fs.stat('/dev/pts')).dev;
    // The command's terminal lives on the sandbox's own devpts instance, which is not the host's:
    // nothing typed into it (TIOCSTI included) can reach a terminal outside.
    expect(m![2]).toBe(m![1]);
    expect(m![3]).toBe(m![1]);
    expect(Number(m![1])).not.toBe(hostPts);
    expect(m![4]).toMatch(/^\/dev\/pts\/\d+$/);
    // Its devpts shows the sandbox's terminals only (the one of this session), not the host's.
    expect(out.split(/\r?\n/).filter((l) => /^\d+(\s+\d+)*$/.test(l.trim()) || l.includes('ptmx')).join(' ').match(/\b\d+\b/g) ?? []).toEqual(['0']);
  });

  it('after all attacks: the repository is byte-identical and fsck-clean, and Slipway still merges honest work', async () => {
    await expectRepositoryUntouched();
    const activities = createActivities({ sandboxes: confined });
    await run('echo honest > honest.txt');
    const { head, committed } = await activities.commitWork({ path: h.root, message: 'honest work' });
    expect(committed).toBe(true);
    expect(gitIn(repo, 'rev-parse', h.branch)).toBe(head);
    expect(gitIn(repo, 'show', `${head}:honest.txt`)).toBe('honest');
  });

  it('the merger refuses an integration branch that moved outside the merge queue', async () => {
    const activities = createActivities({ sandboxes: confined });
    const merger = await confined.create({ ...req('_merger'), branch: `slipway/obj/merger-${counter}` });
    const tip = merger.headCommit;
    await run('echo more > more.txt');
    const { head } = await activities.commitWork({ path: h.root, message: 'more' });
    gitIn(repo, 'update-ref', `refs/heads/${merger.branch}`, gitIn(repo, 'rev-parse', 'main~1'));
    const refused = await activities.mergeStream({ mergerPath: merger.root, branch: h.branch, headCommit: head, message: 'merge', expectedTip: tip }).catch((e) => e);
    expect(refused).toBeInstanceOf(Error);
    expect((refused as Error).message).toMatch(/not at .* where the merge queue left it/);
    gitIn(repo, 'update-ref', `refs/heads/${merger.branch}`, tip);
    const merged = await activities.mergeStream({ mergerPath: merger.root, branch: h.branch, headCommit: head, message: 'merge', expectedTip: tip });
    expect(merged.status).toBe('merged');
  });
});

describe('the agent home Slipway makes for a confined sandbox', () => {
  beforeAll(() => {
    if (!findExecutable('bwrap')) throw new Error(`the containment suite needs bubblewrap: ${BWRAP_MISSING_MESSAGE}`);
  });

  it("an agent run's HOME is the sandbox's own, made by Slipway outside the worktree and kept between runs; the host's home and the agent's binary stay unwritten; another sandbox cannot read it", async () => {
    // A stand-in for the worker's home (bwrap hides $HOME) and an agent CLI bound read-only.
    const parent = tempDir('agent-home');
    const { repo } = makeRepo(parent);
    const req = (label: string) => sandboxRequest(repo, label);
    const hostHome = path.join(parent, 'host-home');
    await fs.mkdir(hostHome);
    await fs.writeFile(path.join(hostHome, '.bashrc'), 'HOST-HOME-FILE');
    const cli = path.join(parent, 'agent-cli');
    await fs.mkdir(cli);
    await fs.writeFile(path.join(cli, 'agent'), '#!/bin/sh\necho AGENT-BINARY\n', { mode: 0o755 });
    const withCli = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false, readable: [cli] }, backgroundFill: false });
    const saved = process.env.HOME;
    process.env.HOME = hostHome;
    try {
      const a = await withCli.create(req('home-a'));
      const b = await withCli.create(req('home-b'));
      // HOME in the agent's env (a user's .slipway/.env) does not win: the agent home does.
      const agent = (handle: SandboxHandle, command: string) => withCli.exec(handle, { command, shell: true, agentHome: true, env: { HOME: hostHome } });
      const first = await agent(a, [
        'echo "$HOME"',
        'echo SESSION-A > "$HOME/session"',
        `echo pwned >> '${hostHome}/.bashrc'`,
        `echo pwned > '${hostHome}/planted'`,
        `echo pwned > '${cli}/agent'`,
        `'${cli}/agent'`,
        'true',
      ].join('; '));
      const agentHome = first.stdout.split('\n')[0]!;
      expect(agentHome).toBe(sandboxAgentHome(repo, await fs.realpath(a.root)));
      expect(isInside(await fs.realpath(a.root), agentHome)).toBe(false);
      expect(first.stdout).toContain('AGENT-BINARY');
      // On the host, beside the sandbox's state, and still there for the next run.
      expect(await fs.readFile(path.join(agentHome, 'session'), 'utf8')).toBe('SESSION-A\n');
      expect((await fs.stat(agentHome)).mode & 0o077).toBe(0);
      expect((await agent(a, 'cat "$HOME/session"')).stdout).toBe('SESSION-A\n');
      expect(await fs.readFile(path.join(hostHome, '.bashrc'), 'utf8')).toBe('HOST-HOME-FILE');
      expect(await exists(path.join(hostHome, 'planted'))).toBe(false);
      expect(await fs.readFile(path.join(cli, 'agent'), 'utf8')).toBe('#!/bin/sh\necho AGENT-BINARY\n');
      // The other sandbox has a home of its own, empty, and cannot reach the first one's.
      const other = await agent(b, `echo "$HOME"; ls -A "$HOME" | wc -l; cat '${agentHome}/session' 2>&1; ls '${path.dirname(agentHome)}' 2>&1; true`);
      const [otherHome, count] = other.stdout.split('\n');
      expect(otherHome).not.toBe(agentHome);
      expect(count).toBe('0');
      expect(other.stdout).not.toContain('SESSION-A');
      // A command that is not an agent run (a gate) gets the empty private tmpfs as before.
      expect((await withCli.exec(a, { command: 'cat "$HOME/session" 2>/dev/null; true', shell: true })).stdout).not.toContain('SESSION-A');
      await withCli.destroy({ repository: repo, root: a.root });
      await withCli.destroy({ repository: repo, root: b.root });
      expect(await exists(agentHome)).toBe(false);
      expect(await exists(otherHome!)).toBe(false);
    } finally {
      process.env.HOME = saved;
      await fs.rm(parent, { recursive: true, force: true });
    }
  });

  it("the provider's config files are bound read-only into the agent home: the agent reads them but cannot write, remove, move or replace them; a missing one is absent; a link planted on the way is refused, not followed", async () => {
    const parent = tempDir('agent-config');
    const { repo } = makeRepo(parent);
    const workerHome = path.join(parent, 'worker-home');
    await fs.mkdir(path.join(workerHome, '.codex'), { recursive: true });
    const config = path.join(workerHome, '.codex', 'config.toml');
    await fs.writeFile(config, 'model = "worker"\n');
    const provider = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false });
    const agentConfig = [
      { source: config, path: '.codex/config.toml' },
      { source: path.join(workerHome, '.codex', 'auth.json'), path: '.codex/auth.json' }, // not there on the worker
    ];
    try {
      const sandbox = await provider.create(sandboxRequest(repo, 'config'));
      const agent = (command: string) => provider.exec(sandbox, { command, shell: true, agentHome: true, agentConfig });
      const attempts = [
        'echo pwned >> "$HOME/.codex/config.toml"',
        'printf pwned > "$HOME/.codex/config.toml"',
        'rm -f "$HOME/.codex/config.toml"',
        'mv "$HOME/.codex/config.toml" "$HOME/moved"',
        'ln -sf /etc/hostname "$HOME/.codex/config.toml"',
        'chmod 777 "$HOME/.codex/config.toml"',
      ];
      const run = await agent(['cat "$HOME/.codex/config.toml"', ...attempts.map((a) => `if ${a} 2>/dev/null; then echo "DID: ${a}"; fi`), 'ls -A "$HOME/.codex"', 'true'].join('; '));
      expect(run.stdout.split('\n')[0]).toBe('model = "worker"');
      expect(run.stdout).not.toContain('DID: ');
      expect(run.stdout).not.toContain('auth.json'); // missing on the worker: absent in the home
      expect(await fs.readFile(config, 'utf8')).toBe('model = "worker"\n');
      expect((await fs.stat(config)).mode & 0o777).not.toBe(0o777);
      // Its folder is the agent's own: moved away, the file goes along, still read-only; the next run has it back in place.
      const moved = await agent('mv "$HOME/.codex" "$HOME/codex-moved" && if echo pwned >> "$HOME/codex-moved/config.toml" 2>/dev/null; then echo DID; fi; true');
      expect(moved.stdout).not.toContain('DID');
      expect(await fs.readFile(config, 'utf8')).toBe('model = "worker"\n');
      expect((await agent('cat "$HOME/.codex/config.toml"')).stdout).toBe('model = "worker"\n');
      // The worker's file changed: the next run reads the new one (a bind, not a copy taken once).
      await fs.writeFile(config, 'model = "updated"\n');
      expect((await agent('cat "$HOME/.codex/config.toml"')).stdout).toBe('model = "updated"\n');

      // The agent replaces the folder with a link to somewhere it wants the config mounted: the next run is refused.
      const home = sandboxAgentHome(repo, await fs.realpath(sandbox.root));
      const elsewhere = path.join(parent, 'elsewhere');
      await fs.mkdir(elsewhere);
      await fs.rm(path.join(home, '.codex'), { recursive: true, force: true });
      await fs.symlink(elsewhere, path.join(home, '.codex'));
      await expect(agent('true')).rejects.toThrow(/\.codex is not a plain folder/);
      expect(await fs.readdir(elsewhere)).toEqual([]);
      await provider.destroy({ repository: repo, root: sandbox.root });
    } finally {
      await fs.rm(parent, { recursive: true, force: true });
    }
  });
});
