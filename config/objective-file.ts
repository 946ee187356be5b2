/**
 * Loads the user's objective file (YAML) into an `ObjectiveInput`.
 *
 * Every problem (unreadable file, YAML syntax, schema violations, repository and branch
 * checks) becomes an `ObjectiveFileError` whose message lists all problems, one per line:
 *
 *   path/to/objective.yaml:12:9: streams[1].depends_on[0]: unknown stream "api"
 *
 * Nothing is written to the repository: only read-only git probes run. A remote repository (URL or
 * bare repository) is only classified here, never contacted: the worker that prepares the
 * objective clones it (lib/remote-repository.ts, docs/adr/0028), and its `.slipway/` is not read. The repository's own
 * `.slipway/config.yaml` and `.slipway/blueprints/` are used only when `slipway trust` recorded
 * them as they are (config/trust.ts); the objective file itself is the user's and needs no trust.
 */
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { isMap, stringify as stringifyYaml } from 'yaml';
import { ObjectiveFileSchema, TEXT_LIMITS, type ObjectiveFile } from '../core/objective-schema';
import { ID_PATTERN, ID_RULE } from '../core/ids';
import type { ObjectiveInput, RemoteRepository, ResolvedBlueprints } from '../core/types';
import { resolveObjectiveBlueprint } from './resolve-blueprint';
import { BlueprintUseError } from '../blueprints/loader';
import { loadProjectConfig, PROJECT_CONFIG_FILE, resolveAgents, sanitizeAgents, type AgentSource } from './agent-config';
import { checkRepositoryTrust, trustProblem } from './trust';
import { currentBranch, gitMaybe, isGitRepository, repositoryRoot, resolveCommit } from '../lib/git';
import { classifyRepositorySpec, RepositorySpecError, type RepositoryUrlProtocol } from '../core/repository-spec';
import { sandboxOptionsFromConfig } from './sandbox-options';
import { budgetSpec } from '../core/budget';
import {
  describeIssue,
  describeNode,
  formatFieldPath,
  formatPosition,
  isEmptyDocument,
  issuePath,
  knownKeys,
  parseYamlWithPositions,
  sortByPosition,
  type Issue,
  type PathSegment,
} from '../lib/yaml-positions';

export { formatFieldPath };

export interface ObjectiveFileProblem {
  file: string;
  line?: number;
  column?: number;
  /** Dotted path of the offending field, e.g. `streams[1].depends_on[0]`. */
  field?: string;
  message: string;
}

export class ObjectiveFileError extends Error {
  readonly problems: ObjectiveFileProblem[];

  constructor(problems: ObjectiveFileProblem[]) {
    super(problems.map(formatProblem).join('\n'));
    this.name = 'ObjectiveFileError';
    this.problems = problems;
  }
}

export interface ObjectiveFileOverrides {
  /** Replaces `repository`; relative to process.cwd(). */
  repository?: string;
  id?: string;
  baseBranch?: string;
  /** Clock for the derived id (tests). */
  now?: Date;
}

/** `file:LINE:COL: FIELD: message`, leaving out the parts that are unknown. */
export function formatProblem(p: ObjectiveFileProblem): string {
  const where = formatPosition(p.file, p);
  return p.field ? `${where}: ${p.field}: ${p.message}` : `${where}: ${p.message}`;
}

export async function loadObjectiveFile(file: string, overrides: ObjectiveFileOverrides = {}): Promise<ObjectiveInput> {
  const sourceFile = path.resolve(file);
  const objectiveDir = path.dirname(sourceFile);
  const fail = (problems: ObjectiveFileProblem[]): never => {
    throw new ObjectiveFileError(problems);
  };

  // 1. Read: UTF-8 only, bounded in size.
  let bytes: Buffer;
  try {
    bytes = await fs.readFile(sourceFile);
  } catch (err) {
    return fail([{ file, message: describeReadError(err) }]);
  }
  const tooLarge: ObjectiveFileProblem | undefined =
    bytes.length > TEXT_LIMITS.fileBytes
      ? { file, message: `the file is ${bytes.length.toLocaleString('en-US')} bytes, at most ${TEXT_LIMITS.fileBytes.toLocaleString('en-US')} allowed; put long context in files in the repository` }
      : undefined;
  // Far too large to be worth parsing for field positions.
  if (tooLarge && bytes.length > 16 * TEXT_LIMITS.fileBytes) return fail([tooLarge]);
  const decoded = decodeUtf8(bytes);
  if ('invalidAt' in decoded) {
    const { line, column, byte } = decoded.invalidAt;
    return fail([{ file, line, column, message: `the file is not valid UTF-8 (byte 0x${byte.toString(16).padStart(2, '0')}); save it as UTF-8` }]);
  }
  return loadObjectiveText(decoded.text, { file, objectiveDir, sourceFile, tooLarge }, overrides);
}

