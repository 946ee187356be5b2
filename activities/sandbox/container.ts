/**
 * Container sandboxes (`provider: podman`, and `docker` through the same code: ADR 0012). One
 * container per sandbox, from the image scripts/sandbox-image.sh builds, kept alive by
 * `sleep infinity`; every command runs through `<engine> exec`.
 *
 *   <repo>/.slipway/containers/<group>/<name>/       the workspace, bind-mounted at /workspace
 *   <repo>/.slipway/containers/<group>/<name>.in/    the base bundle, read-only at /run/slipway/in
 *   <repo>/.slipway/containers/<group>/<name>.json   Slipway's record (branch, start commit, state)
 *
 * The workspace is not a directory of the user's repository: it is a repository of its own,
 * made inside the container from a bundle, and its work comes back as a bundle (git-transport.ts).
 * Slipway never runs git on it from outside. Files are read and written from the host through
 * the bind mount with the same descriptor-relative confinement as local sandboxes (file-io.ts).
 *
 * Containers run with every capability dropped, `no-new-privileges`, no network unless the
 * sandbox has it, and CPU, memory and pids limits from its settings.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { Duplex, type Readable, type Writable } from 'node:stream';
import { SLIPWAY_DIR } from '../../core/ids';
import { writeJsonAtomic } from '../../lib/atomic-write';
import { branchExists, commitIdentity, ensureSlipwayExcluded, git, gitMaybe, resolveCommit } from '../../lib/git';
import { killProcessGroup, runProcess, type RunResult } from '../process';
import { deleteSandboxFile, listSandboxDir, openSandboxFile, readSandboxFile, writeSandboxFile, type FileEntry, type FileIoOptions, type OpenedFile } from './file-io';
import { BUNDLE_HEAD_SCRIPT, collectKnownHead, importBundle, makeBaseBundle, START_FROM_BUNDLE_SCRIPT, START_PREPARED_SCRIPT } from './git-transport';
import { parseProviderRoot, providerSandboxRoot, resolveInside } from './paths';
import { PortUnreachableError } from './port-relay';
import { SANDBOX_BASE_ENV, type ExecRequest, type SandboxCreateRequest, type SandboxHandle, type SandboxLiveness, type SandboxProvider, type SandboxSession, type SessionExit, type SessionRequest } from './provider';
import { CONTAINER_IN, CONTAINER_WORKSPACE, defaultSandboxImage, engine, engineCwd, engineEnv, PODMAN_INSTALL, sandboxRunArgs, validateContainerSettings, type ContainerEngine, type ContainerSettings } from './container-engine';
import { claimContainerPoolEntry, containerPoolKey, fillContainerPool, releaseClaimedEntry, type ContainerPoolSpec } from './container-pool';
import { FILL_FROM_TEMPLATE_SCRIPT, usableContainerTemplate } from './container-template';
import { checkSize, CONTROL_FD, CONTROLLER, SessionRequestError, sessionOver, terminalCommandLine } from './session';
import { OBJECT_ID } from './sandbox-git';
import { envHeader, envHeaderArgv } from './env-header';
import { runProjectSetup } from './setup';
import { PoolFills } from './pool-fills';

export {
  CONTAINER_IN,
  CONTAINER_WORKSPACE,
  defaultSandboxImage,
  engine,
  engineEnv,
  PODMAN_INSTALL,
  PROJECT_CONTAINERS_CONF,
  PROJECT_IMAGE_FILE,
  runArgs,
  validateContainerSettings,
  type ContainerEngine,
  type ContainerSettings,
} from './container-engine';

export const CONTAINERS_DIR = `${SLIPWAY_DIR}/containers`;
export interface ContainerProviderOptions {
  engine?: ContainerEngine;
  /** Image to run; default SLIPWAY_SANDBOX_IMAGE, else the one scripts/setup.sh built. */
  image?: string;
  /** Settings for sandboxes whose create request names none. */
  defaults?: ContainerSettings;
  /** Largest bundle a collect accepts (bytes). */
  maxBundleBytes?: number;
}

export interface ContainerRecord {
  version: 1;
  /** The engine that made the container (absent in records written before it was kept: podman). */
  engine?: ContainerEngine;
  sandboxId: string;
  group: string;
  name: string;
  branch: string;
  baseCommit: string;
  /** The commit the workspace started at: collected work must descend from it. */
  startCommit: string;
  container: string;
  state: 'creating' | 'ready' | 'suspended';
  /** HEAD when suspended (list reports it without starting the container). */
  suspendedHead?: string;
  /** The warm-pool entry the container came from (its old paths are symlinks to this sandbox's). */
  pooledAs?: string;
  createdAt: string;
}

export function containerSandboxRoot(repository: string, group: string, name: string): string {
  return providerSandboxRoot(CONTAINERS_DIR, repository, group, name);
}

/** `<repo>/.slipway/containers/<group>/<name>` -> its parts, or undefined for other paths. */
export function parseContainerRoot(root: string): { repository: string; group: string; name: string } | undefined {
  return parseProviderRoot(CONTAINERS_DIR, root);
}

