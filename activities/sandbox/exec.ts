/**
 * Runs one command in a worktree, confined by bubblewrap or not. Shared by sandboxes, warm-pool
 * entries and the prepared template (their setup commands run under the same confinement as
 * the sandbox's agents and gates).
 */
import { constants as fsConstants, promises as fs } from 'node:fs';
import { runProcess, type RunResult } from '../process';
import path from 'node:path';
import { bwrapArgs, findExecutable, probeBwrap, requireBwrap, resolveExtraPaths, SANDBOX_WORKSPACE, toSandboxPath, type BubblewrapConfinement, type ConfinementLayout } from './bubblewrap';
import { CONFINED_GIT_ENV, ensureSandboxGit, locateWorktree, SANDBOX_GIT_MOUNT, sandboxAgentHome } from './sandbox-git';
import { resolveInside } from './paths';
import { BLOCK_FD, egressSetup, findEgressTools, INFO_FD, loopbackResolver, PASTA_DNS_HOST_MISSING, PASTA_MISSING_MESSAGE, pastaHasDnsHost, sandboxResolvConf } from './egress';
import { limitedCommand, type SandboxLimits } from './limits';
import { randomBytes } from 'node:crypto';
import { spawnSync, type ChildProcess } from 'node:child_process';
import { closeInheritedFds } from './close-fds';
import { SANDBOX_BASE_ENV, type ExecRequest } from './provider';
import { childEnv } from '../process';
import { seccompFilter } from './seccomp';
import { trackSandboxProcess } from './port-relay';
import type { Writable } from 'node:stream';

export interface ExecTarget {
  /** The worktree (absolute). */
  root: string;
  /** Needed under confinement: the repository, and the branch whose ref the command may move (trusted, from Slipway's records). */
  repository?: string;
  branch?: string;
  confinement?: BubblewrapConfinement;
}

async function realpathOrSelf(p: string): Promise<string> {
  return fs.realpath(p).catch(() => p);
}

export async function execInWorktree(target: ExecTarget, req: ExecRequest): Promise<RunResult> {
  const cmd = await preparedCommand(target, req);
  try {
    return await runProcess({ ...commonOptions(req), ...cmd.spawn, ...(cmd.cleanup ? { onExit: cmd.cleanup } : {}) });
  } finally {
    await cmd.cleanup?.();
  }
}

/**
 * A request turned into the process to spawn: confinement, limits, environment scrubbing and
 * host-path translation applied. One place for exec and interactive sessions (session.ts), so
 * both run under exactly the same rules. `cleanup` (idempotent) kills what the limits' cgroup
 * still holds and stops the network helper; call it once the leader exited.
 */
export interface PreparedCommand {
  spawn: {
    command: string;
    args: string[];
    env: NodeJS.ProcessEnv;
    cwd: string;
    pwd?: string;
    /** Pipes after stdin/stdout/stderr the wrappers use (fds 3, 4, ...); a caller's own pipes come after them. */
    extraPipes: number;
    prepare?: (child: ChildProcess) => Promise<void>;
  };
  /** Absent (unconfined): nothing to stop besides the process group, which the runner kills; the reaper (setpriv, unshare) takes the rest down with the leader. */
  cleanup?: () => Promise<void>;
}

