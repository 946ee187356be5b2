/**
 * Loads the user's objective file (YAML) into an `ObjectiveInput`.
 *
 * Every problem (unreadable file, YAML syntax, schema violations, repository and branch
 * checks) becomes an `ObjectiveFileError` whose message lists all problems, one per line:
 *
 *   path/to/objective.yaml:12:9: streams[1].depends_on[0]: unknown stream "api"
 *
 * Nothing is written to the repository: only read-only git probes run.
 */
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { LineCounter, isCollection, isMap, isScalar, isSeq, parseDocument, type Document, type Node } from 'yaml';
import { z } from 'zod';
import { ObjectiveFileSchema, type ObjectiveFile } from '../core/objective-schema';
import { ID_PATTERN, ID_RULE } from '../core/ids';
import type { ObjectiveInput } from '../core/types';
import { currentBranch, isGitRepository, repositoryRoot, resolveCommit } from '../activities/git';

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
  let where = p.file;
  if (p.line !== undefined) {
    where += `:${p.line}`;
    if (p.column !== undefined) where += `:${p.column}`;
  }
  return p.field ? `${where}: ${p.field}: ${p.message}` : `${where}: ${p.message}`;
}

type PathSegment = string | number;

/** `['streams', 1, 'depends_on', 0]` -> `streams[1].depends_on[0]`. */
export function formatFieldPath(segments: readonly PathSegment[]): string {
  let out = '';
  for (const seg of segments) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else out += out === '' ? seg : `.${seg}`;
  }
  return out;
}

