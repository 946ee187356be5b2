/**
 * SSH through the broker (issue 15, ADR 0015) with the real OpenSSH client against `slipway
 * api`'s SSH server, real Postgres, Temporal and bubblewrap: exec with stdin and exit codes, an
 * interactive session under a PTY (resize and Ctrl-C), scp both ways and sftp over the
 * sftp-server run inside the sandbox, and the refusals: a wrong, expired, revoked or other
 * sandbox's token, account B's token on account A's sandbox. Loud, never skipped, when ssh,
 * scp, sftp-server or bubblewrap is missing.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Client as SshClient } from 'ssh2';
import { BIN as SLIPWAY_FROM_SOURCE } from '../helpers/cli';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BWRAP_MISSING_MESSAGE, findExecutable } from '../../activities/sandbox/bubblewrap';
import type { SshTokenView } from '../../api/schemas';
import { loadSshHostKey, SFTP_SERVER } from '../../api/ssh-server';
import { rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

for (const tool of ['ssh', 'scp', 'sftp', 'script']) if (!findExecutable(tool)) throw new Error(`the SSH suite needs ${tool} (apt-get install openssh-client bsdutils; scripts/setup.sh does it)`);
if (!existsSync(SFTP_SERVER)) throw new Error(`the SSH suite needs ${SFTP_SERVER} (apt-get install openssh-sftp-server)`);
if (!findExecutable('bwrap')) throw new Error(`the SSH suite needs bubblewrap: ${BWRAP_MISSING_MESSAGE}`);

let h: ServiceHarness;
let a: TestAccount;
let b: TestAccount;
let sa: string;
let sa2: string;
let sb: string;
let sshPort: number;
let tmp: string;
let known: string;
let askpass: string;
let dataDir: string;

type Run = { code: number | null; stdout: string; stderr: string };

/** Runs a real OpenSSH tool; `password` goes through SSH_ASKPASS from the environment. */
function run(cmd: string, args: string[], opts: { stdin?: string; password?: string } = {}): Promise<Run> {
  return new Promise((resolve) => {
    const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: tmp, LANG: 'C.UTF-8' };
    if (opts.password !== undefined) Object.assign(env, { SSH_ASKPASS: askpass, SSH_ASKPASS_REQUIRE: 'force', TEST_SSH_PASSWORD: opts.password });
    const child = spawn(cmd, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.stdin.end(opts.stdin ?? '');
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

const common = () => ['-o', 'StrictHostKeyChecking=accept-new', '-o', `UserKnownHostsFile=${known}`, '-o', 'LogLevel=ERROR', '-o', 'ConnectTimeout=30'];
const batch = () => [...common(), '-o', 'BatchMode=yes'];
const ssh = (user: string, command: string, stdin?: string) => run('ssh', ['-p', String(sshPort), ...batch(), `${user}@127.0.0.1`, command], { stdin });
/** Logs in as `user` with `password` (the sandbox id and the token, as `slipway sandbox ssh` does). */
const sshPassword = (user: string, password: string, command: string) =>
  run('ssh', ['-p', String(sshPort), ...common(), '-o', 'PreferredAuthentications=password', '-o', 'PubkeyAuthentication=no', '-o', 'NumberOfPasswordPrompts=1', `${user}@127.0.0.1`, command], { password });

async function mint(acct: TestAccount, id: string, body: Record<string, unknown> = {}): Promise<SshTokenView> {
  const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/ssh_tokens`, { token: acct.token, body: JSON.stringify(body) });
  expect(res.status).toBe(201);
  return (await res.json()) as SshTokenView;
}

beforeAll(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'slipway-ssh-test-'));
  known = path.join(tmp, 'known_hosts');
  askpass = path.join(tmp, 'askpass');
  writeFileSync(askpass, '#!/bin/sh\nprintf \'%s\\n\' "$TEST_SSH_PASSWORD"\n', { mode: 0o700 });
  dataDir = path.join(tmp, 'home');
  h = await startServiceHarness({ ssh: { host: '127.0.0.1', port: 0, hostKey: await loadSshHostKey(dataDir), maxTokenMinutes: 120 }, preview: { key: randomBytes(32), domain: 'localhost' } });
  sshPort = h.host.sshPort!;
  a = await h.account({ limit: 3 });
  b = await h.account({ limit: 3 });
  await a.profile({ name: 'confined' });
  await b.profile({ name: 'confined' });
  [sa, sa2, sb] = await Promise.all([a.api.create({ profile: 'confined' }), a.api.create({ profile: 'confined' }), b.api.create({ profile: 'confined' })].map((p) => p.then((s) => s.id)));
  await Promise.all([h.waitFor(a.api, sa, ['ready']), h.waitFor(a.api, sa2, ['ready']), h.waitFor(b.api, sb, ['ready'])]);
});

afterAll(async () => {
  await h?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

describe('tokens', () => {
  it('mints a token bound to the sandbox: what to paste, stored only as a hash', async () => {
    const t = await mint(a, sa);
    expect(t.token).toMatch(/^slps_[0-9a-f]{64}$/);
    expect(t).toMatchObject({ host: '127.0.0.1', port: sshPort, user: t.token, password_user: sa, command: `ssh -p ${sshPort} ${t.token}@127.0.0.1` });
    const minutes = (Date.parse(t.expires_at) - Date.now()) / 60_000;
    expect(minutes).toBeGreaterThan(58);
    expect(minutes).toBeLessThanOrEqual(60);
    const { rows } = await h.database.db.query<Record<string, unknown>>('SELECT * FROM ssh_tokens WHERE id = $1', [t.token_id]);
    expect(rows).toHaveLength(1);
    expect(JSON.stringify(rows[0])).not.toContain(t.token.slice(5));
    expect(h.logs.join('\n')).not.toContain(t.token.slice(5));
  });

  it('bad input: a lifetime over the maximum or not a number is a 400 naming ttl_minutes; nothing is minted', async () => {
    const before = (await h.database.db.query<{ n: number }>('SELECT count(*)::int AS n FROM ssh_tokens')).rows[0]!.n;
    for (const body of [{ ttl_minutes: 121 }, { ttl_minutes: 'x' }, { ttl_minutes: 0 }, { nope: 1 }]) {
      const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sa}/ssh_tokens`, { token: a.token, body: JSON.stringify(body) });
      expect(res.status).toBe(400);
      expect(JSON.stringify(await res.json())).toMatch(/ttl_minutes|nope/);
    }
    expect((await h.database.db.query<{ n: number }>('SELECT count(*)::int AS n FROM ssh_tokens')).rows[0]!.n).toBe(before);
  });

  it('keeps the host key under $SLIPWAY_HOME, 0600, the same on every start', async () => {
    const file = path.join(dataDir, 'ssh_host_ed25519_key');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect((await loadSshHostKey(dataDir)).equals(readFileSync(file))).toBe(true);
  });
});