/**
 * An objective given as an object (the library's `startObjective`): the same schema, checks and
 * messages as the file, with the field named (no line: there is no file). Relative paths
 * (`repository`, `prompt_file`) are resolved against `dir` (default: the current folder).
 */
export async function loadObjective(spec: Record<string, unknown>, options: ObjectiveFileOverrides & { dir?: string } = {}): Promise<ObjectiveInput> {
  const { dir, ...overrides } = options;
  const label = 'objective';
  if (spec === null || typeof spec !== 'object' || Array.isArray(spec)) throw new ObjectiveFileError([{ file: label, message: 'expected an object with objective, repository, agents and streams' }]);
  // Through YAML so every check (and its wording) is the file's own; positions in that text mean nothing to the caller.
  const text = stringifyYaml(spec);
  const tooLarge: ObjectiveFileProblem | undefined =
    Buffer.byteLength(text) > TEXT_LIMITS.fileBytes ? { file: label, message: `the objective is ${Buffer.byteLength(text).toLocaleString('en-US')} bytes as YAML, at most ${TEXT_LIMITS.fileBytes.toLocaleString('en-US')} allowed` } : undefined;
  try {
    return await loadObjectiveText(text, { file: label, objectiveDir: path.resolve(dir ?? process.cwd()), tooLarge }, overrides);
  } catch (e) {
    if (!(e instanceof ObjectiveFileError)) throw e;
    throw new ObjectiveFileError(e.problems.map((p) => (p.file === label ? { file: label, ...(p.field ? { field: p.field } : {}), message: p.message } : p)));
  }
}