/** `passFds`: descriptors the caller passes on purpose besides stdio and the wrappers' pipes (a terminal's control pipe). */
export async function preparedCommand(target: ExecTarget, req: Pick<ExecRequest, 'command' | 'args' | 'shell' | 'cwd' | 'env' | 'inheritEnv'>, passFds: number[] = []): Promise<PreparedCommand> {
  const confinement = target.confinement;
  if (!confinement) {
    const cwd = req.cwd ? await resolveInside(target.root, req.cwd) : await realpathOrSelf(target.root);
    // Unconfined, the command runs on the host as the worker's user anyway: its environment in
    // the reaper's (setpriv, unshare) gives it nothing it does not have (ADR 0027).
    const env: NodeJS.ProcessEnv = req.inheritEnv === false ? { ...req.env } : { ...process.env, ...req.env };
    // IS_SANDBOX=1 lets Claude Code bypass its permissions as root: only where Slipway confines (below), never inherited from the worker.
    if (req.env?.IS_SANDBOX === undefined) delete env.IS_SANDBOX;
    const inner = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
    const [command, ...args] = [...unconfinedReaper(), ...inner];
    return { spawn: { command, args, env, cwd, extraPipes: 0 } };
  }
  const cmd = await confinedCommand(target, req, { seccomp: true });
  const limited = await limitedCommand(confinement.limits, `x${process.pid}-${++execCount}-${randomBytes(3).toString('hex')}`, cmd.command, cmd.args);
  // Nothing the worker holds open reaches the sandbox: only stdio and the pipes above (close-fds.ts).
  // The same step joins the limits' cgroups: one shell in front of bwrap, not two.
  const closed = closeInheritedFds([...Array.from({ length: 3 + cmd.extraPipes }, (_, fd) => fd), ...passFds], limited.direct.command, limited.direct.args, limited.join);
  // Recorded while it runs (exec and sessions alike): preview ports reach a port only in the
  // network namespace of a running command of the sandbox (port-relay.ts).
  let untrack: (() => void) | undefined;
  return {
    spawn: {
      command: closed.command,
      args: closed.args,
      env: cmd.env,
      cwd: cmd.cwd,
      extraPipes: cmd.extraPipes,
      prepare: async (child: ChildProcess) => {
        if (child.pid !== undefined) untrack = trackSandboxProcess(target.root, child.pid);
        feedPipes(child, cmd.pipes);
        await cmd.egress?.prepare(child);
      },
    },
    cleanup: async () => {
      untrack?.();
      await cmd.egress?.stop();
      await limited.cleanup();
    },
  };
}

/**
 * Writes what bwrap reads on its pipes (its environment options, the seccomp filter). bwrap reads
 * each to EOF before it runs the command; a bwrap that died first closes them: its exit is the
 * error reported, not EPIPE here.
 */
export function feedPipes(child: ChildProcess, pipes: ConfinedCommand['pipes']): void {
  for (const p of pipes) (child.stdio[p.fd] as Writable | null)?.on('error', () => undefined).end(p.data);
}
let execCount = 0;

function commonOptions(req: ExecRequest) {
  return { stdin: req.stdin, timeoutMs: req.timeoutMs, signal: req.signal, killGraceMs: req.killGraceMs, onLine: req.onLine, maxCaptureBytes: req.maxCaptureBytes };
}

/** The sandbox's agent home, created private (0700) if missing; a link or non-folder there is refused, never followed. */
async function makeAgentHome(dir: string): Promise<string> {
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  const st = await fs.lstat(dir);
  if (!st.isDirectory()) throw new Error(`the sandbox's agent home ${dir} is not a folder`);
  return dir;
}

/**
 * Where `rel` (a provider's config file) is bound in the agent home: real folders down to it
 * (made 0700 if missing) and a regular file as mount point. The home is the agent's between runs:
 * a link or a non-folder it planted on the way is refused, never followed.
 */
async function configMountPoint(home: string, rel: string): Promise<string> {
  const parts = rel.split('/');
  if (path.isAbsolute(rel) || parts.some((p) => p === '' || p === '.' || p === '..')) throw new Error(`agent config path ${JSON.stringify(rel)} is not a plain relative path`);
  let current = home;
  for (const part of parts.slice(0, -1)) {
    current = path.join(current, part);
    const st = await fs.lstat(current).catch(() => undefined);
    if (!st) await fs.mkdir(current, { mode: 0o700 });
    else if (!st.isDirectory() || st.isSymbolicLink()) throw new Error(`the agent home's ${path.relative(home, current)} is not a plain folder; its config cannot be bound there`);
  }
  const target = path.join(current, parts[parts.length - 1]!);
  const st = await fs.lstat(target).catch(() => undefined);
  if (!st) await (await fs.open(target, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | fsConstants.O_NOFOLLOW, 0o600)).close();
  else if (!st.isFile()) throw new Error(`the agent home's ${rel} is not a regular file; its config cannot be bound there`);
  return target;
}

