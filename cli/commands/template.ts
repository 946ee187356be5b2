/**
 * `slipway template create|check|update`: the prepared template new sandboxes and the warm pool
 * start from (activities/sandbox/template.ts). A local operation on the repository, like git
 * itself: no workflow involved.
 *
 *   create   build the template (no-op when a fresh one exists; refuses a stale one: use update)
 *   check    exit 0 when fresh, 1 when stale or missing, with the reasons, and what a cold
 *            create copies of the checkout's ignored files (how big, what is left out)
 *   update   rebuild when stale or missing (--force: always), with the recorded setup unless given
 *
 * `--provider podman|docker`: the same verbs for container sandboxes' template, an image
 * (container-template.ts, ADR 0025).
 *
 * Setup commands and confinement come from `--objective <file>` (its `sandbox:` section), or
 * `--setup`/`--verify` (repeatable), or, for check and update, what the template was built with.
 *
 * `--provider daytona`: the same three verbs for the repository's prepared Daytona snapshot
 * (activities/sandbox/daytona.ts `buildSnapshot`, ADR 0019), with DAYTONA_* from the environment.
 */
import type { Command } from 'commander';
import { confinementOf } from '../../activities/sandbox/options';
import type { ProjectSetup } from '../../activities/sandbox/provider';
import type { TemplateManifest } from '../../activities/sandbox/template';
import type { ContainerTemplateManifest } from '../../activities/sandbox/container-template';
import type { ContainerEngine } from '../../activities/sandbox/container-engine';
import type { BubblewrapConfinement } from '../../activities/sandbox/bubblewrap';
import { CliError, EXIT } from '../exit-codes';
import { GROUP_DESCRIPTIONS } from '../verbs';
import type { DaytonaSnapshotManifest } from '../../activities/sandbox/daytona';

// Loaded on use: `slipway template --help` need not load the objective loader (zod, yaml) or the sandbox code (ADR 0016, 3).
const objectiveFile = () => require('../../config/objective-file') as typeof import('../../config/objective-file');
const localTemplate = () => require('../../activities/sandbox/template') as typeof import('../../activities/sandbox/template');
const containerTemplate = () => require('../../activities/sandbox/container-template') as typeof import('../../activities/sandbox/container-template');

export interface TemplateOptions {
  repo?: string;
  base?: string;
  objective?: string;
  setup?: string[];
  verify?: string[];
  confinement?: string;
  network?: boolean;
  force?: boolean;
  json?: boolean;
  provider?: string;
}

interface Wanted {
  repo: string;
  base?: string;
  setup?: ProjectSetup;
  copyIgnored?: boolean;
  confinement?: BubblewrapConfinement;
  /** True when setup came from the command line or an objective file (not from the template). */
  explicitSetup: boolean;
}

async function wanted(opts: TemplateOptions): Promise<Wanted> {
  if (opts.objective) {
    let input;
    try {
      input = await objectiveFile().loadObjectiveFile(opts.objective, { repository: opts.repo, baseBranch: opts.base });
    } catch (e) {
      if (e instanceof objectiveFile().ObjectiveFileError) throw new CliError(e.message, EXIT.badInput);
      throw e;
    }
    // Templates live in a local checkout; a remote's clone is made by the worker that runs the objective (ADR 0028).
    if (input.remote) throw new CliError(`${opts.objective}: repository: ${input.repository} is a remote; templates are made for a local checkout (pass one with --repo)`, EXIT.badInput);
    const s = input.sandbox;
    const setup = s?.projectSetup ? { commands: s.projectSetup.commands, verify: s.projectSetup.verify, timeoutMs: s.projectSetup.timeoutSeconds * 1000, attempts: s.projectSetup.attempts } : undefined;
    return { repo: input.repository, base: input.baseBranch, setup, copyIgnored: s?.copyIgnored, confinement: confinementOf(s), explicitSetup: true };
  }
  const repo = await (require('./worktree') as typeof import('./worktree')).resolveRepo(opts.repo);
  const explicitSetup = (opts.setup?.length ?? 0) > 0 || (opts.verify?.length ?? 0) > 0;
  const confinement: BubblewrapConfinement | undefined =
    opts.confinement === 'bubblewrap' ? { kind: 'bubblewrap', network: opts.network !== false } : opts.confinement && opts.confinement !== 'none' ? badConfinement(opts.confinement) : undefined;
  return { repo, base: opts.base, setup: explicitSetup ? { commands: opts.setup ?? [], verify: opts.verify ?? [] } : undefined, confinement, explicitSetup };
}

function badConfinement(value: string): never {
  throw new CliError(`--confinement must be none or bubblewrap, got "${value}"`);
}

