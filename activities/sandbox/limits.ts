/**
 * Enforced resource limits for one sandbox command and everything it starts.
 *
 * `limitedCommand` turns a command line into a wrapped one that applies the limits *before* the
 * command starts, so there is no window in which the command (or a child it forks) runs
 * unlimited:
 *
 *   /bin/sh -c '<join each cgroup: echo $$ > …/cgroup.procs>; exec "$@"' slipway-limits \
 *     N <procs files…> [prlimit --fsize=… --as=… --cpu=… --] <command> <args…>
 *
 * The shell moves itself into the sandbox's cgroup(s), then execs (prlimit, then) the command:
 * same pid, so every descendant is born inside the cgroup, including what bubblewrap starts in
 * its own PID namespace and processes that `setsid` away from their process group.
 *
 * What this host offers is detected once per process:
 *  - cgroup v2: a writable unified hierarchy with pids, memory and cpu delegated to our own cgroup;
 *  - cgroup v1: the pids, memory and cpu hierarchies mounted separately and writable (as root);
 *  - otherwise `prlimit` alone: memory as address space (RLIMIT_AS), and CPU time (RLIMIT_CPU).
 * Slipway's cgroups live under the worker's own cgroup in each hierarchy: `<own>/slipway/<id>`.
 * File size is RLIMIT_FSIZE (prlimit) in every mode: cgroups do not limit file size.
 *
 * What cannot be enforced here is said, never dropped silently: see `notEnforced`. A process
 * count without cgroups is one of them (RLIMIT_NPROC counts every process of the uid, not the
 * sandbox's), and so is a CPU share (rlimits only know total CPU seconds).
 */
import type { SandboxLimits } from '../../core/sandbox-service';
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';

export type { SandboxLimits } from '../../core/sandbox-service';

export type LimitsEnforcer = 'cgroup-v1' | 'cgroup-v2' | 'prlimit' | 'none';

export interface LimitedCommand {
  command: string;
  args: string[];
  /** Kills whatever is left in the command's cgroup(s) and removes them. Idempotent; call after the command ended. */
  cleanup: () => Promise<void>;
  /** What holds the limits: cgroups (v1 or v2), prlimit alone, or nothing. */
  enforcedBy: LimitsEnforcer;
  /** Limits asked for that this host cannot enforce, each with the reason ("pids: …"). Empty when all hold. */
  notEnforced: string[];
  /** The cgroup directories made for this command (one per v1 hierarchy, or one v2 cgroup). */
  cgroups: string[];
  /**
   * For a caller that has a host step of its own in front (close-fds.ts): the `cgroup.procs`
   * files to join before exec, and the command line without the joining shell. `command`/`args`
   * are the same thing as one self-contained command line.
   */
  join: string[];
  direct: { command: string; args: string[] };
}

/** How a host may be used; `auto` detects. The other values force a weaker mode (tests, operators). */
export type LimitsMode = 'auto' | 'prlimit' | 'none';

export class InvalidLimitsError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'InvalidLimitsError';
  }
}

const CPU_PERIOD_US = 100_000;
/** The kernel's smallest CFS quota is 1 ms: 0.01 CPU at a 100 ms period. */
const MIN_CPUS = 0.01;
const SLIPWAY_DIR = 'slipway';
const ID_RE = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;

/** Throws InvalidLimitsError naming the field for anything but positive (integer where due) finite numbers. */
export function validateLimits(limits: SandboxLimits): void {
  if (limits === null || typeof limits !== 'object' || Array.isArray(limits)) {
    throw new InvalidLimitsError('sandbox limits must be an object');
  }
  const known = new Set(['pids', 'memoryBytes', 'cpus', 'fileSizeBytes', 'cpuSeconds', 'diskBytes']);
  for (const key of Object.keys(limits)) {
    if (!known.has(key)) throw new InvalidLimitsError(`sandbox limits: unknown field "${key}" (known: ${[...known].join(', ')})`);
  }
  const integer = (field: keyof SandboxLimits, min = 1) => {
    const v = limits[field];
    if (v === undefined) return;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) {
      throw new InvalidLimitsError(`sandbox limits: ${field} must be a positive integer${min > 1 ? ` of at least ${min}` : ''}, got ${JSON.stringify(v)}`);
    }
  };
  integer('pids');
  integer('memoryBytes');
  integer('fileSizeBytes');
  integer('cpuSeconds');
  integer('diskBytes', 16 * 1024 * 1024);
  const cpus = limits.cpus;
  if (cpus !== undefined && (typeof cpus !== 'number' || !Number.isFinite(cpus) || cpus < MIN_CPUS)) {
    throw new InvalidLimitsError(`sandbox limits: cpus must be a number of CPUs of at least ${MIN_CPUS} (e.g. 0.5), got ${JSON.stringify(cpus)}`);
  }
}