/** Container names are derived from the workspace path: one container per sandbox, found again after a restart. */
export function containerName(root: string): string {
  return `slipway-${createHash('sha256').update(path.resolve(root)).digest('hex').slice(0, 24)}`;
}

/** The record a container provider keeps beside the sandbox root `root` (undefined: none, or unreadable). */
export const readContainerRecord = (root: string) => readRecord(`${path.resolve(root)}.json`);

const readRecord = async (file: string): Promise<ContainerRecord | undefined> => {
  try {
    return JSON.parse(await fs.readFile(file, 'utf8')) as ContainerRecord;
  } catch {
    return undefined;
  }
};

/** Kills every process whose command line holds the exec id, with its process group. The id comes in two halves so this script's own argv never matches. */
/**
 * Sends a signal to every process of an exec's group but its wrapper (the shell with the id in
 * its argv, which would die of most signals before the command could answer them); $1$2 as
 * for KILL_EXEC_SCRIPT.
 */
export const SIGNAL_EXEC_SCRIPT = [
  'id="$1$2"; sig=$3; groups=; wrappers=',
  'for d in /proc/[0-9]*; do',
  '  [ "${d#/proc/}" = "$$" ] && continue',
  '  if tr "\\000" " " < "$d/cmdline" 2>/dev/null | grep -qF -- "$id"; then',
  '    wrappers="$wrappers ${d#/proc/} "',
  '    groups="$groups $(sed "s/.*) //" "$d/stat" 2>/dev/null | cut -d" " -f3) "',
  '  fi',
  'done',
  'for d in /proc/[0-9]*; do',
  '  p=${d#/proc/}; pg=$(sed "s/.*) //" "$d/stat" 2>/dev/null | cut -d" " -f3)',
  '  case "$wrappers" in *" $p "*) continue ;; esac',
  '  case "$groups" in *" $pg "*) kill -s "$sig" "$p" 2>/dev/null ;; esac',
  'done',
  'exit 0',
].join('\n');

/**
 * The preview relay, run by the container's node inside the container's network namespace:
 * `+` once connected to 127.0.0.1:$1 there, then bytes both ways over stdio; exit 3 when
 * nothing listens. What it sends back is the sandbox's, as untrusted as any preview.
 */
const PORT_RELAY_SCRIPT = [
  "const s = require('net').connect(Number(process.argv[1]), '127.0.0.1');",
  "s.once('connect', () => { process.stdout.write('+'); process.stdin.pipe(s); s.pipe(process.stdout); });",
  "s.on('error', () => process.exit(3));",
  "s.on('close', () => process.exit(0));",
].join('\n');

export const KILL_EXEC_SCRIPT = [
  'id="$1$2"; sig=$3',
  'for d in /proc/[0-9]*; do',
  '  [ "${d#/proc/}" = "$$" ] && continue',
  '  if tr "\\000" " " < "$d/cmdline" 2>/dev/null | grep -qF -- "$id"; then',
  '    pg=$(sed "s/.*) //" "$d/stat" 2>/dev/null | cut -d" " -f3)',
  '    [ -n "$pg" ] && [ "$pg" != 0 ] && kill -s "$sig" -- "-$pg" 2>/dev/null',
  '    kill -s "$sig" "${d#/proc/}" 2>/dev/null',
  '  fi',
  'done',
  'exit 0',
].join('\n');

/** An exec's id: names this process (its host pid), which is how a later worker tells whose commands these are. */
export function newExecId(): string {
  return `slipway-exec-${process.pid}-${randomBytes(8).toString('hex')}`;
}

/**
 * What runs `inner` inside a container so that a kill can end it there: its own session and
 * process group (setsid), under a shell that stays (a command follows) with the id in its argv.
 */
export function execWrapper(id: string, inner: string[]): string[] {
  return ['setsid', '-w', '/bin/sh', '-c', '"$@"; s=$?; exit $s', id, ...inner];
}

/** Signals an exec's process group inside the container (killing the engine client would leave it running). */
export async function killExecInContainer(kind: ContainerEngine, container: string, id: string, signal: string): Promise<void> {
  const half = Math.floor(id.length / 2);
  await engine(kind, ['exec', container, '/bin/sh', '-c', KILL_EXEC_SCRIPT, 'kill', id.slice(0, half), id.slice(half), signal], { allowFail: true });
}

interface ContainerState {
  Id: string;
  Status: string;
  OOMKilled: boolean;
  ExitCode: number;
}

/**
 * The kernel's own record of an OOM kill in the container's memory cgroup: the `oom-kill:` line
 * whose `oom_memcg` names the container's id (podman's `libpod-<id>`, docker's `docker-<id>.scope`
 * or `/docker/<id>`). The engine's `State.OOMKilled` is not enough: podman 4.3 with cgroupfs on
 * cgroup v1 (this machine) leaves it false for a container its OOM killer ended (ADR 0025).
 * Undefined when there is no such line, or the kernel log cannot be read (no CAP_SYSLOG).
 */