describe('the OpenSSH client through the broker', () => {
  let t: SshTokenView;
  beforeAll(async () => {
    t = await mint(a, sa);
  });

  it('ssh TOKEN@host runs a command in the confined sandbox, with its exit code', async () => {
    const r = await ssh(t.token, 'echo hi; pwd; id -u; echo "$SLIPWAY_SANDBOX_ID"');
    expect(r.stderr).toBe('');
    expect(r.stdout.split('\n')).toEqual(['hi', '/workspace', '1000', sa, '']);
    expect(r.code).toBe(0);
    expect((await ssh(t.token, 'exit 7')).code).toBe(7);
  });

  it('stdin reaches the command (EOF included)', async () => {
    const r = await ssh(t.token, 'cat > from-ssh.txt && wc -c < from-ssh.txt', 'data over ssh\n');
    expect(r.stdout.trim()).toBe('14');
    expect((await a.api.readFile(sa, 'from-ssh.txt')).toString()).toBe('data over ssh\n');
  });

  it('the sandbox id as user with the token as password works too', async () => {
    const r = await sshPassword(sa, t.token, 'echo via-password');
    expect(r.stdout.trim()).toBe('via-password');
    expect(r.code).toBe(0);
  });

  it('an interactive shell under a PTY (ssh -tt driven through script)', async () => {
    const r = await run('script', ['-qec', `ssh -tt -p ${sshPort} ${batch().join(' ')} ${t.token}@127.0.0.1`, '/dev/null'], {
      stdin: 'tty; stty size; echo "term=$TERM"; exit 3\n',
    });
    expect(r.stdout).toMatch(/\/dev\/pts\/\d+/);
    expect(r.stdout).toMatch(/term=\S+/);
    expect(r.code).toBe(3);
  });

  it('scp copies a file up and down (SFTP protocol, sftp-server inside the sandbox)', async () => {
    const up = path.join(tmp, 'up.bin');
    const content = randomBytes(300_000);
    writeFileSync(up, content);
    const put = await run('scp', ['-P', String(sshPort), ...batch(), up, `${t.token}@127.0.0.1:uploaded.bin`]);
    expect(put.stderr).toBe('');
    expect(put.code).toBe(0);
    expect((await a.api.readFile(sa, 'uploaded.bin')).equals(content)).toBe(true);
    await a.api.writeFile(sa, 'down.txt', Buffer.from('from the sandbox\n'));
    const down = path.join(tmp, 'down.txt');
    const get = await run('scp', ['-P', String(sshPort), ...batch(), `${t.token}@127.0.0.1:down.txt`, down]);
    expect(get.code).toBe(0);
    expect(readFileSync(down, 'utf8')).toBe('from the sandbox\n');
  });

  it('sftp sees the sandbox, not the host: the repository and other sandboxes are not there', async () => {
    const marker = path.join(h.repo, 'host-secret.txt');
    writeFileSync(marker, 'HOST');
    const batchFile = path.join(tmp, 'sftp-batch');
    writeFileSync(batchFile, `pwd\nls\n-get ${marker} ${path.join(tmp, 'stolen')}\n-get /proc/1/environ ${path.join(tmp, 'environ')}\n`);
    const r = await run('sftp', ['-P', String(sshPort), ...batch(), '-b', batchFile, `${t.token}@127.0.0.1`]);
    expect(r.stdout).toContain('/workspace');
    expect(r.stdout).toContain('uploaded.bin');
    expect(existsSync(path.join(tmp, 'stolen'))).toBe(false);
    // The sandbox's own PID 1, if anything: never the host's environment.
    if (existsSync(path.join(tmp, 'environ'))) expect(readFileSync(path.join(tmp, 'environ'), 'utf8')).not.toContain('DATABASE_URL');
  });

  it('resize reaches the terminal, Ctrl-C the foreground command (ssh2 client: window-change and a typed ^C)', async () => {
    const client = new SshClient();
    await new Promise<void>((resolve, reject) => {
      client.on('ready', () => resolve()).on('error', reject);
      client.connect({ host: '127.0.0.1', port: sshPort, username: t.token, hostVerifier: () => true, tryKeyboard: false });
    });
    try {
      const stream = await new Promise<import('ssh2').ClientChannel>((resolve, reject) => client.shell({ rows: 24, cols: 80, term: 'xterm' }, (e, s) => (e ? reject(e) : resolve(s))));
      let out = '';
      stream.on('data', (d: Buffer) => (out += d.toString('utf8')));
      const waitFor = async (re: RegExp) => {
        const end = Date.now() + 30_000;
        while (!re.test(out)) {
          if (Date.now() > end) throw new Error(`no ${re} in ${JSON.stringify(out.slice(-500))}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      };
      stream.write('stty size; echo mark-$((1+1))\n');
      await waitFor(/24 80[\s\S]*mark-2/);
      stream.setWindow(40, 120, 0, 0);
      // The terminal's size changes asynchronously inside the sandbox: ask until it shows.
      const end = Date.now() + 30_000;
      while (!/40 120/.test(out) && Date.now() < end) {
        stream.write('stty size\n');
        await new Promise((r) => setTimeout(r, 250));
      }
      expect(out).toMatch(/40 120/);
      // ^C once the foreground command runs: it dies, and the shell takes the next line (a
      // sleep that was not interrupted would hold it for 300 s).
      stream.write("sh -c 'echo sleeping-$((6+6)); exec sleep 300'\n");
      await waitFor(/sleeping-12/);
      stream.write('\x03');
      stream.write('echo after-$((3+1))\n');
      await waitFor(/after-4/);
      stream.end('exit\n');
    } finally {
      client.end();
    }
  });
});

describe('a preview served from an SSH session', () => {
  it('a server started over ssh is reachable at its preview origin while the session runs, and not after', async () => {
    const t = await mint(a, sa);
    const server = spawn('ssh', ['-p', String(sshPort), ...batch(), t.token + '@127.0.0.1', `node -e "require('http').createServer((q, r) => r.end('served over ssh')).listen(8099, '127.0.0.1', () => console.log('up'))"`], {
      env: { PATH: process.env.PATH, HOME: tmp },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    server.stdout.on('data', (d) => (out += d));
    const exited = new Promise((r) => server.once('exit', r));
    try {
      const end = Date.now() + 30_000;
      while (!out.includes('up') && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
      expect(out).toContain('up');
      const port = (await (await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sa}/ports`, { token: a.token, body: JSON.stringify({ port: 8099 }) })).json()) as { url: string };
      const host = new URL(port.url).host;
      const get = () => fetchVia(host, a.token);
      expect(await get()).toEqual({ status: 200, body: 'served over ssh' });
      server.kill('SIGTERM');
      await exited;
      // The session ends with the client: its server with it.
      const after = Date.now() + 30_000;
      let last = await get();
      while (last.status !== 502 && Date.now() < after) {
        await new Promise((r) => setTimeout(r, 100));
        last = await get();
      }
      expect(last.status).toBe(502);
    } finally {
      server.kill('SIGKILL');
    }
  });
});