/**
 * The environment of Slipway's host-side helpers of a confined command: the descriptor step
 * (bash), the limits wrapper (sh, prlimit) and bwrap run on the host before any namespace exists,
 * so they get this and nothing of the command's (LD_PRELOAD, GCONV_PATH, BASH_ENV, ... would run
 * code in them, unconfined). The command's own environment reaches it through bwrap (ADR 0027).
 */
export const HOST_HELPER_ENV: Readonly<Record<string, string>> = Object.freeze({ PATH: SANDBOX_BASE_ENV.PATH });

/**
 * bwrap options, NUL-separated for `--args FD`, that give the command exactly `env`: bwrap reads
 * them from a pipe, so no value is in any process's argv (`/proc/PID/cmdline` is readable by the
 * host's users) nor in the helpers' environment. A NUL would split a value into further options
 * (a `--bind` of the host's root): refused, naming the variable.
 */
export function bwrapEnvOptions(env: Record<string, string>): Buffer {
  const parts = ['--clearenv'];
  for (const [name, value] of Object.entries(env)) {
    if (name === '' || name.includes('=') || name.includes('\0')) throw new Error(`environment variable ${JSON.stringify(name)}: a name must be non-empty, without "=" or NUL`);
    if (value.includes('\0')) throw new Error(`environment variable ${name}: its value contains a NUL byte`);
    parts.push('--setenv', name, value);
  }
  return Buffer.from(parts.map((p) => `${p}\0`).join(''));
}

/** A confined command: bwrap's command line, the helpers' environment, and what bwrap reads on its pipes. */
export interface ConfinedCommand {
  command: string;
  args: string[];
  /** For the spawn: HOST_HELPER_ENV. The command's environment is in `pipes` (bwrap --args). */
  env: NodeJS.ProcessEnv;
  cwd: string;
  egress?: ReturnType<typeof egressSetup>;
  /** Data for the descriptors bwrap reads (its environment options, the seccomp filter); write with feedPipes. */
  pipes: Array<{ fd: number; data: Buffer }>;
  /** Pipes the spawn needs after stdin/stdout/stderr (fds 3, 4, ...): egress info and block, seccomp, environment. */
  extraPipes: number;
}

/**
 * The bwrap command line for a request in a confined sandbox, with the sandbox's own git
 * directory in place of the repository's (sandbox-git.ts).
 */
