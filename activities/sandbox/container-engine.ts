/**
 * The container engine itself (podman, or docker through the same calls: ADR 0012, 0025): how
 * Slipway runs it, which image and settings a container gets. Shared by container sandboxes
 * (container.ts) and their prepared template (container-template.ts).
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { slipwayHome } from '../../lib/settings';
import type { SandboxLimits } from './limits';
import { SANDBOX_BASE_ENV } from './provider';

export type ContainerEngine = 'podman' | 'docker';

/** Where a container sees its workspace (the same path a bubblewrap sandbox sees). */
export const CONTAINER_WORKSPACE = '/workspace';
export const CONTAINER_IN = '/run/slipway/in';
const PROJECT_TOOLS = path.resolve(__dirname, '..', '..', '.tools', 'containers');
/** The containers.conf scripts/setup.sh writes (runc, cgroupfs, no default ulimits). */
export const PROJECT_CONTAINERS_CONF = path.join(PROJECT_TOOLS, 'containers.conf');
/** The name of the image scripts/setup.sh built last. */
export const PROJECT_IMAGE_FILE = path.join(PROJECT_TOOLS, 'image');
export const PODMAN_INSTALL = 'apt-get install -y podman runc && bash scripts/setup.sh';

/** How a container sandbox is made: the `sandbox:` section's network, limits and read-only paths. */
export interface ContainerSettings {
  network: boolean;
  limits?: SandboxLimits;
  /** Host paths bound read-only at the same path (script agents, prompt files). */
  readable?: string[];
}

/** The environment every engine call gets: the project's containers.conf unless one is set. */
export function engineEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH ?? SANDBOX_BASE_ENV.PATH, HOME: process.env.HOME ?? '/root' };
  for (const k of ['CONTAINERS_CONF', 'CONTAINERS_STORAGE_CONF', 'XDG_RUNTIME_DIR', 'DOCKER_HOST', 'TMPDIR']) if (process.env[k]) env[k] = process.env[k];
  if (!env.CONTAINERS_CONF && existsSync(PROJECT_CONTAINERS_CONF)) env.CONTAINERS_CONF = PROJECT_CONTAINERS_CONF;
  return { ...env, ...extra };
}

/**
 * The folder every engine process starts in. The engine's monitor (conmon) inherits it and, on
 * an OOM kill, drops `oom`/`oomKilled` marker files into its working folder: left to inherit the
 * worker's, they landed in whatever folder the worker was started from (a user's checkout).
 */
export function engineCwd(): string {
  const dir = path.join(slipwayHome(), 'engine');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return dir;
}

/** The sandbox image: SLIPWAY_SANDBOX_IMAGE, else the one scripts/setup.sh built (undefined: none). */
export function defaultSandboxImage(): string | undefined {
  if (process.env.SLIPWAY_SANDBOX_IMAGE) return process.env.SLIPWAY_SANDBOX_IMAGE;
  try {
    return readFileSync(PROJECT_IMAGE_FILE, 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}

/** Runs the engine with trusted arguments; rejects with its stderr on a non-zero exit. */
export function engine(bin: ContainerEngine, args: string[], opts: { env?: Record<string, string>; allowFail?: boolean; timeoutMs?: number } = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { cwd: engineCwd(), env: engineEnv(opts.env), stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000);
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-8000)));
    child.on('error', (e) => {
      clearTimeout(timer);
      reject((e as NodeJS.ErrnoException).code === 'ENOENT' ? new Error(`${bin} is not installed: ${PODMAN_INSTALL}`) : e);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      if (code !== 0 && !opts.allowFail) reject(new Error(`${bin} ${args[0]} failed (exit ${code}): ${stderr.trim()}`));
      else resolve({ code, stdout, stderr });
    });
  });
}

/** The engine arguments for a sandbox's resource limits and network. */
export function runArgs(settings: ContainerSettings, engineName: ContainerEngine): string[] {
  // --init: a real init (podman's catatonit) reaps orphans; `sleep` as pid 1 would not, and
  // zombies would count against the pids limit until the sandbox could start nothing.
  const args = ['--init', '--cap-drop=all', '--security-opt', 'no-new-privileges'];
  // A sandbox with the network gets the engine's user-mode network (no host ports, no host namespace).
  args.push('--network', settings.network ? (engineName === 'podman' ? 'slirp4netns' : 'bridge') : 'none');
  const l = settings.limits ?? {};
  if (l.pids !== undefined) args.push('--pids-limit', String(l.pids));
  if (l.memoryBytes !== undefined) args.push('--memory', `${l.memoryBytes}b`, '--memory-swap', `${l.memoryBytes}b`);
  if (l.cpus !== undefined) args.push('--cpus', String(l.cpus));
  if (l.fileSizeBytes !== undefined) args.push('--ulimit', `fsize=${l.fileSizeBytes}:${l.fileSizeBytes}`);
  if (l.cpuSeconds !== undefined) args.push('--ulimit', `cpu=${l.cpuSeconds}:${l.cpuSeconds}`);
  return args;
}

/** Refuses settings a container cannot honour, naming the field. */
export function validateContainerSettings(settings: ContainerSettings): void {
  if (settings.limits?.diskBytes !== undefined) throw new Error('sandbox.limits.disk is not supported by container sandboxes (use the local provider)');
  for (const p of settings.readable ?? []) if (!path.isAbsolute(p)) throw new Error(`sandbox.readable: ${JSON.stringify(p)} must be an absolute path`);
}


/**
 * `<engine> run -d` of a sandbox container: its workspace read-write at /workspace, its bundles
 * read-only at /run/slipway/in, readable host paths read-only, labels, limits and network; kept
 * alive by `sleep infinity`. A cold create and a warm-pool entry run exactly this.
 */
export function sandboxRunArgs(kind: ContainerEngine, c: { name: string; labels: Record<string, string>; settings: ContainerSettings; root: string; inDir: string; image: string }): string[] {
  const mounts = ['-v', `${c.root}:${CONTAINER_WORKSPACE}:rw`, '-v', `${c.inDir}:${CONTAINER_IN}:ro`];
  for (const p of c.settings.readable ?? []) mounts.push('-v', `${p}:${p}:ro`);
  return [
    'run', '-d', '--name', c.name,
    ...Object.entries(c.labels).flatMap(([k, v]) => ['--label', `${k}=${v}`]),
    ...runArgs(c.settings, kind),
    ...mounts,
    '--workdir', CONTAINER_WORKSPACE,
    c.image, 'sleep', 'infinity',
  ];
}