/** A GET to a preview origin through the API's listener (the Host header names the preview). */
function fetchVia(host: string, token: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: Number(new URL(h.url).port), path: '/', headers: { host, authorization: `Bearer ${token}` } }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode!, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('the CLI', () => {
  // The CLI from source (the published bin runs dist/, which may not be built from this tree).
  const BIN = SLIPWAY_FROM_SOURCE;
  const cli = (args: string[], env: NodeJS.ProcessEnv = {}) =>
    new Promise<Run>((resolve) => {
      const child = spawn(process.execPath, [BIN, ...args], { env: { PATH: process.env.PATH, HOME: tmp, SLIPWAY_HOME: path.join(tmp, 'cli-home'), ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      child.on('close', (code) => resolve({ code, stdout, stderr }));
    });

  it('slipway sandbox ssh <id> <command> mints a fresh token and runs ssh with it', async () => {
    const before = (await h.database.db.query<{ n: number }>('SELECT count(*)::int AS n FROM ssh_tokens WHERE sandbox_id = $1', [sa])).rows[0]!.n;
    const r = await cli(['sandbox', 'ssh', sa, 'echo', 'from-cli', '$SLIPWAY_SANDBOX_ID'], { SLIPWAY_API_URL: h.url, SLIPWAY_API_TOKEN: a.token });
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe(`from-cli ${sa}\n`);
    expect(r.code).toBe(0);
    expect((await h.database.db.query<{ n: number }>('SELECT count(*)::int AS n FROM ssh_tokens WHERE sandbox_id = $1', [sa])).rows[0]!.n).toBe(before + 1);
    expect((await cli(['sandbox', 'ssh', sa, 'exit', '5'], { SLIPWAY_API_URL: h.url, SLIPWAY_API_TOKEN: a.token })).code).toBe(5);
    // Another account's sandbox: a 404 from the API, exit 2, no ssh run.
    const other = await cli(['sandbox', 'ssh', sb, 'echo', 'x'], { SLIPWAY_API_URL: h.url, SLIPWAY_API_TOKEN: a.token });
    expect(other.code).toBe(2);
    expect(other.stderr).toContain('not_found');
  });

  it('slipway api refuses a bad --ssh-port, SLIPWAY_SSH_PORT or --preview-domain by name, starting nothing', async () => {
    const bad = [
      [['api', '--ssh-port', '70000'], {}, '--ssh-port'],
      [['api'], { SLIPWAY_SSH_PORT: 'twenty-two' }, 'SLIPWAY_SSH_PORT'],
      [['api', '--preview-domain', 'not a domain'], {}, '--preview-domain'],
    ] as const;
    for (const [args, env, name] of bad) {
      const r = await cli([...args], env);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(name);
      expect(r.stderr).not.toContain('started the embedded Temporal');
    }
  });
});

describe('refusals', () => {
  const refused = (r: Run) => {
    expect(r.code).toBe(255);
    expect(r.stdout).toBe('');
  };

  it('a wrong token (well-formed or not) gets nothing', async () => {
    refused(await ssh(`slps_${randomBytes(32).toString('hex')}`, 'echo hi'));
    refused(await ssh('root', 'echo hi'));
    refused(await sshPassword(sa, 'not-a-token', 'echo hi'));
  });

  it('an expired token gets nothing', async () => {
    const t = await mint(a, sa);
    expect((await ssh(t.token, 'echo ok')).stdout.trim()).toBe('ok');
    await h.database.db.query("UPDATE ssh_tokens SET expires_at = now() - interval '1 second' WHERE id = $1", [t.token_id]);
    refused(await ssh(t.token, 'echo hi'));
  });

  it('a revoked token gets nothing (DELETE .../ssh_tokens/{id}); revoking twice is a 404', async () => {
    const t = await mint(a, sa);
    expect((await ssh(t.token, 'echo ok')).stdout.trim()).toBe('ok');
    expect((await rawRequest(h.url, 'DELETE', `/api/v1/sandboxes/${sa}/ssh_tokens/${t.token_id}`, { token: a.token })).status).toBe(204);
    refused(await ssh(t.token, 'echo hi'));
    expect((await rawRequest(h.url, 'DELETE', `/api/v1/sandboxes/${sa}/ssh_tokens/${t.token_id}`, { token: a.token })).status).toBe(404);
  });

  it('revoking a token ends the connections made with it', async () => {
    const t = await mint(a, sa);
    const client = new SshClient();
    await new Promise<void>((resolve, reject) => {
      client.on('ready', () => resolve()).on('error', reject);
      client.connect({ host: '127.0.0.1', port: sshPort, username: t.token, hostVerifier: () => true, tryKeyboard: false });
    });
    const closed = new Promise<void>((r) => client.once('close', () => r()));
    const stream = await new Promise<import('ssh2').ClientChannel>((resolve, reject) => client.exec('sleep 300', (e, s) => (e ? reject(e) : resolve(s))));
    stream.on('data', () => undefined);
    expect((await rawRequest(h.url, 'DELETE', `/api/v1/sandboxes/${sa}/ssh_tokens/${t.token_id}`, { token: a.token })).status).toBe(204);
    await closed;
  });

  it("another sandbox's token opens only its own sandbox", async () => {
    const t2 = await mint(a, sa2);
    await a.api.writeFile(sa, 'whoami.txt', Buffer.from('sa'));
    // Logged in with sa2's token: the session is in sa2, whatever the client says.
    expect((await ssh(t2.token, 'cat whoami.txt 2>/dev/null || echo none; echo "$SLIPWAY_SANDBOX_ID"')).stdout.split('\n')).toEqual(['none', sa2, '']);
    // Naming sa as the user with sa2's token as the password is refused.
    refused(await sshPassword(sa, t2.token, 'echo hi'));
  });

  it("account B's tokens reach nothing of account A's", async () => {
    const tb = await mint(b, sb);
    refused(await sshPassword(sa, tb.token, 'echo hi'));
    // B's API token is no SSH credential, and cannot mint or revoke for A's sandbox.
    refused(await ssh(b.token, 'echo hi'));
    refused(await sshPassword(sa, b.token, 'echo hi'));
    expect((await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sa}/ssh_tokens`, { token: b.token, body: '{}' })).status).toBe(404);
    const ta = await mint(a, sa);
    expect((await rawRequest(h.url, 'DELETE', `/api/v1/sandboxes/${sa}/ssh_tokens/${ta.token_id}`, { token: b.token })).status).toBe(404);
    expect((await ssh(ta.token, 'echo still-works')).stdout.trim()).toBe('still-works');
  });

  it('no port forwarding: -L to a host service is refused by the broker', async () => {
    const t = await mint(a, sa);
    const r = await run('ssh', ['-p', String(sshPort), ...batch(), '-o', 'ExitOnForwardFailure=yes', '-W', `127.0.0.1:${new URL(h.url).port}`, `${t.token}@127.0.0.1`]);
    expect(r.code).not.toBe(0);
    expect(r.stdout).toBe('');
  });

  it('counts logins, refusals and channels in the metrics', async () => {
    const m = await (await rawRequest(h.url, 'GET', '/metrics')).text();
    expect(m).toMatch(/slipway_ssh_events_total\{event="authenticated"\} [1-9]/);
    expect(m).toMatch(/slipway_ssh_events_total\{event="refused"\} [1-9]/);
    expect(m).toMatch(/slipway_ssh_events_total\{event="sftp"\} [1-9]/);
    expect(m).toMatch(/slipway_interactive_bytes_total\{surface="ssh",direction="in"\} [1-9]/);
  });
});
