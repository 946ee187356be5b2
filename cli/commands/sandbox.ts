/**
 * `slipway sandbox ...`: a client of the sandbox REST API (SLIPWAY_API_URL, default
 * http://127.0.0.1:8787, and SLIPWAY_API_TOKEN: the token never goes on the command line,
 * where `ps` would show it).
 */
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { slipwayHome } from '../../lib/settings';
import type { Command } from 'commander';
import { ApiClientError, DEFAULT_API_URL, SandboxApiClient } from '../../api/client';
import type { SandboxView, SessionServerFrame, SshTokenView } from '../../api/schemas';
import { CliError, EXIT } from '../exit-codes';
import { portNumber, positiveNumber, wholeNumber } from '../numbers';
import { GROUP_DESCRIPTIONS } from '../verbs';
import { exitStatus, runTerminal, terminalSize } from '../terminal';

/** bash where the sandbox has it, sh otherwise; interactive either way. */
export const DEFAULT_SHELL = ['/bin/sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash -i; fi; exec sh -i'];

/** A terminal session over the exec WebSocket; resolves with the remote exit code. */
async function openShell(api: SandboxApiClient, id: string, argv: string[], cwd?: string): Promise<number> {
  const ws = api.sessionSocket(id);
  await new Promise<void>((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
    ws.once('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => {
        let code = 'http_error';
        let message = `HTTP ${res.statusCode}`;
        try {
          ({ code, message } = (JSON.parse(body) as { error: { code: string; message: string } }).error);
        } catch {
          /* not JSON */
        }
        reject(new ApiClientError(res.statusCode ?? 500, code, message));
      });
    });
  });
  let exitCode: number | undefined;
  let lastError: { code: string; message: string } | undefined;
  const closed = new Promise<number>((resolve, reject) =>
    ws.on('close', (code) => {
      // 4000 + status: the session was refused (bad start, sandbox ended, limit reached).
      if (code >= 4000 && code < 5000 && lastError) reject(new ApiClientError(code - 4000, lastError.code, lastError.message));
      else resolve(exitCode ?? (code === 1000 ? 0 : EXIT.runFailed));
    }),
  );
  ws.on('message', (data: Buffer) => {
    const frame = JSON.parse(data.toString('utf8')) as SessionServerFrame;
    if (frame.type === 'stdout' || frame.type === 'stderr') (frame.type === 'stdout' ? process.stdout : process.stderr).write(Buffer.from(frame.data, 'base64'));
    else if (frame.type === 'exit') exitCode = exitStatus(frame.exit_code, frame.signal);
    else {
      lastError = frame;
      process.stderr.write(`\r\nslipway: ${frame.code}: ${frame.message}\r\n`);
    }
  });
  const [command, ...args] = argv;
  ws.send(JSON.stringify({ type: 'start', command, args, ...(cwd ? { cwd } : {}), pty: terminalSize(), output_encoding: 'base64' }));
  return runTerminal({
    write: (bytes) => ws.send(bytes),
    resize: (cols, rows) => ws.send(JSON.stringify({ type: 'resize', cols, rows })),
    interrupt: () => ws.send(JSON.stringify({ type: 'signal', signal: 'SIGINT' })),
    exit: closed,
  });
}

export function apiClientFromEnv(env: NodeJS.ProcessEnv = process.env): SandboxApiClient {
  const token = env.SLIPWAY_API_TOKEN;
  if (!token) throw new CliError('set SLIPWAY_API_TOKEN to an account token (`slipway token create --account <id>`)');
  return new SandboxApiClient(env.SLIPWAY_API_URL || DEFAULT_API_URL, token);
}