export async function kernelOomKill(containerId: string, kmsg = '/dev/kmsg'): Promise<string | undefined> {
  if (!/^[0-9a-f]{12,64}$/.test(containerId)) return undefined;
  const handle = await fs.open(kmsg, constants.O_RDONLY | constants.O_NONBLOCK).catch(() => undefined);
  if (!handle) return undefined;
  const buffer = Buffer.alloc(8192);
  let found: string | undefined;
  try {
    // One record per read, oldest first; EAGAIN once the buffer is read through.
    for (;;) {
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, null).catch((e: NodeJS.ErrnoException) => {
        if (e.code === 'EPIPE') return { bytesRead: -1 }; // a record was overwritten while reading: go on
        throw e;
      });
      if (bytesRead === 0) break;
      if (bytesRead < 0) continue;
      const message = buffer.toString('utf8', 0, bytesRead).split(';').slice(1).join(';').split('\n')[0];
      const memcg = /oom-kill:.*\boom_memcg=([^,]+)/.exec(message)?.[1];
      if (memcg && memcg.includes(containerId)) found = message.trim();
    }
  } catch {
    // EAGAIN: read through to the newest record. Anything else: no more evidence.
  } finally {
    await handle.close();
  }
  return found;
}

export class ContainerSandboxProvider implements SandboxProvider {
  /** Containers run on this worker's host: its sandboxes are owned by this worker. */
  readonly hostBound = true;
  readonly kind: ContainerEngine;
  /** Commands see the workspace at a fixed path (the contract suite checks it). */
  readonly confined = true;
  private readonly image?: string;
  private readonly defaults: ContainerSettings;
  private readonly maxBundleBytes?: number;
  /** Containers this process has already swept of a dead worker's commands. */
  private readonly swept = new Set<string>();

  constructor(options: ContainerProviderOptions = {}) {
    this.kind = options.engine ?? 'podman';
    this.image = options.image;
    this.defaults = options.defaults ?? { network: false };
    this.maxBundleBytes = options.maxBundleBytes;
  }

  /** Background fills of the warm pool (one per repository and key at a time). */
  private readonly fills = new PoolFills();

  /** Refills the pool in the background after a create; failures only cost the next create a cold start. */
  private scheduleFill(repo: string, spec: ContainerPoolSpec, size: number, base?: string): void {
    const key = `${repo}\0${containerPoolKey(spec)}`;
    void this.fills.run(key, () =>
      fillContainerPool(repo, path.join(repo, CONTAINERS_DIR), spec, size, base).then(
        (r) => r.made,
        () => 0,
      ),
    );
  }

  /** Settles once no background fill is running (benchmarks and tests wait on it, never on time). */
  async whenPoolIdle(): Promise<void> {
    await this.fills.whenIdle();
  }

  /**
   * Fills the warm pool of these settings (the template image when one is current for them) up
   * to `size` now, and waits: for pre-warming (objective start, benchmarks).
   */
  async fillWarmPool(req: Pick<SandboxCreateRequest, 'repository' | 'base' | 'container' | 'setup'> & { size: number }): Promise<{ made: number; retired: number }> {
    const repo = await fs.realpath(req.repository);
    await ensureSlipwayExcluded(repo);
    const settings = req.container ?? this.defaults;
    validateContainerSettings(settings);
    const sandboxImage = this.imageName();
    const setup = req.setup && (req.setup.commands.length > 0 || req.setup.verify.length > 0) ? req.setup : undefined;
    const template = setup ? await usableContainerTemplate(repo, this.kind, { baseCommit: await resolveCommit(repo, req.base), baseImage: sandboxImage, setup }) : undefined;
    return fillContainerPool(repo, path.join(repo, CONTAINERS_DIR), { kind: this.kind, image: template?.image ?? sandboxImage, settings }, req.size, template ? undefined : await resolveCommit(repo, req.base));
  }

  private imageName(): string {
    const image = this.image ?? defaultSandboxImage();
    if (!image) throw new Error(`no sandbox image: run scripts/setup.sh (it builds one) or set SLIPWAY_SANDBOX_IMAGE`);
    return image;
  }

  private async where(root: string) {
    const resolved = path.resolve(root);
    const parsed = parseContainerRoot(resolved);
    if (!parsed) throw new Error(`not a container sandbox root (<repo>/${CONTAINERS_DIR}/<group>/<name>): ${root}`);
    const recordFile = `${resolved}.json`;
    return { ...parsed, root: resolved, recordFile, inDir: `${resolved}.in`, container: containerName(resolved) };
  }

  private async inspect(container: string): Promise<ContainerState | undefined> {
    // Id and State in one call; both engines take the same Go template.
    const r = await engine(this.kind, ['inspect', '--type', 'container', '--format', '{"Id":{{json .ID}},"State":{{json .State}}}', container], { allowFail: true });
    if (r.code !== 0) return undefined;
    const parsed = JSON.parse(r.stdout.trim()) as { Id: string; State: Omit<ContainerState, 'Id'> };
    return { ...parsed.State, Id: parsed.Id };
  }