async function loadObjectiveText(
  text: string,
  source: { file: string; objectiveDir: string; sourceFile?: string; tooLarge?: ObjectiveFileProblem },
  overrides: ObjectiveFileOverrides,
): Promise<ObjectiveInput> {
  const { file, objectiveDir, sourceFile, tooLarge } = source;
  const fail = (problems: ObjectiveFileProblem[]): never => {
    throw new ObjectiveFileError(problems);
  };

  // 2. Parse YAML.
  const yaml = parseYamlWithPositions(text);
  const { doc, at } = yaml;
  if (yaml.errors.length > 0) {
    return fail(yaml.errors.map(({ message, ...pos }) => ({ file, ...pos, message: `YAML syntax error: ${message}` })));
  }
  const root = doc.contents;
  if (root === null || isEmptyDocument(doc)) {
    return fail([{ file, message: 'the file is empty; expected a mapping with objective, repository, agents and streams' }]);
  }
  if (!isMap(root)) {
    return fail([{ file, ...at(root.range?.[0]), message: `expected a mapping (key: value pairs) at the top level, found ${describeNode(root)}` }]);
  }
  let raw: unknown;
  try {
    raw = doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    return fail([{ file, ...at(root.range?.[0]), message: `cannot read the YAML: ${err instanceof Error ? err.message : String(err)}` }]);
  }
  const rawObject = raw as Record<string, unknown>;

  // 3. Validate.
  const locate = yaml.locate;
  const problems: ObjectiveFileProblem[] = [];
  // `--repo` stands in for a missing `repository:` (it is resolved and checked in step 4).
  const withRepo = rawObject.repository === undefined && overrides.repository ? { ...rawObject, repository: overrides.repository } : raw;
  const parsed = ObjectiveFileSchema.safeParse(withRepo, { reportInput: true });
  if (!parsed.success) {
    for (const issue of collectIssues(parsed.error.issues, rawObject)) {
      const segments = issuePath(issue);
      if (issue.code === 'unrecognized_keys') {
        const known = knownKeys(ObjectiveFileSchema, segments);
        for (const key of issue.keys) {
          problems.push({
            file,
            ...yaml.locateKey(segments, key),
            field: formatFieldPath([...segments, key]),
            message: `unknown key "${key}"${known ? ` (expected one of: ${known.join(', ')})` : ''}`,
          });
        }
        continue;
      }
      const missing = issue.code === 'invalid_type' && issue.input === undefined && !doc.hasIn(segments);
      problems.push({ file, ...locate(segments), field: formatFieldPath(segments) || undefined, message: describeIssue(issue, missing) });
    }
  }

  // 4. Repository (checked even when other fields are invalid, so every problem shows at once).
  const repositoryField = (message: string, fromOverride: boolean): ObjectiveFileProblem =>
    fromOverride
      ? { file, field: 'repository', message: `${message} (given on the command line)` }
      : { file, ...locate(['repository']), field: 'repository', message };
  const repoFromOverride = overrides.repository !== undefined;
  const repoSpec = repoFromOverride ? overrides.repository : rawObject.repository;
  let repository: string | undefined;
  let remote: RemoteRepository | undefined;
  if (repoFromOverride && (typeof repoSpec !== 'string' || repoSpec.trim() === '')) {
    problems.push(repositoryField('must not be empty', true));
  } else if (typeof repoSpec === 'string' && repoSpec !== '') {
    const wantedBranch = overrides.baseBranch ?? (typeof rawObject.base_branch === 'string' && rawObject.base_branch !== '' ? rawObject.base_branch : undefined);
    const result = await resolveRepositorySpec(repoSpec, repoFromOverride ? process.cwd() : objectiveDir);
    if ('error' in result) problems.push(repositoryField(result.error, repoFromOverride));
    else if ('remote' in result) {
      remote = { url: result.remote.url, protocol: result.remote.protocol, ...(wantedBranch !== undefined ? { baseBranch: wantedBranch } : {}) };
      repository = result.remote.display;
    } else repository = result.root;
  }

  // 5. Base branch.
  let baseBranch: string | undefined;
  if (remote !== undefined) {
    // Resolved on the owner, against the remote's tips then; only the name is checked here.
    baseBranch = remote.baseBranch ?? '';
    if (remote.baseBranch !== undefined && (remote.baseBranch.trim() === '' || remote.baseBranch.startsWith('-'))) {
      const fromOverride = overrides.baseBranch !== undefined;
      problems.push(
        fromOverride
          ? { file, field: 'base_branch', message: `"${remote.baseBranch}" is not a valid branch name (given on the command line)` }
          : { file, ...locate(['base_branch']), field: 'base_branch', message: `"${remote.baseBranch}" is not a valid branch name` },
      );
    }
  } else if (repository !== undefined) {
    const branchFromOverride = overrides.baseBranch !== undefined;
    const fileBranch = typeof rawObject.base_branch === 'string' && rawObject.base_branch !== '' ? rawObject.base_branch : undefined;
    const branchProblem = (message: string): ObjectiveFileProblem =>
      branchFromOverride
        ? { file, field: 'base_branch', message: `${message} (given on the command line)` }
        : { file, ...locate(['base_branch']), field: 'base_branch', message };
    let candidate: string | undefined;
    let fromCurrent = false;
    if (branchFromOverride) candidate = overrides.baseBranch;
    else if (fileBranch !== undefined) candidate = fileBranch;
    else if (rawObject.base_branch === undefined) {
      // A detached HEAD may come back as '' rather than undefined (older simple-git based git.ts).
      candidate = (await currentBranch(repository).catch(() => undefined)) || undefined;
      fromCurrent = true;
      if (candidate === undefined) {
        problems.push(branchProblem(`not set, and the repository ${repository} has a detached HEAD; set base_branch to the branch to build on`));
      }
    }
    // (an invalid base_branch in the file was already reported by the schema)
    if (candidate !== undefined) {
      if (candidate.trim() === '' || candidate.startsWith('-')) {
        problems.push(branchProblem(`"${candidate}" is not a valid branch name`));
      } else {
        // An unknown ref may come back as '' rather than a throw (older simple-git based git.ts).
        const commit = await resolveCommit(repository, candidate).catch(() => undefined);
        if (!commit) {
          problems.push(
            branchProblem(
              fromCurrent
                ? `not set, and the repository's current branch "${candidate}" in ${repository} has no commits yet; commit something or set base_branch`
                : `branch "${candidate}" does not resolve to a commit in ${repository}`,
            ),
          );
        } else baseBranch = candidate;
      }
    }
  }

  // 5b. Agents: `.slipway/config.yaml`'s defaults under the file's, prompt templates, command lines.
  // Checked even when other fields are invalid; without a repository there are no defaults to merge.
  const objectiveAgents: AgentSource = {
    file,
    dir: objectiveDir,
    locate,
    locateKey: yaml.locateKey,
    ...sanitizeAgents(rawObject.agents, parsed.success ? [] : parsed.error.issues, ['agents']),
  };
  // A remote's own files are on the owner's clone only: its `.slipway/config.yaml` is not read here.
  const localRepository = remote === undefined ? repository : undefined;
  const config = localRepository === undefined ? { problems: [] } : await loadProjectConfig(localRepository);
  const otherFiles: ObjectiveFileProblem[] = [...config.problems];
  const resolved = await resolveAgents(objectiveAgents, config.source, 'prices' in config ? config.prices : undefined);
  for (const p of resolved.problems) (p.file === file ? problems : otherFiles).push(p);
  const configName = localRepository === undefined ? PROJECT_CONFIG_FILE : path.join(localRepository, PROJECT_CONFIG_FILE);
  const declared = (role: 'builder' | 'planner') =>
    objectiveAgents.agents[role] !== undefined || objectiveAgents.reported[role] !== undefined || config.source?.agents[role] !== undefined;
  if (!declared('builder') && (rawObject.agents === undefined || isMap(doc.get('agents', true)))) {
    problems.push({ file, ...locate(['agents']), field: 'agents.builder', message: `is required: configure the builder agent here or in ${configName}` });
  }
  const noStreams = rawObject.streams === undefined || (Array.isArray(rawObject.streams) && rawObject.streams.length === 0);
  if (noStreams && !declared('planner')) {
    problems.push({ file, ...locate(['streams']), field: 'streams', message: `list at least one stream, or configure agents.planner (here or in ${configName}) to plan them` });
  }

  // 6. Id.
  let id: string | undefined;
  if (overrides.id !== undefined) {
    if (ID_PATTERN.test(overrides.id)) id = overrides.id;
    else problems.push({ file, field: 'id', message: `"${overrides.id}" (given on the command line) must be ${ID_RULE}` });
  } else if (parsed.success) {
    id = parsed.data.id ?? deriveObjectiveId(sourceFile ?? file, overrides.now ?? new Date());
  }

  // 7. Blueprint (and the blueprints it references).
  let blueprint: ResolvedBlueprints | undefined;
  if (parsed.success && repository !== undefined) {
    try {
      blueprint = await resolveObjectiveBlueprint(localRepository, parsed.data.blueprint);
    } catch (e) {
      if (e instanceof BlueprintUseError) {
        const { wrongLevel } = e;
        const message = wrongLevel
          ? `"${wrongLevel.id}" is ${wrongLevel.level === 'objective' ? 'an' : 'a'} ${wrongLevel.level} blueprint; an objective runs an objective blueprint` +
            ` (${wrongLevel.candidates.length ? `objective blueprints: ${wrongLevel.candidates.join(', ')}` : 'none is defined'})`
          : `"${parsed.data.blueprint}" cannot run as this objective's blueprint: ${e.problems.length} problem${e.problems.length === 1 ? '' : 's'} below`;
        problems.push({ file, ...locate(['blueprint']), field: 'blueprint', message });
        for (const p of e.problems) {
          // The objective file's line already says the level is wrong; the steps say why it matters.
          if (wrongLevel && p.file === wrongLevel.file && p.field === 'level' && p.step === undefined) continue;
          const field = [p.step === undefined ? undefined : `step ${p.step}`, p.field].filter(Boolean).join(': ');
          otherFiles.push({ file: p.file, line: p.line, column: p.column, ...(field ? { field } : {}), message: p.message });
        }
      } else problems.push({ file, ...locate(['blueprint']), field: 'blueprint', message: (e as Error).message });
    }
  }

  // 7b. The repository's own config (agents, prompts, blueprints) runs only once the user trusted it.
  // Checked after reading it, so the fingerprint covers what was read; its other problems are still reported.
  if (localRepository !== undefined) {
    try {
      const trust = trustProblem(await checkRepositoryTrust(localRepository));
      if (trust) otherFiles.unshift({ file: trust.file, message: trust.message });
    } catch (e) {
      otherFiles.unshift({ file: localRepository, message: (e as Error).message });
    }
  }

  if (tooLarge) otherFiles.unshift(tooLarge);
  if (problems.length > 0 || otherFiles.length > 0) return fail([...sortByPosition(problems), ...otherFiles]);
  if (!parsed.success || repository === undefined || baseBranch === undefined || id === undefined || blueprint === undefined) {
    // Unreachable: every failing path above records a problem.
    return fail([{ file, message: 'the objective file is invalid' }]);
  }

  // 8. Build.
  const data: ObjectiveFile = parsed.data;
  const input: ObjectiveInput = {
    id,
    objective: data.objective,
    repository,
    baseBranch,
    ...(remote ? { remote } : {}),
    objectiveDir,
    ...(sourceFile ? { sourceFile } : {}),
    maxParallelStreams: data.max_parallel_streams,
    maxFixIterations: data.max_fix_iterations,
    onExhausted: data.on_exhausted,
    requireApproval: data.require_approval,
    blueprint,
    gates: data.gates,
    postMergeGates: data.post_merge_gates ?? data.gates,
    agents: resolved.agents,
    streams: data.streams,
    sandbox: sandboxOptionsFromConfig(data.sandbox, objectiveDir),
  };
  // The file's budget fields replace the config's one by one (a file's `stream:` limit keeps the config's `objective:` one).
  const budget = budgetSpec(config.budget || data.budget ? { ...config.budget, ...data.budget } : undefined);
  if (budget) input.budget = budget;
  // Prompt templates read from files travel in the input too; keep it well under Temporal's 2 MB payload limit.
  const inputBytes = Buffer.byteLength(JSON.stringify(input));
  if (inputBytes > MAX_INPUT_BYTES) {
    const prompts = Object.entries(input.agents)
      .filter(([, a]) => a?.prompt !== undefined)
      .map(([role, a]) => ({ role, bytes: Buffer.byteLength(a!.prompt!), from: a!.prompt_file }))
      .sort((a, b) => b.bytes - a.bytes)
      .map((p) => `agents.${p.role}.prompt${p.from ? ` (${p.from})` : ''} ${p.bytes.toLocaleString('en-US')} bytes`);
    return fail([
      {
        file,
        message: `the objective with its agents' prompt templates and blueprints is ${inputBytes.toLocaleString('en-US')} bytes, at most ${MAX_INPUT_BYTES.toLocaleString('en-US')} allowed${prompts.length ? `; the prompts: ${prompts.join(', ')}` : ''}`,
      },
    ]);
  }
  return input;
}