export async function confinedCommand(
  target: ExecTarget,
  req: Pick<ExecRequest, 'command' | 'args' | 'shell' | 'cwd' | 'env' | 'inheritEnv' | 'agentHome' | 'agentConfig'>,
  opts: { seccomp?: boolean } = {},
): Promise<ConfinedCommand> {
  const confinement = target.confinement;
  if (!confinement) throw new Error('confinedCommand needs a confinement');
  if (!target.repository) throw new Error(`confined commands need the repository of ${target.root}`);
  const bwrap = requireBwrap(confinement.bwrapPath);
  await probeBwrap(bwrap);
  const loc = await locateWorktree(target.repository, target.root);
  // A cwd as the sandbox knows it (/workspace/src) means the same as the relative one.
  const asked = req.cwd !== undefined && (req.cwd === SANDBOX_WORKSPACE || req.cwd.startsWith(`${SANDBOX_WORKSPACE}/`)) ? path.posix.relative(SANDBOX_WORKSPACE, req.cwd) || '.' : req.cwd;
  const cwd = asked ? await resolveInside(loc.worktree, asked) : loc.worktree;
  if (!(await fs.stat(cwd).then((s) => s.isDirectory(), () => false))) throw new ExecCwdError(req.cwd ?? '.');
  const sg = await ensureSandboxGit(loc, target.branch);
  // The trusted link is bound over `.git`; something else there (a folder, a link) was put by the sandbox.
  const dotGit = await fs.lstat(path.join(loc.worktree, '.git')).catch(() => undefined);
  if (dotGit && !dotGit.isFile()) throw new Error("the sandbox's .git was replaced by something that is not a file; it cannot run commands");
  const layout: ConfinementLayout = {
    worktree: loc.worktree,
    binds: [{ source: sg.gitDir, dest: SANDBOX_GIT_MOUNT }],
    roBinds: [...sg.sharedObjects, { source: sg.gitLink, dest: `${SANDBOX_WORKSPACE}/.git` }],
  };
  // Made by Slipway (never a path the sandbox chose), bound at its host path so the worker's
  // session carry (session-carry.ts) names the same files the agent writes.
  const agentHome = req.agentHome ? await makeAgentHome(sandboxAgentHome(loc.repository, loc.worktree)) : undefined;
  if (agentHome) layout.binds.push({ source: agentHome, dest: agentHome });
  // The provider's config files, read-only on top of the writable home (roBinds come after binds):
  // the agent reads the worker's config but cannot change it, replace it or move it.
  for (const file of agentHome ? (req.agentConfig ?? []) : []) {
    const source = await fs.realpath(file.source).catch(() => undefined);
    if (!source || !(await fs.stat(source).then((s) => s.isFile(), () => false))) continue; // not configured: absent
    layout.roBinds.push({ source, dest: await configMountPoint(agentHome!, file.path) });
  }
  // Host paths never reach the sandbox (ADR 0006): the worktree's are translated to
  // /workspace, and what still names the repository or Slipway's data (an inherited PWD,
  // INIT_CWD, npm_* of a worker started in the repository) means nothing inside and is dropped.
  const roots = [target.root, loc.worktree];
  const hidden = [target.repository, loc.repository, loc.commonDir, process.env.SLIPWAY_HOME].filter((p): p is string => !!p && p !== '/');
  const extra = await resolveExtraPaths(confinement);
  // Bound at their host paths (the objective folder, agent CLIs): a value naming one stays usable.
  const visible = [...(confinement.readable ?? []), ...extra.readable, ...(confinement.writable ?? []), ...extra.writable];
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(req.inheritEnv === false ? { ...req.env } : { ...process.env, ...req.env })) {
    if (value === undefined || key === 'SLIPWAY_HOME' || key === 'OLDPWD') continue;
    const translated = toSandboxPath(roots, value);
    const names = (v: string) => hidden.some((h) => v.includes(h)) && !visible.some((p) => v === p || v.startsWith(`${p}/`));
    if (!names(translated)) env[key] = translated;
    // A search path keeps its other entries (PATH with the repository's node_modules/.bin).
    else if (key.endsWith('PATH')) env[key] = translated.split(':').filter((entry) => !names(entry)).join(':');
  }
  // The host's TMPDIR may not exist in the sandbox; /tmp is private and writable.
  if (req.env?.TMPDIR === undefined) env.TMPDIR = '/tmp';
  Object.assign(env, CONFINED_GIT_ENV);
  // True here: bubblewrap confines the command (Claude Code needs it for bypassPermissions as root).
  env.IS_SANDBOX = '1';
  if (agentHome) env.HOME = agentHome;
  const inner = (req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])]).map((a) => toSandboxPath(roots, a));
  const inside = path.posix.join(SANDBOX_WORKSPACE, path.relative(loc.worktree, cwd).split(path.sep).join('/'));
  // Network on: egress only, through pasta (egress.ts); without pasta, the host's network.
  const tools = confinement.network ? egressTools() : undefined;
  const resolver = tools ? dnsResolverFor(tools.pasta) : undefined;
  if (resolver) layout.roBinds.push({ source: sandboxResolvConf(), dest: '/etc/resolv.conf' });
  const bwrapBase = bwrapArgs(layout, confinement, inside, extra);
  // Descriptors after stdio: egress's info and block pipes (fixed), then the seccomp filter and
  // the environment, each on the next free one.
  let nextFd = tools ? BLOCK_FD + 1 : 3;
  const pipes: ConfinedCommand['pipes'] = [];
  const program = opts.seccomp && confinement.seccomp !== false ? seccompFilter() : undefined;
  if (program) pipes.push({ fd: nextFd++, data: program });
  // What the command sees: launch-location variables and payload keys dropped as for any child
  // (process.ts childEnv), PWD its directory inside.
  const delivered: Record<string, string> = {};
  for (const [k, v] of Object.entries(childEnv('/', env))) if (v !== undefined) delivered[k] = v;
  delivered.PWD = inside;
  pipes.push({ fd: nextFd++, data: bwrapEnvOptions(delivered) });
  const front = [...(program ? ['--seccomp', String(pipes[0]!.fd)] : []), '--args', String(pipes[pipes.length - 1]!.fd)];
  if (tools) front.unshift('--unshare-net', '--info-fd', String(INFO_FD), '--block-fd', String(BLOCK_FD));
  return {
    command: bwrap,
    args: [...front, ...bwrapBase, '--', ...inner],
    env: { ...HOST_HELPER_ENV },
    cwd: loc.worktree,
    ...(tools ? { egress: egressSetup(tools, resolver ? { resolver } : undefined) } : {}),
    pipes,
    extraPipes: nextFd - 3,
  };
}