  async create(req: SandboxCreateRequest): Promise<SandboxHandle> {
    const started = Date.now();
    const settings = req.container ?? this.defaults;
    validateContainerSettings(settings);
    const sandboxImage = this.imageName();
    const repo = await fs.realpath(req.repository);
    await ensureSlipwayExcluded(repo);
    const w = await this.where(containerSandboxRoot(repo, req.group, req.name));
    const [baseCommit, record, state] = await Promise.all([resolveCommit(repo, req.base), readRecord(w.recordFile), this.inspect(w.container)]);

    if (record && record.state !== 'creating' && state) {
      if (record.branch !== req.branch) throw new Error(`sandbox ${w.root} exists on branch ${record.branch}, expected ${req.branch}`);
      if (state.Status !== 'running') await engine(this.kind, ['start', w.container]);
      const headCommit = await this.head(w.root);
      return { sandboxId: req.sandboxId, provider: this.kind, root: w.root, branch: req.branch, baseCommit, headCommit, reused: true };
    }
    // A half-made sandbox (or one whose container is gone): start it again. The branch stays.
    await this.removeAll(w, { container: state !== undefined });
    if (record?.pooledAs) await releaseClaimedEntry(path.join(repo, CONTAINERS_DIR), record.pooledAs);
    if (!(await branchExists(repo, req.branch))) await git(repo, ['update-ref', `refs/heads/${req.branch}`, baseCommit, '']);
    const startCommit = await resolveCommit(repo, `refs/heads/${req.branch}`);
    const setupWanted = req.setup && (req.setup.commands.length > 0 || req.setup.verify.length > 0) ? req.setup : undefined;
    // The prepared template, when it was made for this sandbox image, setup and base's lockfiles.
    const template = setupWanted ? await usableContainerTemplate(repo, this.kind, { baseCommit: startCommit, baseImage: sandboxImage, setup: setupWanted }) : undefined;
    const image = template?.image ?? sandboxImage;
    const base: ContainerRecord = {
      version: 1,
      engine: this.kind,
      sandboxId: req.sandboxId,
      group: req.group,
      name: req.name,
      branch: req.branch,
      baseCommit,
      startCommit,
      container: w.container,
      state: 'creating',
      createdAt: new Date().toISOString(),
    };
    await writeJsonAtomic(w.recordFile, base, { mkdir: true });
    const labels = { 'slipway.sandbox': req.sandboxId, 'slipway.group': req.group, 'slipway.branch': req.branch, 'slipway.root': w.root, 'slipway.repository': repo };
    const pool = req.warmPool && req.warmPool > 0 ? { kind: this.kind, image, settings } : undefined;
    const claimed = pool ? await claimContainerPoolEntry(path.join(repo, CONTAINERS_DIR), containerPoolKey(pool), w) : undefined;
    if (claimed) await writeJsonAtomic(w.recordFile, { ...base, pooledAs: claimed.id });
    else {
      await fs.mkdir(w.root, { recursive: true });
      await fs.mkdir(w.inDir, { recursive: true });
      await engine(this.kind, sandboxRunArgs(this.kind, { name: w.container, labels, settings, root: w.root, inDir: w.inDir, image }));
    }
    // A container just made (or never used, from the pool) has no dead worker's commands to sweep.
    this.swept.add(w.container);
    const { name, email } = await commitIdentity(repo);
    // A pooled workspace prepared at a recent base only fetches what changed since (ADR 0030).
    const prepared = claimed?.base !== undefined && !template && (await this.startPrepared(repo, w, claimed.base, req, { name, email }));
    if (!prepared) {
      await makeBaseBundle(repo, req.branch, path.join(w.inDir, 'base.bundle'));
      if (template) {
        const fill = await this.exec({ root: w.root }, { command: '/bin/sh', args: ['-c', FILL_FROM_TEMPLATE_SCRIPT, 'fill'], timeoutMs: 10 * 60_000, signal: req.signal });
        if (fill.exitCode !== 0) throw new Error(`copying the template's files into the sandbox failed (exit ${fill.exitCode}): ${fill.stderr.trim()}`);
      }
      const start = await this.exec({ root: w.root }, { command: '/bin/sh', args: ['-c', START_FROM_BUNDLE_SCRIPT, 'start', `${CONTAINER_IN}/base.bundle`, req.branch, name, email], timeoutMs: 10 * 60_000, signal: req.signal });
      if (start.exitCode !== 0) throw new Error(`starting the sandbox from its bundle failed (exit ${start.exitCode}): ${start.stderr.trim()}`);
    }
    let setup: SandboxHandle['setup'];
    if (setupWanted) {
      // From the template, setup's output is there already: verify first, setup only if that fails.
      setup = await runProjectSetup((r) => this.exec({ root: w.root }, r), setupWanted, { signal: req.signal, onProgress: req.onProgress, skipFirstCommands: template !== undefined });
    }
    const headCommit = await this.head(w.root);
    await writeJsonAtomic(w.recordFile, { ...base, state: 'ready', ...(claimed ? { pooledAs: claimed.id } : {}) }, { mkdir: true });
    // Entries are prepared at this sandbox's start, unless a template's files go in first.
    if (pool) this.scheduleFill(repo, pool, req.warmPool!, template ? undefined : startCommit);
    return { sandboxId: req.sandboxId, provider: this.kind, root: w.root, branch: req.branch, baseCommit, headCommit, reused: false, origin: claimed ? 'pool' : template ? 'template' : 'cold', ...(setup ? { setup } : {}), durationMs: Date.now() - started };
  }