/** The objective workflow's input as JSON; Temporal refuses payloads over 2 MB. */
const MAX_INPUT_BYTES = 1536 * 1024;

/** `add-dark-mode.yaml` at 2025-01-02T03:04:05Z -> `add-dark-mode-20250102-030405`. */
export function deriveObjectiveId(file: string, now: Date): string {
  const pad = (n: number) => String(n).padStart(2, '0');
  const stamp =
    `${now.getUTCFullYear()}${pad(now.getUTCMonth() + 1)}${pad(now.getUTCDate())}` +
    `-${pad(now.getUTCHours())}${pad(now.getUTCMinutes())}${pad(now.getUTCSeconds())}`;
  const maxSlug = 63 - stamp.length - 1;
  const base = path.basename(file, path.extname(file));
  const clean = (s: string) => s.replace(/-{2,}/g, '-').replace(/^[-_]+|[-_]+$/g, '');
  const slug = clean(clean(base.toLowerCase().replace(/[^a-z0-9_-]/g, '-')).slice(0, maxSlug)) || 'objective';
  return `${slug}-${stamp}`;
}

// ---------------------------------------------------------------------------------------
// Repository

/**
 * A local checkout resolves to its root. A URL or a bare repository is only classified (embedded
 * credentials refused): it is not contacted here, since the worker that prepares the objective
 * clones it with its own credentials (docs/adr/0028).
 */