/**
 * Even unconfined, a command runs in its own PID namespace that dies with the worker: setpriv
 * gives unshare a parent-death signal, and unshare kills the namespace's first process when it
 * dies, which ends every process of the namespace. So an agent never outlives a worker killed
 * with SIGKILL, and a daemon never outlives its command. Without the tools (or the right to make
 * a PID namespace), commands run plainly, with a warning once.
 */
let reaperPrefix: string[] | undefined;
export function unconfinedReaper(): string[] {
  if (reaperPrefix) return reaperPrefix;
  const setpriv = findExecutable('setpriv');
  const unshare = findExecutable('unshare');
  const userns = process.getuid?.() === 0 ? [] : ['--map-current-user'];
  const prefix = setpriv && unshare ? [setpriv, '--pdeathsig', 'KILL', '--', unshare, ...userns, '--pid', '--fork', '--kill-child', '--'] : [];
  if (prefix.length > 0) {
    const probe = spawnSync(prefix[0], [...prefix.slice(1), 'true'], { stdio: 'ignore', timeout: 10_000 });
    if (probe.status !== 0) prefix.length = 0;
  }
  if (prefix.length === 0) console.warn('slipway: cannot give unconfined commands a PID namespace (setpriv and unshare from util-linux, and user namespaces, are needed): an agent may outlive a killed worker');
  reaperPrefix = prefix;
  return prefix;
}

let dnsWarned = false;
/** The host's loopback resolver when pasta can forward to it; warns once when it cannot. */
function dnsResolverFor(pasta: string): string | undefined {
  const resolver = loopbackResolver();
  if (!resolver) return undefined;
  if (pastaHasDnsHost(pasta)) return resolver;
  if (!dnsWarned) {
    dnsWarned = true;
    console.warn(`slipway: ${PASTA_DNS_HOST_MISSING(resolver)}`);
  }
  return undefined;
}

let egressWarned = false;
function egressTools(): ReturnType<typeof findEgressTools> {
  const tools = findEgressTools();
  if (!tools && !egressWarned) {
    egressWarned = true;
    console.warn(`slipway: ${PASTA_MISSING_MESSAGE}`);
  }
  return tools;
}

/** The working directory asked for does not exist in the sandbox (a caller's mistake, not a sandbox failure). */
export class ExecCwdError extends Error {
  constructor(readonly cwd: string) {
    super(`cwd "${cwd}" is not a directory in the sandbox`);
    this.name = 'ExecCwdError';
  }
}

/** The stricter of two confinements: the provider's own (if any) is never loosened by a sandbox's. */
export function combineConfinement(
  provider: BubblewrapConfinement | undefined,
  sandbox: BubblewrapConfinement | undefined,
): BubblewrapConfinement | undefined {
  if (!provider) return sandbox;
  if (!sandbox) return provider;
  return {
    ...provider,
    network: provider.network && sandbox.network,
    ...(provider.limits || sandbox.limits ? { limits: stricterLimits(provider.limits, sandbox.limits) } : {}),
    hidden: [...new Set([...(provider.hidden ?? []), ...(sandbox.hidden ?? [])])],
    readable: [...new Set([...(provider.readable ?? []), ...(sandbox.readable ?? [])])],
  };
}

function stricterLimits(a: SandboxLimits | undefined, b: SandboxLimits | undefined): SandboxLimits {
  const out: SandboxLimits = {};
  for (const key of ['pids', 'memoryBytes', 'cpus', 'fileSizeBytes', 'cpuSeconds', 'diskBytes'] as const) {
    const values = [a?.[key], b?.[key]].filter((v): v is number => v !== undefined);
    if (values.length > 0) out[key] = Math.min(...values);
  }
  return out;
}