  /**
   * Brings a claimed workspace prepared at `preparedAt` to the state a cold start makes: an
   * incremental bundle of what the repository gained since (none when nothing), every branch and
   * tag set as the repository has them, the sandbox's branch checked out. False when that could
   * not be done; the workspace is emptied for a cold start.
   */
  private async startPrepared(repo: string, w: { root: string; inDir: string }, preparedAt: string, req: SandboxCreateRequest, who: { name: string; email: string }): Promise<boolean> {
    const refs = await git(repo, ['for-each-ref', '--format=%(refname) %(objectname)', 'refs/heads', 'refs/tags']);
    await fs.writeFile(path.join(w.inDir, 'refs.txt'), `${refs}\n`);
    // git refuses an empty bundle: nothing new since the preparation.
    const update = await git(repo, ['bundle', 'create', '-q', path.join(w.inDir, 'update.bundle'), '--branches', '--tags', `^${preparedAt}`]).then(
      () => `${CONTAINER_IN}/update.bundle`,
      () => '-',
    );
    const r = await this.exec({ root: w.root }, { command: '/bin/sh', args: ['-c', START_PREPARED_SCRIPT, 'claim', update, `${CONTAINER_IN}/refs.txt`, req.branch, who.name, who.email], timeoutMs: 10 * 60_000, signal: req.signal });
    if (r.exitCode === 0) return true;
    if (r.exitCode !== 3) throw new Error(`starting the sandbox in its prepared workspace failed (exit ${r.exitCode}): ${r.stderr.trim()}`);
    const wipe = await this.exec({ root: w.root }, { command: '/bin/sh', args: ['-c', 'rm -rf .git ./* ./.[!.]* ./..?* 2>/dev/null; [ -z "$(ls -A)" ]'] });
    if (wipe.exitCode !== 0) throw new Error(`emptying the prepared workspace failed: ${wipe.stderr.trim()}`);
    return false;
  }

  /** HEAD inside the sandbox (untrusted: only ever compared or collected through a bundle). */
  private async head(root: string): Promise<string> {
    const r = await this.exec({ root }, { command: 'git', args: ['rev-parse', '--verify', '--quiet', 'HEAD^{commit}'], timeoutMs: 60_000 });
    const head = r.stdout.trim();
    if (r.exitCode !== 0 || !OBJECT_ID.test(head)) throw new Error(`the sandbox at ${root} has no commit at HEAD`);
    return head;
  }

  /**
   * The engine's argv and environment for one command in the container: exec and sessions
   * alike. `preserveFds` is the engine's; the command gets its own session and process group
   * inside (setsid), with an id in the wrapping shell's argv, which is how a kill finds it.
   * `head` goes first on the command's stdin (`-i` always): its environment (env-header.ts).
   */
  private async prepare(handle: Pick<SandboxHandle, 'root'>, req: Pick<ExecRequest, 'cwd' | 'env'>, inner: string[], opts: { preserveFds?: number } = {}) {
    const w = await this.where(handle.root);
    const real = await fs.realpath(w.root);
    const cwd = req.cwd ? await resolveInside(real, req.cwd) : real;
    const workdir = path.posix.join(CONTAINER_WORKSPACE, path.relative(real, cwd).split(path.sep).join('/'));
    // The worker's environment never enters a container; values travel as the first line of
    // stdin (env-header.ts), never in argv nor in the engine's own environment (ADR 0027).
    const env: Record<string, string> = { ...SANDBOX_BASE_ENV, HOME: '/root', ...req.env };
    // A worker that died (kill -9) left its commands running in the container: the first exec
    // of this process in it ends them, so a retried agent never races the one it replaces.
    if (!this.swept.has(w.container)) {
      this.swept.add(w.container);
      await this.killOrphans(w.container);
    }
    const id = newExecId();
    const args = ['exec', '-i', ...(opts.preserveFds ? ['--preserve-fds', String(opts.preserveFds)] : []), '--workdir', workdir, w.container, ...envHeaderArgv(id, inner)];
    return { container: w.container, cwd: engineCwd(), env: engineEnv(), head: envHeader(env), id, args };
  }

  async exec(handle: Pick<SandboxHandle, 'root'>, req: ExecRequest): Promise<RunResult> {
    const inner = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
    const { container, cwd, env, head, id, args } = await this.prepare(handle, req, inner);
    const w = { container };
    const result = await runProcess({
      command: this.kind,
      args,
      cwd,
      env,
      stdin: `${head.toString()}${req.stdin ?? ''}`,
      timeoutMs: req.timeoutMs,
      signal: req.signal,
      onLine: req.onLine,
      maxCaptureBytes: req.maxCaptureBytes,
    });
    if (result.timedOut || result.cancelled) {
      // Killing the engine client leaves the command running in the container: end it there.
      if (req.killGraceMs) {
        await this.killExec(w.container, id, 'TERM');
        await new Promise((r) => setTimeout(r, req.killGraceMs));
      }
      await this.killExec(w.container, id, 'KILL');
    }
    return result;
  }