async function resolveRepositorySpec(
  spec: string,
  relativeTo: string,
): Promise<{ root: string } | { remote: { url: string; protocol: RepositoryUrlProtocol; display: string } } | { error: string }> {
  try {
    const classified = classifyRepositorySpec(spec);
    if (classified.kind === 'url') {
      if (classified.hasCredentials) {
        return { error: `${classified.display} embeds credentials; never put a password or token in the URL (it would be stored in the objective's history): use a git credential helper or the environment (GIT_ASKPASS, an ssh agent)` };
      }
      return { remote: classified };
    }
    const dir = path.resolve(relativeTo, expandHome(spec));
    if (!(await isBareRepository(dir))) return resolveRepository(dir);
    const real = await fs.realpath(dir);
    return { remote: { url: real, protocol: 'file', display: real } };
  } catch (e) {
    if (e instanceof RepositorySpecError) return { error: e.message };
    throw e;
  }
}

async function isBareRepository(dir: string): Promise<boolean> {
  return (await gitMaybe(dir, ['rev-parse', '--is-bare-repository'])) === 'true';
}

async function resolveRepository(dir: string): Promise<{ root: string } | { error: string }> {
  let stat;
  try {
    stat = await fs.stat(dir);
  } catch {
    return { error: `${dir} does not exist` };
  }
  if (!stat.isDirectory()) return { error: `${dir} is not a directory` };
  if (!(await isGitRepository(dir))) return { error: `${dir} is not a git repository (run "git init" there, or point repository at one)` };
  let top: string;
  try {
    top = await repositoryRoot(dir);
  } catch {
    return { error: `${dir} has no working tree (a bare repository?); point repository at a checkout` };
  }
  if (top === '') return { error: `${dir} has no working tree (a bare repository?); point repository at a checkout` };
  try {
    return { root: await fs.realpath(top) };
  } catch {
    return { root: top };
  }
}