function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(1)} ${units[u]}`;
}

const print = (opts: TemplateOptions, json: unknown, text: string) => process.stdout.write(opts.json ? `${JSON.stringify(json)}\n` : `${text}\n`);
const progress = (line: string) => process.stderr.write(`  ${line}\n`);

function describe(m: TemplateManifest): string {
  const setup = m.setup ? `${m.setup.commands.length} setup and ${m.setup.verify.length} verify commands` : 'no setup';
  return `template ${m.id} at ${m.baseCommit.slice(0, 12)} (${m.baseRef}), ${setup}, built ${m.createdAt} in ${(m.durationMs / 1000).toFixed(1)} s: ${m.root}`;
}

async function build(w: Wanted, base: string, previous?: TemplateManifest): Promise<TemplateManifest> {
  try {
    return await localTemplate().buildTemplate(w.repo, {
      base,
      setup: w.explicitSetup ? w.setup : (previous?.setup ?? w.setup),
      copyIgnored: w.copyIgnored ?? previous?.copyIgnored ?? true,
      confinement: w.confinement ?? previous?.confinement,
      onProgress: progress,
    });
  } catch (e) {
    throw new CliError(`could not build the template: ${(e as Error).message}`, EXIT.runFailed);
  }
}

/**
 * `--provider`: local (the prepared template, a worktree; default), podman or docker (an image,
 * ADR 0025) or daytona (a Daytona snapshot, ADR 0019). Refuses a provider it does not know, and
 * options that do not apply.
 */
function templateProviderOf(opts: TemplateOptions): 'local' | 'daytona' | ContainerEngine {
  const provider = opts.provider ?? 'local';
  if (provider !== 'local' && provider !== 'daytona' && provider !== 'podman' && provider !== 'docker') throw new CliError(`--provider must be local, podman, docker or daytona, got "${provider}"`);
  if (provider !== 'local' && opts.confinement !== undefined) throw new CliError(`--confinement applies to the local template only: a ${provider === 'daytona' ? 'Daytona sandbox' : 'container'} is its own confinement`);
  return provider;
}

/** The verb for a provider's own template; undefined for the local one. */
function otherTemplate(verb: 'create' | 'check' | 'update', opts: TemplateOptions): Promise<number> | undefined {
  const provider = templateProviderOf(opts);
  if (provider === 'daytona') return daytonaSnapshotCommand(verb, opts);
  if (provider !== 'local') return containerTemplateCommand(verb, provider, opts);
  return undefined;
}

function describeImage(m: ContainerTemplateManifest): string {
  const setup = m.setup ? `${m.setup.commands.length} setup and ${m.setup.verify.length} verify commands` : 'no setup';
  return `${m.engine} template ${m.image} at ${m.baseCommit.slice(0, 12)} (${m.baseRef}), ${setup}, from ${m.baseImage}, built ${m.createdAt} in ${(m.durationMs / 1000).toFixed(1)} s`;
}

async function buildImage(w: Wanted, kind: ContainerEngine, base: string, network: boolean, previous?: ContainerTemplateManifest): Promise<ContainerTemplateManifest> {
  try {
    return await containerTemplate().buildContainerTemplate(w.repo, kind, { base, setup: w.explicitSetup ? w.setup : (previous?.setup ?? w.setup), network, onProgress: progress });
  } catch (e) {
    throw new CliError(`could not build the ${kind} template: ${(e as Error).message}`, EXIT.runFailed);
  }
}

/** The same three verbs for a container template: an image instead of a worktree. */
async function containerTemplateCommand(verb: 'create' | 'check' | 'update', kind: ContainerEngine, opts: TemplateOptions): Promise<number> {
  const w = await wanted(opts);
  const check = await containerTemplate().checkContainerTemplate(w.repo, kind, { base: w.base, setup: w.explicitSetup ? w.setup : undefined });
  const network = opts.network !== false;
  if (verb === 'check') {
    const text = check.state === 'fresh' ? `fresh: ${describeImage(check.manifest!)}` : `${check.state}:\n${check.reasons.map((r) => `  - ${r}`).join('\n')}\nrun \`slipway template ${check.state === 'missing' ? 'create' : 'update'} --provider ${kind}\``;
    print(opts, { state: check.state, reasons: check.reasons, template: check.manifest }, text);
    return check.state === 'fresh' ? EXIT.ok : EXIT.runFailed;
  }
  if (verb === 'create') {
    if (check.state === 'fresh') {
      print(opts, { state: 'fresh', created: false, template: check.manifest }, `a fresh template exists: ${describeImage(check.manifest!)}`);
      return EXIT.ok;
    }
    if (check.state === 'stale') throw new CliError(`a ${kind} template exists but is stale (${check.reasons.join('; ')}); rebuild it with \`slipway template update --provider ${kind}\``, EXIT.runFailed);
    const manifest = await buildImage(w, kind, w.base ?? 'HEAD', network);
    print(opts, { state: 'fresh', created: true, template: manifest }, `created ${describeImage(manifest)}`);
    return EXIT.ok;
  }
  if (check.state === 'fresh' && !opts.force) {
    print(opts, { state: 'fresh', updated: false, template: check.manifest }, `already fresh: ${describeImage(check.manifest!)}`);
    return EXIT.ok;
  }
  const previous = await containerTemplate().readContainerTemplate(w.repo, kind);
  const manifest = await buildImage(w, kind, w.base ?? previous?.baseRef ?? 'HEAD', network, previous);
  print(opts, { state: 'fresh', updated: true, reasons: check.reasons, template: manifest }, `updated (${check.reasons.join('; ') || 'forced'}): ${describeImage(manifest)}`);
  return EXIT.ok;
}

