/**
 * The SSH broker (ADR 0015): an SSH server inside `slipway api` (the ssh2 library) that
 * terminates SSH and bridges each channel to a session in the sandbox the login's token is
 * bound to, through the provider's session primitive (same confinement, limits and environment
 * rules as exec): `exec` runs `sh -c <command>`, `shell` a login shell, both under a terminal
 * allocated inside the sandbox when the client asked for a PTY (resize and signals forwarded);
 * the `sftp` subsystem runs OpenSSH's sftp-server inside the sandbox, so file transfer (sftp,
 * scp, VS Code Remote-SSH) is as confined as any command there. Nothing of the sandbox is
 * parsed here: bytes go both ways.
 *
 * Login: the token as the user name (`ssh -p PORT TOKEN@host`, any method), or the sandbox id
 * as the user name and the token as the password (`slipway sandbox ssh` does this, so the
 * token never shows in a process list). A wrong, expired or revoked token, or one of another
 * sandbox, is refused like any failed login. The host key is made once under `$SLIPWAY_HOME`.
 */
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { Server, utils, type AuthContext, type ServerChannel, type Session } from 'ssh2';
import type { Logger } from 'pino';
import type { SandboxSession, SessionRequest } from '../activities/sandbox/provider';
import { SSH_TOKEN_PATTERN } from '../activities/billing/records';
import { SANDBOX_ID_PATTERN } from '../core/sandbox-service';
import { readOrCreateSecret } from '../lib/secret-file';
import type { SandboxService } from './service';

export const SSH_HOST_KEY_FILE = 'ssh_host_ed25519_key';
/** Where OpenSSH's SFTP server lives on Debian (openssh-sftp-server); visible inside the sandbox's read-only /usr. */
export const SFTP_SERVER = '/usr/lib/openssh/sftp-server';

/** Why ssh2 cannot serve `key` as a host key, or undefined when it can (it parses, signs and verifies). */
export function hostKeyProblem(key: Buffer): string | undefined {
  const parsed = utils.parseKey(key);
  if (parsed instanceof Error) return `not a private key ssh2 can read (${parsed.message})`;
  const probe = Buffer.from('slipway host key check');
  return parsed.verify(probe, parsed.sign(probe)) ? undefined : 'a private key whose signatures do not verify';
}

/**
 * A new ed25519 host key in OpenSSH format. ssh2's own generator drops the leading zero bytes of
 * the public key, so about 1 key in 256 is one it cannot parse back (mscdex/ssh2#1390, #1513):
 * such a key is thrown away and another made.
 */
export function makeSshHostKey(generate: () => Buffer = () => Buffer.from(utils.generateKeyPairSync('ed25519').private)): Buffer {
  let problem: string | undefined;
  for (let attempt = 0; attempt < 16; attempt++) {
    const key = generate();
    problem = hostKeyProblem(key);
    if (!problem) return key;
  }
  throw new Error(`could not make an SSH host key ssh2 can use: ${problem}`);
}

/** The broker's host key (OpenSSH format), made once under `$SLIPWAY_HOME` with mode 0600. */
export function loadSshHostKey(dataDir: string): Promise<Buffer> {
  return readOrCreateSecret(path.join(dataDir, SSH_HOST_KEY_FILE), () => makeSshHostKey(), hostKeyProblem);
}

export interface SshBroker {
  port: number;
  close(): Promise<void>;
}

/** A terminal side from the client: 1 to 10,000 (0, absent or absurd: the default). */
const clampSide = (v: number, dflt: number) => (Number.isInteger(v) && v >= 1 ? Math.min(v, 10_000) : dflt);

type Login = { accountId: string; sandboxId: string; tokenId: string };

/** The token and the sandbox the client named, from one authentication attempt. */
function credentials(ctx: AuthContext): { token: string; claimed?: string } | undefined {
  if (SSH_TOKEN_PATTERN.test(ctx.username)) return { token: ctx.username };
  if (ctx.method === 'password' && SANDBOX_ID_PATTERN.test(ctx.username)) return { token: ctx.password, claimed: ctx.username };
  return undefined;
}