// ---------------------------------------------------------------------------------------------
// Host detection
// ---------------------------------------------------------------------------------------------

type Controller = 'pids' | 'memory' | 'cpu';
const CONTROLLERS: Controller[] = ['pids', 'memory', 'cpu'];

interface HostLimits {
  mode: 'cgroup-v2' | 'cgroup-v1' | 'none';
  /** v2: the folder holding Slipway's cgroups (`<own>/slipway`), with all three controllers on. */
  v2Parent?: string;
  /** v1: per controller, the folder holding Slipway's cgroups (`<mount>/<own>/slipway`). */
  v1Parents: Partial<Record<Controller, string>>;
  /** Why a cgroup mode (or a v1 controller) is unavailable, for notEnforced. */
  why: string[];
  prlimit?: string;
}

let detected: Promise<HostLimits> | undefined;

/** What this host offers, detected once per process. */
export function detectHostLimits(): Promise<HostLimits> {
  detected ??= detect();
  return detected;
}

interface MountInfo {
  root: string;
  mountPoint: string;
  fsType: string;
  superOptions: string[];
}

async function readMounts(): Promise<MountInfo[]> {
  const text = await fs.readFile('/proc/self/mountinfo', 'utf8').catch(() => '');
  const out: MountInfo[] = [];
  for (const line of text.split('\n')) {
    if (!line) continue;
    const [left, right] = line.split(' - ');
    if (!right) continue;
    const l = left.split(' ');
    const r = right.split(' ');
    out.push({ root: unescapeMount(l[3]), mountPoint: unescapeMount(l[4]), fsType: r[0], superOptions: (r[2] ?? '').split(',') });
  }
  return out;
}