function describeSnapshot(m: DaytonaSnapshotManifest): string {
  const setup = m.setup ? `${m.setup.commands.length} setup and ${m.setup.verify.length} verify commands` : 'no setup';
  return `Daytona snapshot ${m.name} at ${m.baseCommit.slice(0, 12)} (${m.baseRef}), ${setup}, built ${m.createdAt} in ${(m.durationMs / 1000).toFixed(1)} s`;
}

async function daytonaSnapshotCommand(verb: 'create' | 'check' | 'update', opts: TemplateOptions): Promise<number> {
  const w = await wanted(opts);
  // Loaded here: the local template's verbs do not pay for the Daytona SDK.
  const { DaytonaSandboxProvider } = require('../../activities/sandbox/daytona') as typeof import('../../activities/sandbox/daytona');
  const provider = new DaytonaSandboxProvider({ snapshot: process.env.DAYTONA_SNAPSHOT });
  const setupNow = w.explicitSetup ? w.setup : undefined;
  try {
    const check = await provider.checkSnapshot(w.repo, { base: w.base, setup: setupNow });
    if (verb === 'check') {
      const text = check.state === 'fresh' ? `fresh: ${describeSnapshot(check.manifest!)}` : `${check.state}:\n${check.reasons.map((r) => `  - ${r}`).join('\n')}\nrun \`slipway template ${check.state === 'missing' ? 'create' : 'update'} --provider daytona\``;
      print(opts, { state: check.state, reasons: check.reasons, snapshot: check.manifest }, text);
      return check.state === 'fresh' ? EXIT.ok : EXIT.runFailed;
    }
    if (check.state === 'fresh' && !(verb === 'update' && opts.force)) {
      print(opts, { state: 'fresh', [verb === 'create' ? 'created' : 'updated']: false, snapshot: check.manifest }, `${verb === 'create' ? 'a fresh snapshot exists' : 'already fresh'}: ${describeSnapshot(check.manifest!)}`);
      return EXIT.ok;
    }
    if (verb === 'create' && check.state === 'stale') {
      throw new CliError(`a Daytona snapshot exists but is stale (${check.reasons.join('; ')}); rebuild it with \`slipway template update --provider daytona\``, EXIT.runFailed);
    }
    const previous = check.manifest;
    const manifest = await provider
      .buildSnapshot(w.repo, { base: w.base ?? previous?.baseRef ?? 'HEAD', setup: w.explicitSetup ? w.setup : (previous?.setup ?? w.setup), onProgress: progress })
      .catch((e: Error) => {
        throw new CliError(`could not build the Daytona snapshot: ${e.message}`, EXIT.runFailed);
      });
    const done = verb === 'create' ? { created: true } : { updated: true, reasons: check.reasons };
    print(opts, { state: 'fresh', ...done, snapshot: manifest }, `${verb === 'create' ? 'created' : `updated (${check.reasons.join('; ') || 'forced'})`}: ${describeSnapshot(manifest)}`);
    return EXIT.ok;
  } catch (e) {
    if (e instanceof CliError) throw e;
    throw new CliError((e as Error).message, EXIT.runFailed);
  }
}

export async function templateCreateCommand(opts: TemplateOptions): Promise<number> {
  const other = otherTemplate('create', opts);
  if (other) return other;
  const w = await wanted(opts);
  const existing = await localTemplate().readTemplate(w.repo);
  if (existing) {
    const check = await localTemplate().checkTemplate(w.repo, { base: w.base, setup: w.explicitSetup ? w.setup : undefined });
    if (check.state === 'fresh') {
      print(opts, { state: 'fresh', created: false, template: existing }, `a fresh template exists: ${describe(existing)}`);
      return EXIT.ok;
    }
    throw new CliError(`a template exists but is stale (${check.reasons.join('; ')}); rebuild it with \`slipway template update\``, EXIT.runFailed);
  }
  const manifest = await build(w, w.base ?? 'HEAD');
  print(opts, { state: 'fresh', created: true, template: manifest }, `created ${describe(manifest)}`);
  return EXIT.ok;
}

