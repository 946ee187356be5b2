/**
 * Local sandboxes: the provider contract without and with bubblewrap, copying ignored files,
 * confinement (writes, git commit, network) and the user's checkout left untouched.
 */
import { execFileSync } from 'node:child_process';
import dgram from 'node:dgram';
import { promises as fs } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { BWRAP_MISSING_MESSAGE, findExecutable } from '../../activities/sandbox/bubblewrap';
import { findEgressTools, PASTA_DNS_HOST_MISSING, PASTA_MISSING_MESSAGE, pastaArgs, pastaHasDnsHost, SANDBOX_DNS } from '../../activities/sandbox/egress';
import { isInside } from '../../activities/sandbox/paths';
import { collapse, intersect } from '../../activities/sandbox/copy-ignored';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { describeSandboxContract } from './contract';
import { exists, gitIn, IDENTITY_ENV, makeRepo, sandboxRequest, sh, snapshotCheckout, tempDir } from './helpers';

// Security tests never skip: without bubblewrap they fail, saying how to install it.
const hasBwrap = findExecutable('bwrap') !== undefined;

describeSandboxContract('local', () => new LocalSandboxProvider());

it('has bubblewrap for the confinement tests', () => {
  expect(hasBwrap, `the confinement tests need bubblewrap: ${BWRAP_MISSING_MESSAGE}`).toBe(true);
});
if (hasBwrap) {
  describeSandboxContract('local + bubblewrap (network off)', () => new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false } }));
}

/** A checkout with ignored files of every kind, and a tracked file under src/. */
async function addIgnoredFiles(repo: string): Promise<void> {
  await fs.writeFile(path.join(repo, '.gitignore'), 'node_modules/\n.env\ndist/\n*.log\n');
  gitIn(repo, 'add', '.gitignore');
  gitIn(repo, 'commit', '-q', '-m', 'ignore');
  await fs.mkdir(path.join(repo, 'node_modules/pkg/lib/deep'), { recursive: true });
  await fs.mkdir(path.join(repo, 'node_modules/.bin'), { recursive: true });
  await fs.mkdir(path.join(repo, 'node_modules/other'), { recursive: true });
  await fs.writeFile(path.join(repo, 'node_modules/pkg/index.js'), 'module.exports = 1;\n');
  await fs.writeFile(path.join(repo, 'node_modules/pkg/lib/deep/x.js'), 'deep\n');
  await fs.writeFile(path.join(repo, 'node_modules/other/o.js'), 'other\n');
  await fs.chmod(path.join(repo, 'node_modules/pkg/index.js'), 0o755);
  await fs.symlink('../pkg/index.js', path.join(repo, 'node_modules/.bin/tool'));
  await fs.symlink(path.join(repo, 'README.md'), path.join(repo, 'node_modules/abs-link'));
  await fs.writeFile(path.join(repo, '.env'), 'SECRET=1\n');
  await fs.mkdir(path.join(repo, 'dist'));
  await fs.writeFile(path.join(repo, 'dist/app.js'), 'app\n');
  await fs.writeFile(path.join(repo, 'src/debug.log'), 'log\n');
  await fs.writeFile(path.join(repo, 'untracked.txt'), 'not ignored, not copied\n');
}

const req = sandboxRequest;