function unescapeMount(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/** `/proc/self/cgroup`: controller list ('' for v2) → path. */
async function ownCgroups(): Promise<Map<string, string>> {
  const text = await fs.readFile('/proc/self/cgroup', 'utf8').catch(() => '');
  const out = new Map<string, string>();
  for (const line of text.split('\n')) {
    const m = /^(\d+):([^:]*):(.*)$/.exec(line);
    if (m) out.set(m[2], m[3]);
  }
  return out;
}

/** Where our own cgroup is in the file system, given the hierarchy's mount (which may show a sub-tree only). */
function hostPath(mount: MountInfo, own: string): string | undefined {
  const rel = path.posix.relative(mount.root, own);
  if (rel.startsWith('..') || path.posix.isAbsolute(rel)) return undefined;
  return path.join(mount.mountPoint, rel);
}

async function writable(dir: string): Promise<boolean> {
  return fs.access(dir, constants.W_OK).then(
    () => true,
    () => false,
  );
}

async function findPrlimit(): Promise<string | undefined> {
  const dirs = [...(process.env.PATH ?? '').split(':').filter(Boolean), '/usr/bin', '/bin', '/usr/sbin', '/sbin'];
  for (const d of dirs) {
    const candidate = path.join(d, 'prlimit');
    if (await fs.access(candidate, constants.X_OK).then(() => true, () => false)) return candidate;
  }
  return undefined;
}

async function detect(): Promise<HostLimits> {
  const why: string[] = [];
  const prlimit = await findPrlimit();
  const mounts = await readMounts();
  const own = await ownCgroups();

  // cgroup v2: our cgroup must have pids, memory and cpu available, and we must be able to turn
  // them on for a child (`<own>/slipway`) — impossible when our own cgroup holds processes and
  // is not the root (the "no internal processes" rule), in which case v1 or prlimit serves.
  const v2Mount = mounts.find((m) => m.fsType === 'cgroup2');
  const v2Own = own.get('');
  if (v2Mount && v2Own !== undefined) {
    const ownDir = hostPath(v2Mount, v2Own);
    const available = ownDir ? (await fs.readFile(path.join(ownDir, 'cgroup.controllers'), 'utf8').catch(() => '')).split(/\s+/) : [];
    const missing = CONTROLLERS.filter((c) => !available.includes(c));
    if (!ownDir) why.push('cgroup v2: our cgroup is outside the mounted hierarchy');
    else if (missing.length) why.push(`cgroup v2: controllers ${missing.join(', ')} not delegated to ${ownDir}`);
    else if (!(await writable(ownDir))) why.push(`cgroup v2: ${ownDir} is not writable`);
    else {
      const parent = path.join(ownDir, SLIPWAY_DIR);
      try {
        await enableV2(ownDir);
        await fs.mkdir(parent, { recursive: true });
        await enableV2(parent);
        return { mode: 'cgroup-v2', v2Parent: parent, v1Parents: {}, why, prlimit };
      } catch (e) {
        why.push(`cgroup v2: cannot delegate controllers below ${ownDir} (${(e as Error).message})`);
      }
    }
  }

  // cgroup v1: each controller its own hierarchy (possibly co-mounted, e.g. cpu,cpuacct).
  const v1Parents: Partial<Record<Controller, string>> = {};
  for (const controller of CONTROLLERS) {
    const mount = mounts.find((m) => m.fsType === 'cgroup' && m.superOptions.includes(controller));
    if (!mount) {
      why.push(`cgroup v1: no ${controller} hierarchy mounted`);
      continue;
    }
    const ownPath = [...own.entries()].find(([names]) => names.split(',').includes(controller))?.[1];
    const ownDir = ownPath === undefined ? undefined : hostPath(mount, ownPath);
    if (!ownDir) {
      why.push(`cgroup v1: our ${controller} cgroup is outside the mounted hierarchy`);
      continue;
    }
    const parent = path.join(ownDir, SLIPWAY_DIR);
    try {
      await fs.mkdir(parent, { recursive: true });
      if (!(await writable(parent))) throw new Error('not writable');
      v1Parents[controller] = parent;
    } catch (e) {
      why.push(`cgroup v1: cannot create ${parent} (${(e as Error).message})`);
    }
  }
  if (Object.keys(v1Parents).length > 0) return { mode: 'cgroup-v1', v1Parents, why, prlimit };
  return { mode: 'none', v1Parents: {}, why, prlimit };
}

async function enableV2(dir: string): Promise<void> {
  const on = (await fs.readFile(path.join(dir, 'cgroup.subtree_control'), 'utf8')).split(/\s+/);
  const needed = CONTROLLERS.filter((c) => !on.includes(c));
  if (needed.length) await fs.writeFile(path.join(dir, 'cgroup.subtree_control'), needed.map((c) => `+${c}`).join(' '));
}

// ---------------------------------------------------------------------------------------------
// The wrapped command
// ---------------------------------------------------------------------------------------------

/**
 * Joins every cgroup whose `cgroup.procs` is given (count first), then execs the rest. A cgroup
 * that cannot be joined stops the command (exit 125) rather than running it unlimited.
 */
const JOIN_SCRIPT =
  'n=$1; shift; ' +
  'while [ "$n" -gt 0 ]; do ' +
  'echo $$ > "$1" || { echo "slipway-limits: cannot join cgroup $1" >&2; exit 125; }; ' +
  'shift; n=$((n-1)); ' +
  'done; ' +
  'exec "$@"';

/**
 * The command line that runs `command args` under `limits`, and the cleanup that removes what
 * it set up. `id` names the cgroup (`<own>/slipway/<id>`); it must be unique among commands
 * running at the same time (an exec id, not a sandbox id) and a safe file name.
 * `limits` undefined: the command unchanged, nothing enforced.
 */
export async function limitedCommand(
  limits: SandboxLimits | undefined,
  id: string,
  command: string,
  args: string[],
  options: { mode?: LimitsMode } = {},
): Promise<LimitedCommand> {
  if (typeof id !== 'string' || !ID_RE.test(id)) {
    throw new InvalidLimitsError(`sandbox limits: id must be 1-128 characters of [A-Za-z0-9_.-], not starting with "." or "-", got ${JSON.stringify(id)}`);
  }
  if (typeof command !== 'string' || command === '') throw new InvalidLimitsError('sandbox limits: command must be a non-empty string');
  const nothing = async () => undefined;
  if (limits === undefined) return { command, args: [...args], cleanup: nothing, enforcedBy: 'none', notEnforced: [], cgroups: [], join: [], direct: { command, args: [...args] } };
  validateLimits(limits);

  const host = await detectHostLimits();
  const mode = options.mode ?? 'auto';
  const useCgroups = mode === 'auto' && host.mode !== 'none';
  const usePrlimit = mode !== 'none';
  const prlimit = usePrlimit ? host.prlimit : undefined;
  const notEnforced: string[] = [];
  const rlimits: string[] = [];
  const noPrlimit = usePrlimit ? 'prlimit (util-linux) is not installed' : 'limits mode "none"';
  const noCgroups = mode !== 'auto' ? `cgroups not used (limits mode "${mode}")` : `no usable cgroups (${host.why.join('; ')})`;

  // File size and CPU seconds: rlimits in every mode.
  if (limits.fileSizeBytes !== undefined) {
    if (prlimit) rlimits.push(`--fsize=${limits.fileSizeBytes}`);
    else notEnforced.push(`fileSizeBytes: ${noPrlimit}`);
  }
  if (limits.cpuSeconds !== undefined) {
    if (prlimit) rlimits.push(`--cpu=${limits.cpuSeconds}`);
    else notEnforced.push(`cpuSeconds: ${noPrlimit}`);
  }

  // pids, memory, cpus: cgroups; without them memory falls back to RLIMIT_AS.
  type Plan = { controller: Controller; files: [string, string][] };
  const plans: Plan[] = [];
  const v2Files: [string, string][] = [];
  const cgroupFor = (controller: Controller): boolean => {
    if (!useCgroups) return false;
    if (host.mode === 'cgroup-v2') return true;
    return host.v1Parents[controller] !== undefined;
  };
  if (limits.pids !== undefined) {
    if (cgroupFor('pids')) {
      if (host.mode === 'cgroup-v2') v2Files.push(['pids.max', String(limits.pids)]);
      else plans.push({ controller: 'pids', files: [['pids.max', String(limits.pids)]] });
    } else notEnforced.push(`pids: ${noCgroups}; RLIMIT_NPROC counts every process of the uid, not the sandbox's`);
  }
  if (limits.memoryBytes !== undefined) {
    if (cgroupFor('memory')) {
      if (host.mode === 'cgroup-v2') v2Files.push(['memory.max', String(limits.memoryBytes)], ['memory.swap.max', '0']);
      else {
        plans.push({
          controller: 'memory',
          files: [
            ['memory.limit_in_bytes', String(limits.memoryBytes)],
            ['memory.memsw.limit_in_bytes', String(limits.memoryBytes)],
          ],
        });
      }
    } else if (prlimit) {
      rlimits.push(`--as=${limits.memoryBytes}`);
      notEnforced.push(`memoryBytes: ${noCgroups}; enforced per process as address space (RLIMIT_AS), not for the whole tree`);
    } else notEnforced.push(`memoryBytes: ${noCgroups}; ${noPrlimit}`);
  }
  if (limits.cpus !== undefined) {
    const quota = String(Math.max(1000, Math.round(limits.cpus * CPU_PERIOD_US)));
    if (cgroupFor('cpu')) {
      if (host.mode === 'cgroup-v2') v2Files.push(['cpu.max', `${quota} ${CPU_PERIOD_US}`]);
      else plans.push({ controller: 'cpu', files: [['cpu.cfs_period_us', String(CPU_PERIOD_US)], ['cpu.cfs_quota_us', quota]] });
    } else notEnforced.push(`cpus: ${noCgroups}; rlimits cannot hold a CPU share (cpuSeconds limits total CPU time)`);
  }
  // With cgroups at all, the command's whole tree is also tracked in the pids hierarchy, so
  // cleanup finds (and kills) every leftover, even ones that left their process group.
  if (host.mode === 'cgroup-v1' && plans.length > 0 && cgroupFor('pids') && !plans.some((p) => p.controller === 'pids')) {
    plans.push({ controller: 'pids', files: [] });
  }

  const created: string[] = [];
  const cleanup = onceCleanup(() => removeCgroups(created, host.mode === 'cgroup-v2'));
  try {
    if (host.mode === 'cgroup-v2' && v2Files.length > 0) {
      const dir = path.join(host.v2Parent!, id);
      await makeCgroup(dir, id);
      created.push(dir);
      for (const [file, value] of v2Files) {
        await fs.writeFile(path.join(dir, file), value).catch((e: Error) => {
          if (file === 'memory.swap.max' && (e as NodeJS.ErrnoException).code === 'ENOENT') return; // no swap accounting: no swap to limit
          throw new Error(`cannot set ${file}=${value} in ${dir}: ${e.message}`);
        });
      }
    } else {
      for (const plan of plans) {
        const dir = path.join(host.v1Parents[plan.controller]!, id);
        await makeCgroup(dir, id);
        created.push(dir);
        for (const [file, value] of plan.files) {
          await fs.writeFile(path.join(dir, file), value).catch((e: Error) => {
            if (file === 'memory.memsw.limit_in_bytes') return; // swap accounting off: the memory limit alone holds
            throw new Error(`cannot set ${file}=${value} in ${dir}: ${e.message}`);
          });
        }
      }
    }
  } catch (e) {
    await cleanup().catch(() => undefined);
    throw e;
  }

  let inner = [command, ...args];
  if (rlimits.length > 0) inner = [prlimit!, ...rlimits, '--', ...inner];
  const enforcedBy: LimitsEnforcer = created.length > 0 ? (host.mode as 'cgroup-v1' | 'cgroup-v2') : rlimits.length > 0 ? 'prlimit' : 'none';
  const direct = { command: inner[0]!, args: inner.slice(1) };
  if (created.length === 0) return { ...direct, cleanup, enforcedBy, notEnforced, cgroups: [], join: [], direct };
  const procs = created.map((d) => path.join(d, 'cgroup.procs'));
  return {
    command: '/bin/sh',
    args: ['-c', JOIN_SCRIPT, 'slipway-limits', String(procs.length), ...procs, ...inner],
    cleanup,
    enforcedBy,
    notEnforced,
    cgroups: [...created],
    join: procs,
    direct,
  };
}

async function makeCgroup(dir: string, id: string): Promise<void> {
  try {
    await fs.mkdir(path.dirname(dir), { recursive: true });
    await fs.mkdir(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') {
      throw new Error(`sandbox limits: cgroup ${dir} already exists; the id "${id}" must be unique among running commands`);
    }
    throw new Error(`sandbox limits: cannot create cgroup ${dir}: ${(e as Error).message}`);
  }
}

function onceCleanup(fn: () => Promise<void>): () => Promise<void> {
  let running: Promise<void> | undefined;
  return () => {
    running ??= fn();
    return running;
  };
}

const CLEANUP_DEADLINE_MS = 10_000;

async function readPids(dir: string): Promise<number[]> {
  const text = await fs.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter(Boolean)
    .map(Number)
    .filter((n) => n > 0);
}

/**
 * Kills everything left in the cgroups (v2: cgroup.kill; v1 or old v2: SIGKILL each pid until
 * none is left, as new ones may fork meanwhile) and removes them. Throws if a cgroup cannot be
 * removed within the deadline (a process stuck in the kernel), naming it.
 */
async function removeCgroups(dirs: string[], v2: boolean): Promise<void> {
  const deadline = Date.now() + CLEANUP_DEADLINE_MS;
  const left: string[] = [];
  for (const dir of dirs) {
    if (v2) await fs.writeFile(path.join(dir, 'cgroup.kill'), '1').catch(() => undefined);
  }
  for (const dir of dirs) {
    let delay = 5;
    for (;;) {
      if (!(await fs.stat(dir).then(() => true, () => false))) break;
      for (const pid of await readPids(dir)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
      }
      const removed = await fs.rmdir(dir).then(
        () => true,
        (e: NodeJS.ErrnoException) => e.code === 'ENOENT',
      );
      if (removed) break;
      if (Date.now() > deadline) {
        left.push(`${dir} (pids: ${(await readPids(dir)).join(' ') || 'none'})`);
        break;
      }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 100);
    }
  }
  if (left.length) throw new Error(`sandbox limits: could not remove cgroup ${left.join(', ')}`);
}