export async function loadObjectiveFile(file: string, overrides: ObjectiveFileOverrides = {}): Promise<ObjectiveInput> {
  const sourceFile = path.resolve(file);
  const objectiveDir = path.dirname(sourceFile);
  const fail = (problems: ObjectiveFileProblem[]): never => {
    throw new ObjectiveFileError(problems);
  };

  // 1. Read.
  let text: string;
  try {
    text = await fs.readFile(sourceFile, 'utf8');
  } catch (err) {
    return fail([{ file, message: describeReadError(err) }]);
  }

  // 2. Parse YAML.
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, prettyErrors: false });
  const at = (offset: number | undefined) => {
    if (offset === undefined) return {};
    const { line, col } = lineCounter.linePos(offset);
    return { line, column: col };
  };
  if (doc.errors.length > 0) {
    return fail(doc.errors.map((e) => ({ file, ...at(e.pos?.[0]), message: `YAML syntax error: ${e.message}` })));
  }
  const root = doc.contents;
  if (root === null || (isScalar(root) && (root.value === null || root.value === undefined))) {
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
  const locate = (segments: readonly PathSegment[]) => at(locateOffset(doc, segments));
  const problems: ObjectiveFileProblem[] = [];
  const parsed = ObjectiveFileSchema.safeParse(raw, { reportInput: true });
  if (!parsed.success) {
    for (const issue of collectIssues(parsed.error.issues, rawObject)) {
      const segments = issue.path.filter((s): s is PathSegment => typeof s !== 'symbol');
      if (issue.code === 'unrecognized_keys') {
        const known = knownKeys(segments);
        for (const key of issue.keys) {
          problems.push({
            file,
            ...at(locateKeyOffset(doc, segments, key)),
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
  if (repoFromOverride && (typeof repoSpec !== 'string' || repoSpec.trim() === '')) {
    problems.push(repositoryField('must not be empty', true));
  } else if (typeof repoSpec === 'string' && repoSpec !== '') {
    const resolved = path.resolve(repoFromOverride ? process.cwd() : objectiveDir, expandHome(repoSpec));
    const result = await resolveRepository(resolved);
    if ('error' in result) problems.push(repositoryField(result.error, repoFromOverride));
    else repository = result.root;
  }

  // 5. Base branch.
  let baseBranch: string | undefined;
  if (repository !== undefined) {
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

  // 6. Id.
  let id: string | undefined;
  if (overrides.id !== undefined) {
    if (ID_PATTERN.test(overrides.id)) id = overrides.id;
    else problems.push({ file, field: 'id', message: `"${overrides.id}" (given on the command line) must be ${ID_RULE}` });
  } else if (parsed.success) {
    id = parsed.data.id ?? deriveObjectiveId(sourceFile, overrides.now ?? new Date());
  }

  if (problems.length > 0) return fail(sortProblems(problems));
  if (!parsed.success || repository === undefined || baseBranch === undefined || id === undefined) {
    // Unreachable: every failing path above records a problem.
    return fail([{ file, message: 'the objective file is invalid' }]);
  }

  // 7. Build.
  const data: ObjectiveFile = parsed.data;
  return {
    id,
    objective: data.objective,
    repository,
    baseBranch,
    objectiveDir,
    sourceFile,
    maxParallelStreams: data.max_parallel_streams,
    maxFixIterations: data.max_fix_iterations,
    gates: data.gates,
    postMergeGates: data.post_merge_gates ?? data.gates,
    agents: data.agents,
    streams: data.streams,
  };
}

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

function describeReadError(err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'ENOENT') return 'cannot read the objective file: no such file';
  if (code === 'EISDIR') return 'cannot read the objective file: it is a directory';
  if (code === 'EACCES' || code === 'EPERM') return 'cannot read the objective file: permission denied';
  return `cannot read the objective file: ${err instanceof Error ? err.message : String(err)}`;
}

// ---------------------------------------------------------------------------------------
// Zod issues -> messages

type Issue = z.core.$ZodIssue;

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

function describeIssue(issue: Issue, missing: boolean): string {
  switch (issue.code) {
    case 'invalid_type': {
      const expected = expectedName(issue.expected);
      if (missing) return `is required (${expected})`;
      return `expected ${expected}, got ${describeValue(issue.input)}`;
    }
    case 'too_small': {
      if (issue.origin === 'string' && Number(issue.minimum) === 1) return 'must not be empty';
      if (issue.origin === 'array') {
        const n = Number(issue.minimum);
        return `must list at least ${n} item${n === 1 ? '' : 's'}`;
      }
      if (issue.origin === 'string') return `must be at least ${issue.minimum} characters long`;
      return `must be ${issue.inclusive ? 'at least' : 'greater than'} ${issue.minimum}, got ${describeValue(issue.input)}`;
    }
    case 'too_big': {
      if (issue.origin === 'array') return `must list at most ${issue.maximum} items`;
      if (issue.origin === 'string') return `must be at most ${issue.maximum} characters long`;
      return `must be ${issue.inclusive ? 'at most' : 'less than'} ${issue.maximum}, got ${describeValue(issue.input)}`;
    }
    case 'invalid_value':
      return `must be one of ${issue.values.map((v) => JSON.stringify(v)).join(', ')}, got ${describeValue(issue.input)}`;
    case 'invalid_format':
      return `${describeValue(issue.input)} ${issue.message}`;
    case 'custom':
      // Refinements such as "is reserved (...)" read better with the value in front.
      return issue.message.startsWith('is ') && typeof issue.input === 'string'
        ? `"${issue.input}" ${issue.message}`
        : issue.message;
    default:
      return issue.message;
  }
}

function expectedName(expected: string): string {
  switch (expected) {
    case 'string':
      return 'a string';
    case 'number':
      return 'a number';
    case 'int':
      return 'a whole number';
    case 'boolean':
      return 'true or false';
    case 'array':
      return 'a list';
    case 'object':
      return 'a mapping';
    default:
      return expected;
  }
}

function describeValue(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'an empty value';
  if (typeof value === 'string') return `"${value.length > 40 ? `${value.slice(0, 40)}...` : value}"`;
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  return typeof value;
}

function describeNode(node: Node): string {
  if (isSeq(node)) return 'a list';
  if (isScalar(node)) return `the value ${describeValue(node.value)}`;
  return 'something else';
}

/** Keys an object schema at `segments` accepts, for "unknown key" messages. */
function knownKeys(segments: readonly PathSegment[]): string[] | undefined {
  let schema: unknown = ObjectiveFileSchema;
  const unwrap = (s: unknown): unknown => {
    let cur = s;
    for (let i = 0; i < 10; i++) {
      if (cur instanceof z.ZodOptional || cur instanceof z.ZodDefault || cur instanceof z.ZodNullable) cur = cur.unwrap();
      else break;
    }
    return cur;
  };
  for (const seg of segments) {
    schema = unwrap(schema);
    if (typeof seg === 'number' && schema instanceof z.ZodArray) schema = schema.element;
    else if (typeof seg === 'string' && schema instanceof z.ZodObject) schema = (schema.shape as Record<string, unknown>)[seg];
    else return undefined;
  }
  schema = unwrap(schema);
  return schema instanceof z.ZodObject ? Object.keys(schema.shape) : undefined;
}

// ---------------------------------------------------------------------------------------
// Zod path -> YAML position

function findPair(map: unknown, key: PathSegment) {
  if (!isMap(map)) return undefined;
  return map.items.find((pair) => {
    const k = isScalar(pair.key) ? pair.key.value : pair.key;
    return k !== null && k !== undefined && String(k) === String(key);
  });
}

function startOf(node: unknown): number | undefined {
  if (node && typeof node === 'object' && 'range' in node) {
    const range = (node as Node).range;
    if (range) return range[0];
  }
  return undefined;
}

/**
 * Offset of the YAML node a zod path names. Scalars point at the value; block collections
 * at their key (the `streams:` line); a missing key at its parent mapping.
 */
function locateOffset(doc: Document, segments: readonly PathSegment[]): number | undefined {
  if (segments.length === 0) return startOf(doc.contents);
  const parentPath = segments.slice(0, -1);
  const last = segments[segments.length - 1];
  const parent = parentPath.length === 0 ? doc.contents : doc.getIn(parentPath, true);
  if (isMap(parent)) {
    const pair = findPair(parent, last);
    if (!pair) return locateOffset(doc, parentPath);
    const value = pair.value;
    if (isScalar(value) && value.range && value.range[1] > value.range[0]) return value.range[0];
    if (isCollection(value) && value.flow && value.range) return value.range[0];
    return startOf(pair.key) ?? locateOffset(doc, parentPath);
  }
  if (isSeq(parent) && typeof last === 'number') {
    return startOf(parent.items[last]) ?? locateOffset(doc, parentPath);
  }
  return locateOffset(doc, parentPath);
}

function locateKeyOffset(doc: Document, mapPath: readonly PathSegment[], key: string): number | undefined {
  const map = mapPath.length === 0 ? doc.contents : doc.getIn(mapPath, true);
  return startOf(findPair(map, key)?.key) ?? locateOffset(doc, mapPath);
}

function sortProblems(problems: ObjectiveFileProblem[]): ObjectiveFileProblem[] {
  return problems
    .map((p, i) => ({ p, i }))
    .sort((a, b) => (a.p.line ?? 0) - (b.p.line ?? 0) || (a.p.column ?? 0) - (b.p.column ?? 0) || a.i - b.i)
    .map(({ p }) => p);
}
