/**
 * The prepared template of container sandboxes (ADR 0025): an image made from the sandbox image
 * with the project's setup already run, so a new container sandbox starts from it and only
 * verifies. The local template (template.ts) is a worktree; a container cannot start from a
 * host folder without copying it through the bind mount, so here the template is an image.
 *
 *   <repo>/.slipway/container-templates/<engine>.json       its manifest (replaced atomically)
 *   <repo>/.slipway/container-templates/build-<id>/         a build's bundle, while it runs
 *   localhost/slipway-template-<repo hash>:<fingerprint>    the image
 *
 * Built in a container of the sandbox image with no workspace mount: the base commit is checked
 * out into the container's own /workspace from a bundle, setup runs there, the tracked files and
 * .git are removed (what is left is what setup made: node_modules, build caches), the rest moves
 * to TEMPLATE_FILES and the container is committed. A sandbox made from it copies TEMPLATE_FILES
 * into its bind-mounted workspace before its own checkout, then runs only the verify commands
 * (setup runs if they fail, as for the local template).
 *
 * The tag is the fingerprint (lockfiles at the base, setup commands) with the sandbox image the
 * template was made from: stale when either changes, as `check` reports.
 */
import { createHash, randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { SLIPWAY_DIR } from '../../core/ids';
import { readJson, writeJsonAtomic } from '../../lib/atomic-write';
import { ensureSlipwayExcluded, git, resolveCommit } from '../../lib/git';
import { runProcess, type RunResult } from '../process';
import { CONTAINER_IN, CONTAINER_WORKSPACE, defaultSandboxImage, engine, engineCwd, engineEnv, runArgs, type ContainerEngine } from './container-engine';
import { describeChanges, fingerprint, setupHash, trackedLockfiles, type FingerprintParts } from './fingerprint';
import { SANDBOX_BASE_ENV, type ExecRequest, type ProjectSetup } from './provider';
import { runProjectSetup, type SetupResult } from './setup';
import { envHeader, envHeaderArgv } from './env-header';

/**
 * Where the template image keeps what setup made: a sandbox's /workspace is its bind mount, which
 * would hide it there, and with every capability dropped only /tmp is writable outside it.
 */
export const TEMPLATE_FILES = '/tmp/slipway-template';

export interface ContainerTemplateManifest {
  version: 1;
  engine: ContainerEngine;
  image: string;
  /** The sandbox image it was made from. */
  baseImage: string;
  baseRef: string;
  baseCommit: string;
  setup?: ProjectSetup;
  fingerprint: { hash: string; parts: FingerprintParts };
  setupResult?: SetupResult;
  createdAt: string;
  durationMs: number;
}

export interface ContainerTemplateCheck {
  state: 'missing' | 'fresh' | 'stale';
  reasons: string[];
  manifest?: ContainerTemplateManifest;
}

export const CONTAINER_TEMPLATES_DIR = `${SLIPWAY_DIR}/container-templates`;
const manifestFile = (repo: string, kind: ContainerEngine) => path.join(repo, CONTAINER_TEMPLATES_DIR, `${kind}.json`);
const sha = (s: string) => createHash('sha256').update(s).digest('hex');

/** The image name of a template: the repository's and the fingerprint's (with the sandbox image's). */
export function containerTemplateImage(repo: string, fingerprintHash: string, baseImage: string): string {
  return `localhost/slipway-template-${sha(repo).slice(0, 12)}:${sha(`${fingerprintHash}\n${baseImage}`).slice(0, 16)}`;
}

function sandboxImage(image?: string): string {
  const found = image ?? defaultSandboxImage();
  if (!found) throw new Error('no sandbox image: run scripts/setup.sh (it builds one) or set SLIPWAY_SANDBOX_IMAGE');
  return found;
}

export async function readContainerTemplate(repository: string, kind: ContainerEngine): Promise<ContainerTemplateManifest | undefined> {
  return readJson<ContainerTemplateManifest>(manifestFile(repository, kind));
}

async function imageExists(kind: ContainerEngine, image: string): Promise<boolean> {
  return (await engine(kind, ['image', 'inspect', image], { allowFail: true })).code === 0;
}

/**
 * The template a container sandbox at `baseCommit` may start from: made by this engine from this
 * sandbox image, with the same setup commands and the same lockfiles at the base, and its image
 * still there.
 */
export async function usableContainerTemplate(
  repo: string,
  kind: ContainerEngine,
  opts: { baseCommit: string; baseImage: string; setup?: ProjectSetup },
): Promise<ContainerTemplateManifest | undefined> {
  const manifest = await readContainerTemplate(repo, kind);
  if (!manifest || manifest.baseImage !== opts.baseImage) return undefined;
  if (manifest.fingerprint.parts.setup !== setupHash(opts.setup)) return undefined;
  const tracked = await trackedLockfiles(repo, opts.baseCommit);
  if (JSON.stringify(tracked) !== JSON.stringify(manifest.fingerprint.parts.tracked)) return undefined;
  return (await imageExists(kind, manifest.image)) ? manifest : undefined;
}

/** Is the template stale? Lockfiles at its base ref now, the setup commands (when given), the sandbox image, the image itself. */
export async function checkContainerTemplate(
  repository: string,
  kind: ContainerEngine,
  opts: { base?: string; setup?: ProjectSetup; image?: string } = {},
): Promise<ContainerTemplateCheck> {
  const repo = await fs.realpath(repository);
  const manifest = await readContainerTemplate(repo, kind);
  if (!manifest) return { state: 'missing', reasons: [`no ${kind} template: run \`slipway template create --provider ${kind}\``] };
  const reasons: string[] = [];
  if (!(await imageExists(kind, manifest.image))) reasons.push(`the template image ${manifest.image} is gone`);
  const baseImage = sandboxImage(opts.image);
  if (baseImage !== manifest.baseImage) reasons.push(`the sandbox image changed (${manifest.baseImage} -> ${baseImage})`);
  const baseRef = opts.base ?? manifest.baseRef;
  const baseCommit = await resolveCommit(repo, baseRef).catch(() => undefined);
  if (!baseCommit) return { state: 'stale', reasons: [...reasons, `base "${baseRef}" no longer resolves to a commit`], manifest };
  const now = await fingerprint(repo, baseCommit, { setup: opts.setup ?? manifest.setup, copyIgnored: false, source: repo });
  reasons.push(...describeChanges(manifest.fingerprint.parts, now.parts));
  return { state: reasons.length === 0 ? 'fresh' : 'stale', reasons, manifest };
}

/** Checks the base commit out into the container's own /workspace from the bundle: `sh -c SCRIPT checkout <bundle> <ref>`. */
const CHECKOUT_SCRIPT = ['set -eu', `mkdir -p ${CONTAINER_WORKSPACE}`, `cd ${CONTAINER_WORKSPACE}`, 'git init -q', 'git fetch -q --no-tags "$1" "$2"', 'git checkout -q --detach FETCH_HEAD'].join('\n');

/** Keeps what setup made: tracked files and .git go (a sandbox checks out its own), the rest moves out of the mount point's way. */
const KEEP_SETUP_OUTPUT_SCRIPT = [
  'set -eu',
  `cd ${CONTAINER_WORKSPACE}`,
  'git ls-files -z | xargs -0 rm -f --',
  'rm -rf .git',
  'find . -mindepth 1 -type d -empty -delete',
  `mkdir -p ${TEMPLATE_FILES}`,
  `cp -a ${CONTAINER_WORKSPACE}/. ${TEMPLATE_FILES}/`,
  `find ${CONTAINER_WORKSPACE} -mindepth 1 -delete`,
].join('\n');

/** Copies the template's files into a sandbox's workspace, inside its container: `sh -c SCRIPT fill`. */
export const FILL_FROM_TEMPLATE_SCRIPT = `[ -d ${TEMPLATE_FILES} ] && cp -a ${TEMPLATE_FILES}/. ${CONTAINER_WORKSPACE}/ || true`;

/** One command in a container that is not a sandbox (the template's build container), with the same environment rules as a sandbox's exec. */
function execInBuild(kind: ContainerEngine, container: string, req: ExecRequest): Promise<RunResult> {
  const env: Record<string, string> = { ...SANDBOX_BASE_ENV, HOME: '/root', ...req.env };
  const inner = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
  return runProcess({
    command: kind,
    args: ['exec', '-i', '--workdir', CONTAINER_WORKSPACE, container, ...envHeaderArgv('slipway-template-build', inner)],
    env: engineEnv(),
    stdin: `${envHeader(env).toString()}${req.stdin ?? ''}`,
    cwd: engineCwd(),
    timeoutMs: req.timeoutMs,
    signal: req.signal,
    onLine: req.onLine,
    maxCaptureBytes: req.maxCaptureBytes,
  });
}

export interface BuildContainerTemplateOptions {
  base: string;
  setup?: ProjectSetup;
  /** Setup commands get the network (a package registry); default true. */
  network?: boolean;
  image?: string;
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
}

/**
 * Builds the template image and makes it current (the manifest is replaced atomically), then
 * removes the previous image (an engine refuses while a container still runs from it: it stays).
 * The build container is removed whatever happens.
 */
export async function buildContainerTemplate(repository: string, kind: ContainerEngine, opts: BuildContainerTemplateOptions): Promise<ContainerTemplateManifest> {
  const started = Date.now();
  const repo = await fs.realpath(repository);
  await ensureSlipwayExcluded(repo);
  const baseImage = sandboxImage(opts.image);
  const baseCommit = await resolveCommit(repo, opts.base);
  const fp = await fingerprint(repo, baseCommit, { setup: opts.setup, copyIgnored: false, source: repo });
  const image = containerTemplateImage(repo, fp.hash, baseImage);
  const id = randomBytes(6).toString('hex');
  const work = path.join(repo, CONTAINER_TEMPLATES_DIR, `build-${id}`);
  const ref = `refs/slipway/template-${id}`;
  const container = `slipway-template-${id}`;
  const previous = await readContainerTemplate(repo, kind);
  try {
    await fs.mkdir(work, { recursive: true });
    await git(repo, ['update-ref', ref, baseCommit]);
    await git(repo, ['bundle', 'create', '-q', path.join(work, 'base.bundle'), ref]);
    await engine(kind, [
      'run', '-d', '--name', container, '--label', `slipway.template=${repo}`,
      ...runArgs({ network: opts.network ?? true }, kind),
      '-v', `${work}:${CONTAINER_IN}:ro`,
      baseImage, 'sleep', 'infinity',
    ]);
    const checkout = await execInBuild(kind, container, { command: '/bin/sh', args: ['-c', CHECKOUT_SCRIPT, 'checkout', `${CONTAINER_IN}/base.bundle`, ref], timeoutMs: 10 * 60_000, signal: opts.signal });
    if (checkout.exitCode !== 0) throw new Error(`checking out ${baseCommit} in the build container failed (exit ${checkout.exitCode}): ${checkout.stderr.trim()}`);
    let setupResult: SetupResult | undefined;
    if (opts.setup && (opts.setup.commands.length > 0 || opts.setup.verify.length > 0)) {
      opts.onProgress?.(`running project setup in ${container}`);
      setupResult = await runProjectSetup((r) => execInBuild(kind, container, r), opts.setup, { signal: opts.signal, onProgress: opts.onProgress });
    }
    const keep = await execInBuild(kind, container, { command: '/bin/sh', args: ['-c', KEEP_SETUP_OUTPUT_SCRIPT], timeoutMs: 10 * 60_000, signal: opts.signal });
    if (keep.exitCode !== 0) throw new Error(`keeping setup's output in the build container failed (exit ${keep.exitCode}): ${keep.stderr.trim()}`);
    await engine(kind, ['stop', '-t', '0', container]);
    opts.onProgress?.(`committing ${image}`);
    await engine(kind, ['commit', container, image], { timeoutMs: 30 * 60_000 });
    const manifest: ContainerTemplateManifest = {
      version: 1,
      engine: kind,
      image,
      baseImage,
      baseRef: opts.base,
      baseCommit,
      ...(opts.setup ? { setup: opts.setup } : {}),
      fingerprint: fp,
      ...(setupResult ? { setupResult } : {}),
      createdAt: new Date().toISOString(),
      durationMs: Date.now() - started,
    };
    await writeJsonAtomic(manifestFile(repo, kind), manifest);
    if (previous && previous.image !== image) await engine(kind, ['rmi', previous.image], { allowFail: true });
    return manifest;
  } finally {
    await engine(kind, ['rm', '-f', '-t', '0', container], { allowFail: true });
    await git(repo, ['update-ref', '-d', ref]).catch(() => undefined);
    await fs.rm(work, { recursive: true, force: true });
  }
}