describe('local sandboxes', () => {
  let parent: string;
  let repo: string;
  let before: Record<string, string>;
  const provider = new LocalSandboxProvider();

  beforeAll(async () => {
    parent = tempDir('local');
    ({ repo } = makeRepo(parent));
    await addIgnoredFiles(repo);
    // A user in the middle of something: a stash, a staged change, an unstaged change, an untracked file.
    await fs.writeFile(path.join(repo, 'README.md'), 'stashed edit\n');
    gitIn(repo, 'stash', 'push', '-q', '-m', 'user stash');
    await fs.writeFile(path.join(repo, 'staged.txt'), 'staged\n');
    gitIn(repo, 'add', 'staged.txt');
    await fs.appendFile(path.join(repo, 'src/a.txt'), 'unstaged edit\n');
    before = await snapshotCheckout(repo);
  });

  afterAll(async () => {
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  describe.each(['gnu-cp', 'node'] as const)('copying ignored files (%s)', (copyMethod) => {
    it('copies node_modules, .env and other ignored files; symlinks stay symlinks', async () => {
      const p = new LocalSandboxProvider({ copyMethod });
      const h = await p.create(req(repo, `copy-${copyMethod}`));
      expect(h.ignoredCopy?.method).toBe(copyMethod);
      expect(h.ignoredCopy?.warnings).toEqual([]);
      const at = (rel: string) => path.join(h.root, rel);
      expect(await fs.readFile(at('node_modules/pkg/index.js'), 'utf8')).toBe('module.exports = 1;\n');
      expect((await fs.stat(at('node_modules/pkg/index.js'))).mode & 0o777).toBe(0o755);
      expect(await fs.readFile(at('node_modules/pkg/lib/deep/x.js'), 'utf8')).toBe('deep\n');
      expect(await fs.readFile(at('node_modules/other/o.js'), 'utf8')).toBe('other\n');
      expect(await fs.readFile(at('.env'), 'utf8')).toBe('SECRET=1\n');
      expect(await fs.readFile(at('dist/app.js'), 'utf8')).toBe('app\n');
      expect(await fs.readFile(at('src/debug.log'), 'utf8')).toBe('log\n');
      // Symlinks are copied verbatim, relative or absolute.
      expect((await fs.lstat(at('node_modules/.bin/tool'))).isSymbolicLink()).toBe(true);
      expect(await fs.readlink(at('node_modules/.bin/tool'))).toBe('../pkg/index.js');
      expect(await fs.readlink(at('node_modules/abs-link'))).toBe(path.join(repo, 'README.md'));
      // Not ignored, Slipway's own folder, git's folder: not copied.
      expect(await exists(at('untracked.txt'))).toBe(false);
      expect(await exists(at('.slipway'))).toBe(false);
      expect((await fs.lstat(at('.git'))).isFile()).toBe(true);
      // The copies keep the worktree clean (they are ignored there too).
      expect(gitIn(h.root, 'status', '--porcelain')).toBe('');
      await p.destroy({ repository: repo, root: h.root });
    });

    it('makes independent copies: never hard links', async () => {
      const h = await new LocalSandboxProvider({ copyMethod }).create(req(repo, `inode-${copyMethod}`));
      for (const rel of ['node_modules/pkg/index.js', 'node_modules/pkg/lib/deep/x.js', '.env', 'dist/app.js']) {
        const original = await fs.stat(path.join(repo, rel));
        const copy = await fs.stat(path.join(h.root, rel));
        expect(copy.ino, rel).not.toBe(original.ino);
        expect(original.nlink, rel).toBe(1);
        expect(copy.nlink, rel).toBe(1);
      }
      await fs.writeFile(path.join(h.root, 'node_modules/pkg/index.js'), 'changed by agent\n');
      await fs.appendFile(path.join(h.root, '.env'), 'MORE=2\n');
      expect(await fs.readFile(path.join(repo, 'node_modules/pkg/index.js'), 'utf8')).toBe('module.exports = 1;\n');
      expect(await fs.readFile(path.join(repo, '.env'), 'utf8')).toBe('SECRET=1\n');
      await provider.destroy({ repository: repo, root: h.root });
    });
  });

  it('copies nothing when copyIgnored is off (provider or request), and the request wins', async () => {
    const off = new LocalSandboxProvider({ copyIgnored: false });
    const a = await off.create(req(repo, 'no-copy'));
    expect(a.ignoredCopy).toBeUndefined();
    expect(await exists(path.join(a.root, 'node_modules'))).toBe(false);
    expect(await exists(path.join(a.root, '.env'))).toBe(false);
    const b = await provider.create(req(repo, 'no-copy-request', { copyIgnored: false }));
    expect(await exists(path.join(b.root, 'node_modules'))).toBe(false);
    const c = await off.create(req(repo, 'copy-request', { copyIgnored: true }));
    expect(await exists(path.join(c.root, '.env'))).toBe(true);
    for (const h of [a, b, c]) await provider.destroy({ repository: repo, root: h.root });
  });

  it('does not overwrite files the worktree already has (tracked on its branch)', async () => {
    // dist/app.js is ignored in the checkout but tracked on another branch.
    const wt = path.join(parent, 'side');
    gitIn(repo, 'worktree', 'add', '-q', '-b', 'with-dist', wt, 'main');
    await fs.mkdir(path.join(wt, 'dist'));
    await fs.writeFile(path.join(wt, 'dist/app.js'), 'tracked version\n');
    gitIn(wt, 'add', '-f', 'dist/app.js');
    gitIn(wt, 'commit', '-q', '-m', 'track dist');
    gitIn(repo, 'worktree', 'remove', wt);
    const h = await provider.create(req(repo, 'tracked-dist', { base: 'with-dist' }));
    expect(await fs.readFile(path.join(h.root, 'dist/app.js'), 'utf8')).toBe('tracked version\n');
    expect(gitIn(h.root, 'status', '--porcelain')).toBe('');
    await provider.destroy({ repository: repo, root: h.root });
    gitIn(repo, 'branch', '-q', '-D', 'with-dist');
  });

  it('finishes a create that died half way instead of reusing a half-copied sandbox', async () => {
    const r = req(repo, 'half-made');
    const h = await provider.create(r);
    // Simulate a crash during the copy: the record still says "creating" and a file is missing.
    const record = path.join(repo, '.slipway/sandboxes', r.group, `${r.name}.json`);
    const state = JSON.parse(await fs.readFile(record, 'utf8'));
    await fs.writeFile(record, JSON.stringify({ ...state, state: 'creating' }));
    await fs.rm(path.join(h.root, 'node_modules'), { recursive: true });
    const again = await provider.create(r);
    expect(again.reused).toBe(false);
    expect(await exists(path.join(again.root, 'node_modules/pkg/index.js'))).toBe(true);
    const third = await provider.create(r);
    expect(third.reused).toBe(true);
    await provider.destroy({ repository: repo, root: h.root });
    expect(await exists(record)).toBe(false);
  });

  describe('bubblewrap confinement', () => {
    let confined: LocalSandboxProvider;
    let h: Awaited<ReturnType<LocalSandboxProvider['create']>>;
    let other: Awaited<ReturnType<LocalSandboxProvider['create']>>;
    const homeProbe = path.join(os.homedir(), `.slipway-escape-probe-${process.pid}`);

    beforeAll(async () => {
      confined = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false } });
      h = await confined.create(req(repo, 'confined'));
      other = await confined.create(req(repo, 'neighbour'));
    });

    afterAll(async () => {
      await fs.rm(homeProbe, { force: true });
    });

    const run = (command: string, p = confined) => p.exec(h, { command, shell: true, env: IDENTITY_ENV });

    it('lets a command write inside its worktree and in a private /tmp', async () => {
      const r = await run('echo inside > inside.txt && echo tmp > /tmp/private.txt && cat /tmp/private.txt && echo shm > /dev/shm/x');
      expect(r.exitCode, r.stderr).toBe(0);
      expect(await fs.readFile(path.join(h.root, 'inside.txt'), 'utf8')).toBe('inside\n');
      expect(await exists('/tmp/private.txt')).toBe(false);
    });

    it('refuses writes outside the worktree: the user checkout, $HOME, another sandbox, git internals', async () => {
      const targets = [
        path.join(repo, 'escape.txt'),
        path.join(repo, 'README.md'),
        path.join(repo, 'node_modules/pkg/index.js'),
        homeProbe,
        path.join(other.root, 'README.md'),
        path.join(repo, '.git/config'),
        path.join(repo, '.git/hooks/pre-commit'),
        path.join(repo, '.slipway/sandboxes/obj/confined.json'),
      ];
      const contentBefore = await Promise.all(targets.map((t) => fs.readFile(t, 'utf8').catch(() => undefined)));
      for (const target of targets) {
        // Outside /tmp the write fails; under it, it lands in the sandbox's private /tmp. Either
        // way the host's file is untouched (checked below), and none of them is even visible.
        const r = await run(`cat '${target}' 2>/dev/null; echo pwned > '${target}'`);
        if (r.exitCode === 0) expect(isInside('/tmp', target) || isInside(os.homedir(), target), target).toBe(true);
        else expect(r.stderr, target).toMatch(/Read-only file system|Permission denied|No such file or directory|nonexistent/);
        // The repository's git directory is replaced by the sandbox's own private one.
        if (!isInside(path.join(repo, '.git'), target)) expect(r.stdout, target).toBe('');
      }
      const contentAfter = await Promise.all(targets.map((t) => fs.readFile(t, 'utf8').catch(() => undefined)));
      expect(contentAfter).toEqual(contentBefore);
      const rm = await run(`rm -rf '${path.join(repo, 'src')}'`);
      expect(rm.exitCode === 0 || /Read-only/.test(rm.stderr)).toBe(true);
      expect(await exists(path.join(repo, 'src/a.txt'))).toBe(true);
    });

    it('lets git commit on the sandbox branch, which reaches the repository only through collect', async () => {
      const mainBefore = gitIn(repo, 'rev-parse', 'main');
      const branchBefore = gitIn(repo, 'rev-parse', h.branch);
      const r = await run('echo change >> README.md && git add -A && git commit -q -m "agent commit" && git rev-parse HEAD');
      expect(r.exitCode, r.stderr).toBe(0);
      const head = r.stdout.trim();
      // Written to the sandbox's own git directory: the repository has neither the ref nor the object yet.
      expect(gitIn(repo, 'rev-parse', h.branch)).toBe(branchBefore);
      expect(() => gitIn(repo, 'cat-file', '-t', head)).toThrow();
      const collected = await confined.collect(h);
      expect(collected).toEqual({ head, imported: true });
      expect(gitIn(repo, 'rev-parse', h.branch)).toBe(head);
      expect(gitIn(repo, 'log', '-1', '--format=%s', h.branch)).toBe('agent commit');
      expect(gitIn(repo, 'cat-file', '-t', head)).toBe('commit');
      // Moving main or making branches changes only the sandbox's private copy.
      const moveMain = await run('git update-ref refs/heads/main HEAD && git branch user-branch-from-agent');
      expect(moveMain.exitCode, moveMain.stderr).toBe(0);
      await confined.collect(h);
      expect(gitIn(repo, 'rev-parse', 'main')).toBe(mainBefore);
      expect(gitIn(repo, 'branch', '--list', 'user-branch-from-agent')).toBe('');
    });

    it('never follows a .git link the agent rewrote', async () => {
      const before = await fs.readFile(path.join(h.root, '.git'), 'utf8');
      const r = await run(`mkdir -p evil && printf '[core]\\n\\tfsmonitor = "touch ${homeProbe}; false"\\n' > evil/config && printf 'gitdir: evil\\n' > .git`);
      // Inside, `.git` is Slipway's read-only link to the private git directory.
      expect(r.exitCode).not.toBe(0);
      expect(r.stderr).toMatch(/Read-only file system/);
      // Rewritten on the host behind the sandbox's back, it is still never followed: Slipway's
      // own git goes through its trusted record, and git inside sees the trusted link.
      await fs.writeFile(path.join(h.root, '.git'), 'gitdir: evil\n');
      try {
        await confined.collect(h).catch(() => undefined);
        expect((await run('git rev-parse --git-dir')).stdout.trim()).toMatch(/^\/run\/slipway\/git\/worktrees\//);
        expect(await exists(homeProbe)).toBe(false);
      } finally {
        await fs.writeFile(path.join(h.root, '.git'), before);
      }
    });

    it('network off: nothing; network on: egress only, the host\'s loopback and own address stay out of reach', async () => {
      if (!findEgressTools()) throw new Error(PASTA_MISSING_MESSAGE);
      // Another host on the network: an address on a veth interface of this machine, reached
      // from the sandbox only through pasta's sockets, as the internet would be.
      const ifname = `slw${process.pid % 100000}`;
      const outsideAddress = `10.251.${process.pid % 250}.1`;
      sh(parent, `ip link add ${ifname}a type veth peer name ${ifname}b && ip addr add ${outsideAddress}/32 dev ${ifname}a && ip link set ${ifname}a up && ip link set ${ifname}b up`);
      const listen = async (host: string) => {
        const server = net.createServer((socket) => socket.end('HELLO\n'));
        await new Promise<void>((resolve) => server.listen(0, host, resolve));
        return { server, port: (server.address() as net.AddressInfo).port };
      };
      const loopback = await listen('127.0.0.1');
      const anyAddress = await listen('0.0.0.0');
      const remote = await listen(outsideAddress);
      const hostAddress = sh(parent, "ip -4 route get 1.1.1.1 | sed -n 's/.* src \\([0-9.]*\\).*/\\1/p'");
      const probe = (host: string, port: number) => `bash -c 'exec 3<>/dev/tcp/${host}/${port} && cat <&3' 2>&1 || echo REFUSED`;
      const on = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: true } });
      try {
        expect((await run(probe(outsideAddress, remote.port))).stdout).toContain('REFUSED');
        expect((await run(probe(outsideAddress, remote.port), on)).stdout).toContain('HELLO');
        for (const [host, port] of [['127.0.0.1', loopback.port], ['127.0.0.1', anyAddress.port], [hostAddress, anyAddress.port]] as const) {
          const r = await run(probe(host, port), on);
          expect(r.stdout, `${host}:${port}`).not.toContain('HELLO');
        }
        // Unconfined sandboxes share the host's network: the baseline the above is measured against.
        expect((await run(probe('127.0.0.1', loopback.port), provider)).stdout).toContain('HELLO');
      } finally {
        for (const s of [loopback, anyAddress, remote]) s.server.close();
        sh(parent, `ip link del ${ifname}a`);
      }
    });

    it('network on with a loopback resolver: names resolve through pasta, DNS only; the rest of loopback stays out of reach', async () => {
      if (!findEgressTools()) throw new Error(PASTA_MISSING_MESSAGE);
      // A resolver on the host's loopback, as systemd-resolved's 127.0.0.53 is, answering every
      // A query with one address; TCP listeners on the same address must stay unreachable.
      const resolverAddress = `127.83.${process.pid % 250}.4`;
      const dns = dgram.createSocket('udp4');
      dns.on('message', (query, peer) => {
        const end = query.indexOf(0, 12) + 5;
        const answer = Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 9, 8, 7]);
        const header = Buffer.from([query[0]!, query[1]!, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]);
        dns.send(Buffer.concat([header, query.subarray(12, end), answer]), peer.port, peer.address);
      });
      await new Promise<void>((resolve) => dns.bind(53, resolverAddress, resolve));
      const tcp = net.createServer((socket) => socket.end('HELLO\n'));
      await new Promise<void>((resolve) => tcp.listen(53, resolverAddress, resolve));
      const other = net.createServer((socket) => socket.end('HELLO\n'));
      await new Promise<void>((resolve) => other.listen(0, resolverAddress, resolve));
      const resolvConf = path.join(parent, 'host-resolv.conf');
      await fs.writeFile(resolvConf, `# as systemd-resolved writes it\nnameserver ${resolverAddress}\noptions edns0\n`);
      process.env.SLIPWAY_HOST_RESOLV_CONF = resolvConf;
      const on = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: true } });
      // SANDBOX_DNS is routed nowhere: a connection to it would hang until TCP gives up, so it is bounded.
      const probe = (host: string, port: number) => `timeout 5 bash -c 'exec 3<>/dev/tcp/${host}/${port} && cat <&3' 2>&1 || echo REFUSED`;
      const warn = vi.spyOn(console, 'warn');
      try {
        expect(pastaArgs(1, { resolver: resolverAddress })).toEqual(expect.arrayContaining(['--dns-forward', SANDBOX_DNS, '--dns-host', resolverAddress, '--no-map-gw']));
        const r = await run('getent ahostsv4 api.example.test | head -1; cat /etc/resolv.conf', on);
        if (pastaHasDnsHost(findEgressTools()!.pasta)) {
          expect(r.exitCode, r.stderr).toBe(0);
          expect(r.stdout).toMatch(/^10\.9\.8\.7\s/);
          expect(r.stdout).toContain(`nameserver ${SANDBOX_DNS}`);
          expect(r.stdout).not.toContain(resolverAddress);
        } else {
          // pasta before --dns-host (Debian 12) cannot forward to a loopback resolver: no DNS,
          // said once, and never the host's loopback instead.
          expect(r.stdout).not.toMatch(/^10\.9\.8\.7\s/);
          expect(warn.mock.calls.flat().join('\n')).toContain(PASTA_DNS_HOST_MISSING(resolverAddress));
        }
        for (const [host, port] of [[resolverAddress, 53], [resolverAddress, (other.address() as net.AddressInfo).port], [SANDBOX_DNS, 53], [SANDBOX_DNS, (other.address() as net.AddressInfo).port]] as const) {
          expect((await run(probe(host, port), on)).stdout, `${host}:${port}`).not.toContain('HELLO');
        }
        // Without a loopback resolver the sandbox keeps the host's resolv.conf.
        await fs.writeFile(resolvConf, 'nameserver 192.0.2.53\n');
        expect((await run('cat /etc/resolv.conf', on)).stdout).toBe(await fs.readFile('/etc/resolv.conf', 'utf8'));
      } finally {
        delete process.env.SLIPWAY_HOST_RESOLV_CONF;
        warn.mockRestore();
        dns.close();
        tcp.close();
        other.close();
      }
    });

    it('makes extra paths writable and hides others when asked', async () => {
      const extra = path.join(parent, 'agent-state');
      const hidden = path.join(parent, 'hidden');
      await fs.mkdir(extra);
      await fs.mkdir(hidden);
      await fs.writeFile(path.join(hidden, 'key'), 'private');
      const missingWritable = path.join(parent, 'not-yet', 'state');
      const missingHidden = path.join(os.homedir(), `.slipway-no-such-secret-${process.pid}`); // read-only parent: bwrap cannot make a mount point
      const p = new LocalSandboxProvider({
        confinement: { kind: 'bubblewrap', network: false, writable: [extra, missingWritable], hidden: [hidden, missingHidden] },
      });
      const r = await run(`echo state > '${extra}/s' && echo more > '${missingWritable}/m' && ls -A '${hidden}' | wc -l`, p);
      expect(r.exitCode, r.stderr).toBe(0);
      expect(r.stdout.trim()).toBe('0');
      expect(await fs.readFile(path.join(extra, 's'), 'utf8')).toBe('state\n');
      expect(await fs.readFile(path.join(missingWritable, 'm'), 'utf8')).toBe('more\n');
      expect(await exists(missingHidden)).toBe(false);
      expect(await fs.readFile(path.join(hidden, 'key'), 'utf8')).toBe('private');
    });

    it('keeps a readable path read-only also inside a writable one (an agent\'s config in its home), and a readable folder (its install) unwritable', async () => {
      const home = path.join(parent, 'agent-home');
      const install = path.join(parent, 'agent-install');
      await fs.mkdir(path.join(home, 'codex'), { recursive: true });
      await fs.mkdir(install);
      await fs.writeFile(path.join(home, 'codex', 'config.toml'), 'model = "m"\n');
      await fs.writeFile(path.join(install, 'cli.js'), 'original');
      const p = new LocalSandboxProvider({
        confinement: { kind: 'bubblewrap', network: false, writable: [home], readable: [path.join(home, 'codex', 'config.toml'), install] },
      });
      const r = await run(
        [
          `echo session > '${home}/codex/session.jsonl'`, // the home stays writable
          `if echo x >> '${home}/codex/config.toml'; then echo CONFIG-WRITTEN; fi`,
          `if mv '${home}/codex/config.toml' '${home}/codex/moved'; then echo CONFIG-MOVED; fi`,
          `if echo x >> '${install}/cli.js'; then echo BINARY-WRITTEN; fi`,
          `if touch '${install}/new'; then echo INSTALL-WRITTEN; fi`,
          `cat '${home}/codex/config.toml' '${install}/cli.js'`,
        ].join('; '),
        p,
      );
      expect(r.stdout).not.toMatch(/WRITTEN|MOVED/);
      expect(r.stdout).toContain('model = "m"');
      expect(await fs.readFile(path.join(home, 'codex', 'session.jsonl'), 'utf8')).toBe('session\n');
      expect(await fs.readFile(path.join(home, 'codex', 'config.toml'), 'utf8')).toBe('model = "m"\n');
      expect(await fs.readFile(path.join(install, 'cli.js'), 'utf8')).toBe('original');
      expect(await exists(path.join(install, 'new'))).toBe(false);
    });
  });

  it('fails clearly when bwrap is missing', () => {
    expect(() => new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false, bwrapPath: '/nonexistent/bwrap' } })).toThrow(BWRAP_MISSING_MESSAGE);
    const savedPath = process.env.PATH;
    process.env.PATH = parent;
    try {
      expect(() => new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: true } })).toThrow(BWRAP_MISSING_MESSAGE);
    } finally {
      process.env.PATH = savedPath;
    }
    expect(BWRAP_MISSING_MESSAGE).toBe('bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap`');
  });

  it("leaves the user's checkout untouched: branch, index, working files, untracked files, stash", async () => {
    const after = await snapshotCheckout(repo);
    expect(after).toEqual(before);
    expect(after.stash).toContain('user stash');
    expect(after.index).toContain('staged');
    expect(after.worktree).toContain('unstaged edit');
  });
});