export async function templateCheckCommand(opts: TemplateOptions): Promise<number> {
  const other = otherTemplate('check', opts);
  if (other) return other;
  const w = await wanted(opts);
  const check = await localTemplate().checkTemplate(w.repo, { base: w.base, setup: w.explicitSetup ? w.setup : undefined });
  const text =
    check.state === 'fresh'
      ? `fresh: ${describe(check.manifest!)}`
      : `${check.state}:\n${check.reasons.map((r) => `  - ${r}`).join('\n')}\nrun \`slipway template ${check.state === 'missing' ? 'create' : 'update'}\``;
  const copy = await (require('../../activities/sandbox/copy-ignored') as typeof import('../../activities/sandbox/copy-ignored')).describeIgnoredCopy(w.repo);
  const copyText = [
    `ignored files a cold create copies${copy.limitedByIncludeFile ? ' (limited by .worktreeinclude)' : ''}: ${formatBytes(copy.totalBytes)} in ${copy.paths.length} path${copy.paths.length === 1 ? '' : 's'}`,
    ...[...copy.paths].sort((a, b) => b.bytes - a.bytes).map((p) => `  ${formatBytes(p.bytes).padStart(10)}  ${p.path}`),
    ...(copy.excluded.length > 0 ? ['left out (nested git repositories and worktrees, default exclusions):', ...copy.excluded.map((x) => `              ${x}`)] : []),
  ].join('\n');
  print(opts, { state: check.state, reasons: check.reasons, template: check.manifest, copy }, `${text}\n${copyText}`);
  return check.state === 'fresh' ? EXIT.ok : EXIT.runFailed;
}

export async function templateUpdateCommand(opts: TemplateOptions): Promise<number> {
  const other = otherTemplate('update', opts);
  if (other) return other;
  const w = await wanted(opts);
  const previous = await localTemplate().readTemplate(w.repo);
  const check = await localTemplate().checkTemplate(w.repo, { base: w.base, setup: w.explicitSetup ? w.setup : undefined });
  if (check.state === 'fresh' && !opts.force) {
    print(opts, { state: 'fresh', updated: false, template: check.manifest }, `already fresh: ${describe(check.manifest!)}`);
    return EXIT.ok;
  }
  const manifest = await build(w, w.base ?? previous?.baseRef ?? 'HEAD', previous);
  print(
    opts,
    { state: 'fresh', updated: true, reasons: check.reasons, template: manifest },
    `updated (${check.reasons.join('; ') || 'forced'}): ${describe(manifest)}`,
  );
  return EXIT.ok;
}

const collect = (value: string, previous: string[] = []) => [...previous, value];

/**
 * `slipway template ...`; `slipway snapshot ...` is its old name (hidden): "snapshot" now means
 * only a suspended sandbox's stored state.
 */
export function registerTemplateCommands(program: Command, setExit: (code: number) => void): void {
  for (const name of ['template', 'snapshot'] as const) {
    const legacy = name === 'snapshot';
    const group = program
      .command(name, legacy ? { hidden: true } : {})
      .description(GROUP_DESCRIPTIONS.template);
    const warn = () => {
      if (legacy) process.stderr.write('note: `slipway snapshot` is now `slipway template`\n');
    };
    const common = (cmd: Command) =>
      cmd
        .option('--repo <path>', 'repository (default: the one in the current directory)')
        .option('--base <ref>', 'branch or commit to build from (default: HEAD, or the template\'s)')
        .option('--objective <file>', "take project_setup and confinement from this objective file's sandbox: section")
        .option('--setup <command>', 'a project setup command (repeatable)', collect)
        .option('--verify <command>', 'a verify command (repeatable)', collect)
        .option('--provider <kind>', 'local (the prepared template, default), podman or docker (an image from the sandbox image with setup done), or daytona (a Daytona snapshot; DAYTONA_API_KEY, DAYTONA_API_URL, DAYTONA_TARGET, DAYTONA_SNAPSHOT)')
        .option('--confinement <kind>', 'none or bubblewrap, for the setup commands (local)')
        .option('--no-network', 'no network for the setup commands (under bubblewrap, or in the build container)')
        .option('--json', 'print JSON');
    common(group.command('create').description('build the template (no-op when a fresh one exists)')).action(async (opts) => {
      warn();
      setExit(await templateCreateCommand(opts));
    });
    common(group.command('check').description('is the template stale? exit 0 fresh, 1 stale or missing')).action(async (opts) => {
      warn();
      setExit(await templateCheckCommand(opts));
    });
    common(group.command('update').description('rebuild the template when stale (or --force)'))
      .option('--force', 'rebuild even when fresh')
      .action(async (opts) => {
        warn();
        setExit(await templateUpdateCommand(opts));
      });
  }
}