/** API errors become CLI errors: 4xx are bad input (exit 2), the rest failures (exit 1). */
async function call<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof ApiClientError) throw new CliError(`${e.code}: ${e.message}`, e.status >= 400 && e.status < 500 ? EXIT.badInput : EXIT.runFailed);
    if (e instanceof TypeError && /fetch failed/.test(e.message)) {
      throw new CliError(`cannot reach the sandbox API at ${process.env.SLIPWAY_API_URL || DEFAULT_API_URL} (is \`slipway api\` running?)`, EXIT.runFailed);
    }
    throw e;
  }
}

const out = (line: string): void => void process.stdout.write(`${line}\n`);
const show = (s: SandboxView, json?: boolean) => {
  if (json) return out(JSON.stringify(s));
  out(`${s.id}  ${s.status}${s.end_reason ? ` (${s.end_reason})` : ''}  profile ${s.profile}/${s.platform}`);
  if (s.deadline_at) out(`  deadline ${s.deadline_at}`);
  else if (s.deadline_remaining_seconds !== null) out(`  deadline paused: ${s.deadline_remaining_seconds} s left`);
  if (s.error) out(`  error: ${s.error}`);
};

const collect = (value: string, previous: string[] = []) => [...previous, value];

/**
 * Runs OpenSSH against the broker: the sandbox id as the user and the token as the password,
 * handed over by an askpass helper from the environment, so the token is never in argv. The
 * broker's host key is remembered in `$SLIPWAY_HOME/ssh_known_hosts` on first use.
 */