function expandHome(p: string): string {
  return p === '~' || p.startsWith('~/') ? path.join(os.homedir(), p.slice(1)) : p;
}

/**
 * Strict UTF-8 (a fatal TextDecoder: a Latin-1 file is refused, not read with replacement
 * characters); on failure, where the first invalid byte is.
 */
export function decodeUtf8(bytes: Uint8Array): { text: string } | { invalidAt: { line: number; column: number; byte: number } } {
  try {
    return { text: new TextDecoder('utf-8', { fatal: true }).decode(bytes) };
  } catch {
    // Feed the bytes one by one: the decoder throws at the first one that cannot be part of a character.
    const decoder = new TextDecoder('utf-8', { fatal: true });
    let line = 1;
    let column = 1;
    let pending = -1; // where an unfinished multi-byte character began: the byte to name
    for (let i = 0; i < bytes.length; i++) {
      let chars: string;
      try {
        chars = decoder.decode(bytes.subarray(i, i + 1), { stream: true });
      } catch {
        return { invalidAt: { line, column, byte: bytes[pending >= 0 ? pending : i]! } };
      }
      if (chars === '') {
        if (pending < 0) pending = i;
        continue;
      }
      pending = -1;
      for (const c of chars) {
        if (c === '\n') {
          line++;
          column = 1;
        } else column++;
      }
    }
    // The file ends inside a character.
    return { invalidAt: { line, column, byte: bytes[pending >= 0 ? pending : bytes.length - 1]! } };
  }
}

function describeReadError(err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'ENOENT') return 'cannot read the objective file: no such file';
  if (code === 'EISDIR') return 'cannot read the objective file: it is a directory';
  if (code === 'EACCES' || code === 'EPERM') return 'cannot read the objective file: permission denied';
  return `cannot read the objective file: ${err instanceof Error ? err.message : String(err)}`;
}

// ---------------------------------------------------------------------------------------
// Zod issues -> messages

/**
 * The schema's cross-stream checks (duplicate ids, unknown dependencies, cycles) live in a
 * superRefine that zod skips once any other field fails its checks. To still report them
 * together with the rest, validate the streams' ids and dependencies again inside an
 * otherwise valid file and add the stream issues not already reported.
 */
function collectIssues(issues: Issue[], raw: Record<string, unknown>): Issue[] {
  const key = (i: Issue) => `${JSON.stringify(i.path)}|${i.code}|${i.message}`;
  const seen = new Set(issues.map(key));
  const all = [...issues];
  if (!Array.isArray(raw.streams) || raw.streams.length === 0) return all;
  const probe = {
    objective: 'probe',
    repository: 'probe',
    agents: { builder: { provider: 'script', command: 'probe' } },
    streams: raw.streams.map((s: unknown) => {
      if (s === null || typeof s !== 'object' || Array.isArray(s)) return s;
      const { id, depends_on } = s as Record<string, unknown>;
      return depends_on === undefined ? { id, task: 'probe' } : { id, task: 'probe', depends_on };
    }),
  };
  const again = ObjectiveFileSchema.safeParse(probe, { reportInput: true });
  if (again.success) return all;
  for (const issue of again.error.issues) {
    if (issue.path[0] !== 'streams' || seen.has(key(issue))) continue;
    seen.add(key(issue));
    all.push(issue);
  }
  return all;
}