  /** Kills what the execs of worker processes that no longer exist (on this host) left running. */
  private async killOrphans(container: string): Promise<void> {
    const scan = await engine(this.kind, ['exec', container, '/bin/sh', '-c', 'for d in /proc/[0-9]*; do tr "\\000" " " < "$d/cmdline" 2>/dev/null; echo; done'], { allowFail: true });
    const ids = new Set([...scan.stdout.matchAll(/slipway-exec-(\d+)-[0-9a-f]{16}/g)].filter((m) => !hostProcessAlive(Number(m[1]))).map((m) => m[0]));
    for (const id of ids) await this.killExec(container, id, 'KILL');
  }

  private killExec(container: string, id: string, signal: string): Promise<void> {
    return killExecInContainer(this.kind, container, id, signal);
  }

  /**
   * An interactive process in the container (ADR 0014): `exec -i`, never `-t`, so no host
   * terminal enters the container; under a PTY, script(1) makes the terminal inside, as for a
   * local sandbox (session.ts CONTROLLER), and resize requests travel on a pipe that podman
   * passes in as fd 3 (`--preserve-fds`) and the wrapper moves to fd 9. Killing the engine
   * client would leave the command running inside: signals and kills go to it there, by id.
   */
  async openSession(handle: Pick<SandboxHandle, 'root'>, req: SessionRequest): Promise<SandboxSession> {
    if (!req.command) throw new SessionRequestError('command must not be empty');
    const pty = req.pty ? checkSize(req.pty.cols, req.pty.rows) : undefined;
    // docker exec cannot pass a descriptor in: no resize channel, so no terminal there yet.
    if (pty && this.kind !== 'podman') throw new SessionRequestError(`sessions with a pty are not available in ${this.kind} sandboxes yet (podman only)`);
    const command = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
    const inner = pty ? ['/bin/sh', '-c', `exec ${CONTROL_FD}<&3 3<&-\n${CONTROLLER}`, 'slipway-session', terminalCommandLine(command, pty)] : command;
    const env = pty ? { TERM: 'xterm-256color', ...req.env } : req.env;
    const p = await this.prepare(handle, { cwd: req.cwd, env }, inner, pty ? { preserveFds: 1 } : {});
    const child = spawn(this.kind, p.args, { cwd: p.cwd, env: p.env, detached: true, stdio: ['pipe', 'pipe', 'pipe', ...(pty ? ['pipe' as const] : [])] });
    child.stdin!.on('error', () => undefined).write(p.head);
    const exit = new Promise<SessionExit>((resolve) => {
      child.once('exit', (exitCode, signal) => resolve({ exitCode, signal }));
      child.once('error', () => resolve({ exitCode: null, signal: null }));
    });
    const control = pty ? ((child.stdio as unknown as Array<Writable | null>)[3] ?? undefined) : undefined;
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
    const half = Math.floor(p.id.length / 2);
    const signalInside = (sig: string) =>
      engine(this.kind, ['exec', p.container, '/bin/sh', '-c', SIGNAL_EXEC_SCRIPT, 'signal', p.id.slice(0, half), p.id.slice(half), sig], { allowFail: true });
    return sessionOver(child, {
      pty: pty !== undefined,
      control,
      exit,
      signalOther: (sig) => {
        if (!/^SIG[A-Z0-9]+$/.test(sig)) throw new SessionRequestError(`signal must be a signal name such as SIGTERM, got ${JSON.stringify(sig)}`);
        void signalInside(sig.slice(3));
      },
      // Inside first (the client's death would not end it), then the client.
      killAll: () => void this.killExec(p.container, p.id, 'KILL').finally(() => killProcessGroup(child.pid)),
    });
  }

  /**
   * A connection to 127.0.0.1:port of the container (preview ports, ADR 0015): a relay inside
   * the container's own network namespace, bridged over `exec -i` stdio, so the host's loopback
   * is never what answers.
   */
  async connectPort(handle: Pick<SandboxHandle, 'root'>, port: number): Promise<Duplex> {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new PortUnreachableError(port, 'port must be an integer from 1 to 65535');
    const p = await this.prepare(handle, {}, ['node', '-e', PORT_RELAY_SCRIPT, String(port)]);
    const child = spawn(this.kind, p.args, { cwd: p.cwd, env: p.env, detached: true, stdio: ['pipe', 'pipe', 'ignore'] });
    child.stdin!.on('error', () => undefined).write(p.head);
    const stdout = child.stdout as Readable;
    const stdin = child.stdin as Writable;
    stdin.on('error', () => undefined);
    const end = () => void this.killExec(p.container, p.id, 'KILL').finally(() => killProcessGroup(child.pid));
    const connected = await new Promise<boolean>((resolve) => {
      const onData = (d: Buffer) => {
        stdout.off('data', onData);
        stdout.pause();
        if (d[0] !== 0x2b) return resolve(false);
        if (d.length > 1) stdout.unshift(d.subarray(1));
        resolve(true);
      };
      stdout.on('data', onData);
      child.once('exit', () => resolve(false));
      child.once('error', () => resolve(false));
    });
    if (!connected) {
      end();
      throw new PortUnreachableError(port, `no listener on 127.0.0.1:${port} inside the ${this.kind} container`);
    }
    const stream = Duplex.from({ readable: stdout, writable: stdin });
    stream.once('close', end);
    return stream;
  }