async function runSsh(t: SshTokenView, id: string, command: string[]): Promise<number> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-ssh-'));
  try {
    const askpass = path.join(dir, 'askpass');
    writeFileSync(askpass, '#!/bin/sh\nprintf \'%s\\n\' "$SLIPWAY_SSH_TOKEN"\n', { mode: 0o700 });
    const home = slipwayHome();
    mkdirSync(home, { recursive: true, mode: 0o700 });
    const args = [
      '-p', String(t.port),
      '-o', `UserKnownHostsFile=${path.join(home, 'ssh_known_hosts')}`,
      '-o', 'StrictHostKeyChecking=accept-new',
      '-o', 'LogLevel=ERROR',
      '-o', 'PreferredAuthentications=password',
      '-o', 'PubkeyAuthentication=no',
      '-o', 'NumberOfPasswordPrompts=1',
      '-l', id,
      t.host,
      ...command,
    ];
    const env = { ...process.env, SLIPWAY_SSH_TOKEN: t.token, SSH_ASKPASS: askpass, SSH_ASKPASS_REQUIRE: 'force' };
    return await new Promise<number>((resolve, reject) => {
      const child = spawn('ssh', args, { stdio: 'inherit', env });
      child.on('error', (e) => reject(new CliError(`cannot run ssh (install openssh-client): ${e.message}`, EXIT.runFailed)));
      child.on('exit', (code, signal) => resolve(code ?? (signal ? 128 : 1)));
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export function registerSandboxCommands(program: Command): void {
  const sandbox = program.command('sandbox').description(GROUP_DESCRIPTIONS.sandbox);

  sandbox
    .command('create')
    .requiredOption('--profile <name>', 'profile')
    .option('--deadline-minutes <n>', 'deadline (not counting suspended time)', positiveNumber('--deadline-minutes'))
    .option('--project <uuid>', 'reporting tag')
    .option('--grant <project:scopes>', 'grant, e.g. 7c4...:cache:read,registry:write (repeatable)', collect)
    .option('--wait', 'wait until ready')
    .option('--json', 'print JSON')
    .description('create a sandbox')
    .action(async (opts) => {
      const grants = ((opts.grant as string[] | undefined) ?? []).map((g) => {
        const i = g.indexOf(':');
        if (i <= 0) throw new CliError(`--grant must be <project-id>:<scope>[,<scope>...], got "${g}"`);
        return { project_id: g.slice(0, i), scopes: g.slice(i + 1).split(',').filter(Boolean) };
      });
      const api = apiClientFromEnv();
      let s = await call(() => api.create({ profile: opts.profile, deadline_minutes: opts.deadlineMinutes, project_id: opts.project, grants }));
      if (opts.wait) {
        while (s.status === 'pending') s = await call(() => api.get(s.id, 30));
      }
      show(s, opts.json);
      if (opts.wait && s.status !== 'ready') process.exitCode = EXIT.runFailed;
    });

  sandbox
    .command('get')
    .argument('<id>')
    .option('--wait', 'wait while pending')
    .option('--json', 'print JSON')
    .description('show a sandbox')
    .action(async (id: string, opts) => {
      const api = apiClientFromEnv();
      show(await call(() => api.get(id, opts.wait ? 60 : undefined)), opts.json);
    });

  sandbox
    .command('list')
    .option('--status <state>', 'only this state')
    .option('--json', 'print JSON')
    .description("list the account's sandboxes")
    .action(async (opts) => {
      const api = apiClientFromEnv();
      const rows = await call(() => api.list({ status: opts.status }));
      if (opts.json) return out(JSON.stringify(rows));
      if (rows.length === 0) return out('no sandboxes');
      for (const s of rows) out(`${s.id}  ${s.status.padEnd(11)} ${s.profile.padEnd(20)} ${s.created_at}`);
    });

  sandbox
    .command('exec')
    .argument('<id>')
    .argument('<command>')
    .argument('[args...]')
    .option('--cwd <dir>', 'working directory inside the sandbox')
    .option('--env <KEY=VALUE>', 'environment variable (repeatable)', collect)
    .option('--timeout <seconds>', 'kill after this long', positiveNumber('--timeout'))
    .option('-i, --stdin', 'pass this process’s standard input')
    .option('--json', 'print the result as JSON instead of replaying the output')
    .description('run a command in a sandbox; exits with its exit code (use -- before the command)')
    .action(async (id: string, command: string, args: string[], opts) => {
      const env: Record<string, string> = {};
      for (const pair of (opts.env as string[] | undefined) ?? []) {
        const i = pair.indexOf('=');
        if (i <= 0) throw new CliError(`--env must be KEY=VALUE, got "${pair}"`);
        env[pair.slice(0, i)] = pair.slice(i + 1);
      }
      const api = apiClientFromEnv();
      const stdin = opts.stdin ? readFileSync(0, 'utf8') : undefined;
      if (opts.json) {
        const r = await call(() => api.exec(id, { command, args, env, cwd: opts.cwd, stdin, timeout_seconds: opts.timeout }));
        out(JSON.stringify(r));
        process.exitCode = r.timed_out ? 124 : (r.exit_code ?? 1);
        return;
      }
      // The output as it comes; a full stdout (a slow pipe) holds the stream, and so the command.
      const exit = await call(() =>
        api.execStream(id, { command, args, env, cwd: opts.cwd, stdin, timeout_seconds: opts.timeout, output_encoding: 'base64' }, (stream, data) => {
          const target = stream === 'stdout' ? process.stdout : process.stderr;
          if (!target.write(Buffer.from(data, 'base64'))) return new Promise<void>((resolve) => target.once('drain', resolve));
        }),
      );
      if (exit.timed_out) process.stderr.write(`slipway: the command timed out\n`);
      process.exitCode = exit.timed_out ? 124 : exitStatus(exit.exit_code, exit.signal);
    });

  sandbox
    .command('shell')
    .argument('<id>')
    .argument('[command...]', 'what to run (default: bash, or sh)')
    .option('--cwd <dir>', 'working directory inside the sandbox')
    .description('open a terminal in a sandbox; exits with the remote exit code (use -- before a command)')
    .action(async (id: string, command: string[], opts) => {
      const api = apiClientFromEnv();
      process.exitCode = await call(() => openShell(api, id, command.length > 0 ? command : DEFAULT_SHELL, opts.cwd));
    });

  const files = sandbox.command('files').description('read, write and delete files in a sandbox');
  files
    .command('get')
    .argument('<id>')
    .argument('<path>')
    .option('-o, --output <file>', 'write here instead of standard output')
    .description('read a file')
    .action(async (id: string, p: string, opts) => {
      const api = apiClientFromEnv();
      const content = await call(() => api.readFile(id, p));
      if (opts.output) writeFileSync(opts.output, content);
      else process.stdout.write(content);
    });
  files
    .command('put')
    .argument('<id>')
    .argument('<path>', 'path inside the sandbox')
    .argument('[local]', 'local file, or - for standard input', '-')
    .description('write a file')
    .action(async (id: string, p: string, local: string) => {
      const api = apiClientFromEnv();
      const content = readFileSync(local === '-' ? 0 : local);
      await call(() => api.writeFile(id, p, content));
      process.stderr.write(`wrote ${content.length} bytes to ${p}\n`);
    });
  files
    .command('rm')
    .argument('<id>')
    .argument('<path>')
    .description('delete a file')
    .action(async (id: string, p: string) => {
      const api = apiClientFromEnv();
      await call(() => api.deleteFile(id, p));
    });

  sandbox
    .command('ssh')
    .argument('<id>')
    .argument('[command...]', 'run this instead of a login shell (use -- before it)')
    .option('--minutes <n>', 'lifetime of the fresh token (default 60)', wholeNumber('--minutes', { min: 1 }))
    .option('--print', 'print the token and the ssh command instead of running ssh')
    .description('open SSH into a sandbox through the broker with a fresh short-lived token (runs `ssh`)')
    .action(async (id: string, command: string[], opts) => {
      const api = apiClientFromEnv();
      const t = await call(() => api.mintSshToken(id, opts.minutes !== undefined ? { ttl_minutes: opts.minutes } : {}));
      if (opts.print) {
        out(t.command);
        out(`  token ${t.token_id} expires ${t.expires_at}`);
        return;
      }
      process.exitCode = await runSsh(t, id, command);
    });

  const ports = sandbox.command('ports').description('preview ports: expose a port a process in the sandbox listens on');
  ports
    .command('open')
    .argument('<id>')
    .argument('<port>', 'the port inside the sandbox', portNumber('<port>'))
    .option('--link-seconds <n>', 'lifetime of the signed link', wholeNumber('--link-seconds', { min: 1 }))
    .option('--json', 'print JSON')
    .description('expose a port; prints its preview URL and a signed link for a browser')
    .action(async (id: string, port: number, opts) => {
      const api = apiClientFromEnv();
      const p = await call(() => api.openPort(id, { port, ...(opts.linkSeconds !== undefined ? { link_ttl_seconds: opts.linkSeconds } : {}) }));
      if (opts.json) return out(JSON.stringify(p));
      out(`port ${p.port}: ${p.url}`);
      out(`  link (until ${p.link_expires_at}): ${p.link}`);
    });
  ports
    .command('list')
    .argument('<id>')
    .description('list the open preview ports')
    .action(async (id: string) => {
      const api = apiClientFromEnv();
      for (const p of await call(() => api.listPorts(id))) out(`${p.port}  ${p.url}`);
    });
  ports
    .command('close')
    .argument('<id>')
    .argument('<port>', 'the port inside the sandbox', portNumber('<port>'))
    .description('close a preview port')
    .action(async (id: string, port: number) => {
      const api = apiClientFromEnv();
      await call(() => api.closePort(id, port));
    });

  sandbox
    .command('destroy')
    .argument('<id>')
    .option('--wait', 'wait until terminated')
    .option('--json', 'print JSON')
    .description('destroy a sandbox')
    .action(async (id: string, opts) => {
      const api = apiClientFromEnv();
      let s = await call(() => api.destroy(id));
      while (opts.wait && s.status !== 'terminated' && s.status !== 'failed') {
        await new Promise((r) => setTimeout(r, 100));
        s = await call(() => api.get(id));
      }
      show(s, opts.json);
    });
}