export async function startSshBroker(opts: { service: SandboxService; hostKey: Buffer; host: string; port: number; logger: Logger }): Promise<SshBroker> {
  const { service, logger } = opts;
  const metrics = service.metrics;
  const clients = new Map<{ end(): unknown }, Login | undefined>();
  service.onSshTokenRevoked((tokenId) => {
    for (const [c, login] of clients) if (login?.tokenId === tokenId) c.end();
  });
  const server = new Server({ hostKeys: [opts.hostKey], ident: 'slipway' }, (client) => {
    clients.set(client, undefined);
    client.on('close', () => clients.delete(client));
    let login: Login | undefined;
    client.on('error', (e) => logger.debug({ err: e }, 'ssh client error'));
    client.on('authentication', (ctx) => {
      const creds = credentials(ctx);
      // OpenSSH asks with "none" first: a user name that is not a token is offered password.
      if (!creds) return ctx.reject(['password']);
      void service
        .authenticateSsh(creds.token, creds.claimed)
        .then((found) => {
          if (!found) {
            metrics?.ssh('refused');
            logger.info({ method: ctx.method }, 'ssh login refused');
            return ctx.reject(['password']);
          }
          login = found;
          clients.set(client, found);
          metrics?.ssh('authenticated');
          logger.info({ sandboxId: found.sandboxId, sshTokenId: found.tokenId }, 'ssh login');
          ctx.accept();
        })
        .catch((e) => {
          logger.error({ err: e }, 'ssh authentication failed');
          ctx.reject();
        });
    });
    client.on('ready', () => {
      client.on('session', (accept) => handleSession(accept(), login!));
      // No port forwarding: the broker reaches the sandbox's processes, not networks.
      client.on('tcpip', (_accept, reject) => reject());
      client.on('request', (accept, reject) => reject?.());
    });
  });

  function handleSession(session: Session, login: Login): void {
    let pty: { cols: number; rows: number; term: string } | undefined;
    let running: SandboxSession | undefined;
    session.on('pty', (accept, _reject, info) => {
      // TERM comes from the client: only a plain terminal name reaches the sandbox's environment.
      const term = (info as { term?: string }).term;
      pty = { cols: clampSide(info.cols, 80), rows: clampSide(info.rows, 24), term: term && /^[A-Za-z0-9._+-]{1,64}$/.test(term) ? term : 'xterm-256color' };
      accept?.();
    });
    session.on('env', (_accept, reject) => reject?.());
    session.on('window-change', (accept, _reject, info) => {
      if (running?.pty) running.resize(clampSide(info.cols, 80), clampSide(info.rows, 24));
      accept?.();
    });
    session.on('signal', (accept, _reject, info) => {
      running?.signal(`SIG${info.name}` as NodeJS.Signals);
      accept?.();
    });
    const start = (channel: ServerChannel, kind: string, req: SessionRequest) => {
      metrics?.ssh(kind);
      void bridge(channel, login, req).then((s) => (running = s));
    };
    session.on('exec', (accept, _reject, info) => {
      start(accept(), 'exec', { command: '/bin/sh', args: ['-c', info.command], ...(pty ? { pty, env: { TERM: pty.term } } : {}) });
    });
    session.on('shell', (accept) => {
      start(accept(), 'shell', { command: '/bin/bash', args: ['-l'], ...(pty ? { pty, env: { TERM: pty.term } } : {}) });
    });
    session.on('subsystem', (accept, reject, info) => {
      if (info.name !== 'sftp') return reject?.();
      // Paths the client names relative to its home start in the workspace.
      start(accept(), 'sftp', { command: SFTP_SERVER, args: ['-d', '/workspace'] });
    });
  }

  /** Runs `req` in the login's sandbox and copies bytes between it and the channel; the exit status goes back. */
  async function bridge(channel: ServerChannel, login: Login, req: SessionRequest): Promise<SandboxSession | undefined> {
    let opened: Awaited<ReturnType<SandboxService['openSshSession']>>;
    try {
      opened = await service.openSshSession(login, req);
    } catch (e) {
      channel.stderr.write(`slipway: ${(e as Error).message}\r\n`);
      channel.exit(255);
      channel.end();
      return undefined;
    }
    const { session: s, release } = opened;
    s.stdout.on('data', (d: Buffer) => metrics?.interactiveBytes('ssh', 'out', d.length));
    s.stderr.on('data', (d: Buffer) => metrics?.interactiveBytes('ssh', 'out', d.length));
    channel.on('data', (d: Buffer) => metrics?.interactiveBytes('ssh', 'in', d.length));
    s.stdout.pipe(channel, { end: false });
    s.stderr.pipe(channel.stderr, { end: false });
    channel.pipe(s.stdin);
    s.stdin.on('error', () => undefined);
    channel.on('close', () => s.kill());
    const outputDone = Promise.all([new Promise((r) => s.stdout.once('close', r)), new Promise((r) => s.stderr.once('close', r))]);
    void s.exit
      .then(async (exit: { exitCode: number | null; signal: NodeJS.Signals | null }) => {
        await outputDone;
        if (exit.signal) channel.exit(exit.signal.replace(/^SIG/, ''), false, '');
        else channel.exit(exit.exitCode ?? 255);
        channel.end();
      })
      .finally(release);
    return s;
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => resolve());
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const c of clients.keys()) c.end();
      }),
  };
}