describe('.worktreeinclude', () => {
  let parent: string;
  let repo: string;
  const provider = new LocalSandboxProvider();

  beforeAll(async () => {
    parent = tempDir('include');
    ({ repo } = makeRepo(parent));
    await addIgnoredFiles(repo);
    await fs.writeFile(
      path.join(repo, '.worktreeinclude'),
      ['# only what the agents need', '.env', 'node_modules/pkg/lib/', 'untracked.txt', '*.log', '!src/debug.log', ''].join('\n'),
    );
  });

  afterAll(async () => {
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('copies only the ignored paths it matches', async () => {
    const h = await provider.create(req(repo, 'included'));
    expect(h.ignoredCopy?.limitedByIncludeFile).toBe(true);
    const at = (rel: string) => path.join(h.root, rel);
    expect(await fs.readFile(at('.env'), 'utf8')).toBe('SECRET=1\n');
    expect(await fs.readFile(at('node_modules/pkg/lib/deep/x.js'), 'utf8')).toBe('deep\n');
    expect(await exists(at('node_modules/pkg/index.js'))).toBe(false);
    expect(await exists(at('node_modules/other'))).toBe(false);
    expect(await exists(at('node_modules/.bin'))).toBe(false);
    expect(await exists(at('dist'))).toBe(false);
    expect(await exists(at('src/debug.log'))).toBe(false); // negated
    expect(await exists(at('untracked.txt'))).toBe(false); // matched, but not ignored
  });

  it('intersects git listings in both directions', () => {
    expect(intersect(['node_modules/', '.env', 'a/x.log'], ['node_modules/pkg/', '.env', 'a/', 'b/'])).toEqual(['.env', 'a/x.log', 'node_modules/pkg/']);
    expect(collapse(['a/', 'a/b', 'a/c/', 'ab', 'a'])).toEqual(['a', 'a/', 'ab']);
  });
});

describe('worktree records', () => {
  it('keep .slipway out of git status through .git/info/exclude', async () => {
    const parent = tempDir('exclude');
    try {
      const { repo } = makeRepo(parent);
      const h = await new LocalSandboxProvider().create(req(repo, 'excluded'));
      expect(gitIn(repo, 'status', '--porcelain')).toBe('');
      expect(await fs.readFile(path.join(repo, '.git/info/exclude'), 'utf8')).toContain('/.slipway/');
      expect(execFileSync('git', ['-C', repo, 'check-ignore', '-q', path.join(h.root, 'x')]).length).toBe(0);
      expect(sh(repo, 'git ls-files --others --exclude-standard')).toBe('');
    } finally {
      await fs.rm(parent, { recursive: true, force: true });
    }
  });
});