  async readFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<Buffer> {
    return readSandboxFile(handle.root, file, opts);
  }

  async openFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<OpenedFile> {
    return openSandboxFile(handle.root, file, opts);
  }

  async listFiles(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<FileEntry[]> {
    return listSandboxDir(handle.root, file, opts);
  }

  async writeFile(handle: Pick<SandboxHandle, 'root'>, file: string, content: Buffer | string, opts: FileIoOptions = {}): Promise<void> {
    return writeSandboxFile(handle.root, file, content, opts);
  }

  async deleteFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<void> {
    return deleteSandboxFile(handle.root, file, opts);
  }

  private async removeAll(w: { root: string; inDir: string; container: string }, opts: { container: boolean } = { container: true }): Promise<void> {
    if (opts.container) await engine(this.kind, ['rm', '-f', '-t', '0', w.container], { allowFail: true });
    await fs.rm(w.root, { recursive: true, force: true });
    await fs.rm(w.inDir, { recursive: true, force: true });
  }

  async destroy({ root }: { repository: string; root: string }): Promise<void> {
    const w = await this.where(root);
    const record = await readRecord(w.recordFile);
    await this.removeAll(w);
    if (record?.pooledAs) await releaseClaimedEntry(path.join(w.repository, CONTAINERS_DIR), record.pooledAs);
    await fs.rm(w.recordFile, { force: true });
    await fs.rm(`${w.root}.rebuild.json`, { force: true });
    await fs.rmdir(path.dirname(w.root)).catch(() => undefined);
  }

  /**
   * The sandbox's HEAD comes back as a bundle (git-transport.ts) and becomes the tip of its
   * branch; a head the repository has already only moves the branch, if it descends from the
   * sandbox's start.
   */
  async collect(handle: Pick<SandboxHandle, 'root'>, options: { known?: string[]; signal?: AbortSignal } = {}): Promise<{ head: string; imported: boolean }> {
    const w = await this.where(handle.root);
    const record = await readRecord(w.recordFile);
    if (!record) throw new Error(`no record of the sandbox at ${w.root}`);
    const head = await this.head(w.root);
    const prior = await collectKnownHead(w.repository, record, head, options.known);
    if (prior.collected) return { head, imported: false };
    const { known } = prior;
    const producer = {
      command: this.kind,
      args: ['exec', w.container, '/bin/sh', '-c', BUNDLE_HEAD_SCRIPT, 'collect', ...known],
      env: engineEnv(),
      cwd: engineCwd(),
    };
    const imported = await importBundle(w.repository, producer, { branch: record.branch, baseCommit: record.startCommit, maxBytes: this.maxBundleBytes, signal: options.signal });
    return { head: imported.head, imported: true };
  }

  /**
   * A fresh bundle of the repository's branches and tags, fetched inside under
   * `refs/slipway/upstream/` (the sandbox's own branch is never touched), so `commits` (the new
   * integration tip of a rebuild) can be checked out there.
   */
  async bringCommits(handle: Pick<SandboxHandle, 'root'>, commits: string[]): Promise<void> {
    const w = await this.where(handle.root);
    const file = path.join(w.inDir, 'update.bundle');
    await fs.rm(file, { force: true });
    await git(w.repository, ['bundle', 'create', '-q', file, '--branches', '--tags']);
    const fetch = await this.exec({ root: w.root }, { command: 'git', args: ['fetch', '-q', '--no-tags', `${CONTAINER_IN}/update.bundle`, '+refs/heads/*:refs/slipway/upstream/heads/*', '+refs/tags/*:refs/slipway/upstream/tags/*'], timeoutMs: 10 * 60_000 });
    if (fetch.exitCode !== 0) throw new Error(`fetching the repository's branches into the sandbox failed (exit ${fetch.exitCode}): ${fetch.stderr.trim()}`);
    for (const c of commits) {
      const has = await this.exec({ root: w.root }, { command: 'git', args: ['cat-file', '-e', `${c}^{commit}`], timeoutMs: 60_000 });
      if (has.exitCode !== 0) throw new Error(`commit ${c} is on no branch or tag of ${w.repository}: it cannot be brought into the sandbox`);
    }
  }

  async list(repository: string) {
    const repo = await fs.realpath(repository);
    // Ids, then each one's labels: the same two calls on podman and docker (their `ps` JSON differs).
    const ids = (await engine(this.kind, ['ps', '-a', '-q', '--filter', `label=slipway.repository=${repo}`])).stdout.split('\n').filter(Boolean);
    const out: Array<{ root: string; branch?: string; head: string; sandboxId?: string }> = [];
    for (const id of ids) {
      const inspected = await engine(this.kind, ['inspect', '--type', 'container', '--format', '{{json .Config.Labels}}', id], { allowFail: true });
      if (inspected.code !== 0) continue; // removed meanwhile
      const labels = (JSON.parse(inspected.stdout.trim() || '{}') ?? {}) as Record<string, string>;
      let root = labels['slipway.root'];
      if (!root) continue;
      // A container from the warm pool is labelled with its entry's path, whose .json links to the record.
      const found = await readRecord(`${root}.json`);
      if (!found || found.state === 'creating') continue;
      const record = found;
      if (record.pooledAs) root = containerSandboxRoot(repo, record.group, record.name);
      const head = record.state === 'suspended' && record.suspendedHead ? record.suspendedHead : await this.head(root).catch(() => record.startCommit);
      out.push({ root, branch: record.branch, head, sandboxId: record.sandboxId });
    }
    return out;
  }

  /** Stops the container; its workspace stays on disk, so restore is a start. */
  async suspend(handle: Pick<SandboxHandle, 'root'>, _options?: { templateIgnored: boolean }): Promise<{ snapshotRef: string; bytes: number }> {
    const w = await this.where(handle.root);
    const record = await readRecord(w.recordFile);
    if (!record) throw new Error(`no record of the sandbox at ${w.root}`);
    const suspendedHead = record.state === 'suspended' ? record.suspendedHead : await this.head(w.root).catch(() => undefined);
    await engine(this.kind, ['stop', '-t', '5', w.container]);
    await writeJsonAtomic(w.recordFile, { ...record, state: 'suspended', ...(suspendedHead ? { suspendedHead } : {}) });
    return { snapshotRef: `${this.kind}:${w.container}`, bytes: await directoryBytes(w.root) };
  }

  async restore(handle: Pick<SandboxHandle, 'root'>, _options?: { templateIgnored: boolean }): Promise<{ root: string; branch?: string; head: string }> {
    const w = await this.where(handle.root);
    const record = await readRecord(w.recordFile);
    if (!record) throw new Error(`no record of the sandbox at ${w.root}`);
    const state = await this.inspect(w.container);
    if (!state) throw new Error(`the container of the sandbox at ${w.root} is gone`);
    if (state.Status !== 'running') await engine(this.kind, ['start', w.container]);
    const head = await this.head(w.root);
    await writeJsonAtomic(w.recordFile, { ...record, state: 'ready', suspendedHead: undefined });
    return { root: w.root, branch: record.branch, head };
  }

  /** Nothing to drop: a suspended container sandbox is its stopped container and workspace, which destroy removes. */
  async deleteSnapshot(): Promise<void> {}

  async probe(handle: Pick<SandboxHandle, 'root'>): Promise<SandboxLiveness> {
    const w = await this.where(handle.root);
    const state = await this.inspect(w.container);
    if (!state) return { alive: false, reason: 'container_removed', detail: `container ${w.container} no longer exists` };
    if (state.Status !== 'running') {
      // Suspend stops the container on purpose, whatever happened in it before.
      const record = await readRecord(w.recordFile);
      if (record?.state === 'suspended') return { alive: true };
      if (state.OOMKilled) return { alive: false, reason: 'oom_killed', detail: `container ${w.container} was killed by the kernel's OOM killer (${this.kind} says so)` };
      // SIGKILL is how the OOM killer ends a process; the kernel log says whether it was it.
      const kill = state.ExitCode === 137 ? await kernelOomKill(state.Id) : undefined;
      if (kill) return { alive: false, reason: 'oom_killed', detail: `container ${w.container} was killed by the kernel's OOM killer: ${kill}` };
      return { alive: false, reason: 'container_exited', detail: `container ${w.container} is ${state.Status} (exit ${state.ExitCode})` };
    }
    if (!(await fs.stat(w.root).then((s) => s.isDirectory(), () => false))) return { alive: false, reason: 'directory_removed', detail: `${w.root} no longer exists` };
    return { alive: true };
  }
}

function hostProcessAlive(pid: number): boolean {
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function directoryBytes(dir: string): Promise<number> {
  let total = 0;
  const walk = async (d: string): Promise<void> => {
    for (const e of await fs.readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else total += (await fs.lstat(p).catch(() => ({ size: 0 }))).size;
    }
  };
  await walk(dir);
  return total;
}

/** Can podman run sandboxes here? For `slipway doctor`. */
export async function checkPodman(): Promise<{ ok: boolean; detail: string; install?: string }> {
  const version = await engine('podman', ['version', '--format', '{{.Client.Version}}']).catch((e: Error) => e);
  if (version instanceof Error) return { ok: false, detail: `podman is not usable: ${version.message}`, install: PODMAN_INSTALL };
  const image = defaultSandboxImage();
  if (!image) return { ok: false, detail: `podman ${version.stdout.trim()}, but no sandbox image was built`, install: 'bash scripts/setup.sh' };
  const exists = await engine('podman', ['image', 'exists', image], { allowFail: true });
  if (exists.code !== 0) return { ok: false, detail: `podman ${version.stdout.trim()}, but the sandbox image ${image} is missing`, install: 'bash scripts/setup.sh' };
  const run = await engine('podman', ['run', '--rm', '--network', 'none', '--cap-drop=all', image, 'git', '--version'], { allowFail: true });
  if (run.code !== 0) return { ok: false, detail: `podman cannot run a container: ${run.stderr.trim().split('\n').pop()}`, install: 'bash scripts/setup.sh (writes .tools/containers/containers.conf: runc, cgroupfs)' };
  return { ok: true, detail: `podman ${version.stdout.trim()}, image ${image}, ${run.stdout.trim()}` };
}
