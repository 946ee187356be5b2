/**
 * Loads blueprints: YAML files validated by `BlueprintSchema`, then by the graph checks in
 * `validate.ts`. Every problem, in every file, is reported at once as a `BlueprintError`
 * whose message has one line per problem:
 *
 *   .slipway/blueprints/fast.yaml:14:11: step gates: on_fail: unknown step "biuld" (did you mean "build"?); steps are: build, gates
 *
 * Search path (a later folder overrides an earlier one for the same id):
 *   shipped (this folder) < user (`$SLIPWAY_BLUEPRINTS_USER_DIR`, else `~/.config/slipway/blueprints`)
 *   < project (`<projectDir>/.slipway/blueprints`).
 */
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { isMap } from 'yaml';
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
  type PathSegment,
  type Position,
  type YamlWithPositions,
} from '../lib/yaml-positions';
import type { ResolvedBlueprints } from '../core/types';
import { BlueprintSchema, type Blueprint, type BlueprintLevel } from '../core/blueprint-schema';
import {
  DISPATCH_STREAMS_BLUEPRINT,
  didYouMean,
  findRefCycles,
  validateBlueprint,
  validateBlueprintUse,
  validatePartialBlueprint,
  type BlueprintIssue,
  type ValidateOptions,
} from './validate';

export type { ResolvedBlueprints };

/** The blueprints shipped with Slipway (`standard`, `build-review`). */
export const SHIPPED_BLUEPRINTS_DIR = __dirname;
/** Overrides the user folder (tests, unusual setups). */
export const USER_DIR_ENV = 'SLIPWAY_BLUEPRINTS_USER_DIR';
/** The project folder, relative to the repository. */
export const PROJECT_BLUEPRINTS_DIR = path.join('.slipway', 'blueprints');

export interface BlueprintProblem extends Position {
  file: string;
  /** The step the problem is in: its id, or `#3` (1-based) when it has no valid id. */
  step?: string;
  /** Dotted field path, relative to the step when there is one (`retry.max_attempts`). */
  field?: string;
  message: string;
}

export class BlueprintError extends Error {
  readonly problems: BlueprintProblem[];

  constructor(problems: BlueprintProblem[]) {
    super(problems.map(formatBlueprintProblem).join('\n'));
    this.name = 'BlueprintError';
    this.problems = problems;
  }
}

/** `file:LINE:COL: step ID: FIELD: message`, leaving out the parts that do not apply. */
export function formatBlueprintProblem(p: BlueprintProblem): string {
  const parts = [formatPosition(p.file, p)];
  if (p.step !== undefined) parts.push(`step ${p.step}`);
  if (p.field) parts.push(p.field);
  parts.push(p.message);
  return parts.join(': ');
}

/** Loads and checks one blueprint file on its own (refs to other blueprints are not checked). */
export async function loadBlueprintFile(file: string): Promise<Blueprint> {
  const parsed = await parseBlueprintFile(file);
  if (parsed.problems.length > 0 || !parsed.blueprint) throw new BlueprintError(sortByPosition(parsed.problems));
  return parsed.blueprint;
}

export type BlueprintSource = 'shipped' | 'user' | 'project';

export interface LoadedBlueprint {
  blueprint: Blueprint;
  /** Absolute path of the file it came from. */
  file: string;
  source: BlueprintSource;
}

export interface BlueprintSearchOptions {
  /** The project (repository) whose `.slipway/blueprints` folder comes last and wins. */
  projectDir?: string;
  /** The user folder; default `$SLIPWAY_BLUEPRINTS_USER_DIR`, else `~/.config/slipway/blueprints`. */
  userDir?: string;
}

/** The folders searched, lowest precedence first. Folders that do not exist are skipped when loading. */
export function blueprintSearchPath(options: BlueprintSearchOptions = {}): { source: BlueprintSource; dir: string }[] {
  const fromEnv = process.env[USER_DIR_ENV];
  const userDir = options.userDir ?? (fromEnv ? fromEnv : path.join(os.homedir(), '.config', 'slipway', 'blueprints'));
  const dirs: { source: BlueprintSource; dir: string }[] = [
    { source: 'shipped', dir: SHIPPED_BLUEPRINTS_DIR },
    { source: 'user', dir: path.resolve(userDir) },
  ];
  if (options.projectDir !== undefined) dirs.push({ source: 'project', dir: path.resolve(options.projectDir, PROJECT_BLUEPRINTS_DIR) });
  return dirs;
}

/**
 * Every blueprint on the search path by id, the last folder's winning. Throws a
 * `BlueprintError` listing every problem in every file (overridden ones included), and
 * problems between blueprints: unknown refs, level mismatches, cycles of refs.
 */
export async function loadBlueprints(options: BlueprintSearchOptions = {}): Promise<Map<string, LoadedBlueprint>> {
  const problems: BlueprintProblem[] = [];
  const parsedFiles: ParsedFile[] = [];
  const effective = new Map<string, ParsedFile>();

  for (const { source, dir } of blueprintSearchPath(options)) {
    const listed = await listYamlFiles(dir);
    if ('problem' in listed) {
      problems.push(listed.problem);
      continue;
    }
    const inFolder = new Map<string, ParsedFile>();
    for (const file of listed.files) {
      const parsed = await parseBlueprintFile(file, source);
      parsedFiles.push(parsed);
      const id = parsed.id;
      if (id === undefined) continue;
      const other = inFolder.get(id);
      if (other) {
        parsed.problems.push(parsed.problemAt(['id'], `blueprint id "${id}" is also used by ${other.file} in the same folder; ids must be unique within a folder`));
        continue;
      }
      inFolder.set(id, parsed);
      effective.set(id, parsed);
    }
  }

  // Between blueprints, for the ones that win and are valid on their own.
  const valid = new Map<string, Blueprint>();
  for (const [id, parsed] of effective) if (parsed.blueprint && parsed.problems.length === 0) valid.set(id, parsed.blueprint);
  // Ids of blueprints whose file has problems count as known (no second "unknown" report).
  const between: ValidateOptions = { knownBlueprintIds: [...effective.keys()], lookup: (id) => valid.get(id) };
  for (const [id, bp] of valid) {
    // The file passed these checks without the other blueprints: what is new is between them.
    const parsed = effective.get(id)!;
    for (const issue of validateBlueprint(bp, between)) parsed.problems.push(parsed.issueProblem(issue));
  }
  for (const { blueprintId, issue } of findRefCycles(valid)) {
    const parsed = effective.get(blueprintId)!;
    parsed.problems.push(parsed.issueProblem(issue));
  }

  for (const parsed of parsedFiles) problems.push(...sortByPosition(parsed.problems));
  if (problems.length > 0) throw new BlueprintError(problems);

  const out = new Map<string, LoadedBlueprint>();
  for (const id of [...effective.keys()].sort()) {
    const parsed = effective.get(id)!;
    out.set(id, { blueprint: parsed.blueprint!, file: parsed.file, source: parsed.source! });
  }
  return out;
}

export class UnknownBlueprintError extends Error {
  constructor(
    readonly id: string,
    readonly known: string[],
    readonly referencedBy?: string,
  ) {
    const guess = didYouMean(id, known);
    super(
      `${referencedBy ? `blueprint "${referencedBy}" refers to ` : ''}unknown blueprint "${id}"` +
        `${guess ? ` (did you mean "${guess}"?)` : ''}; known blueprints: ${known.join(', ') || 'none'}`,
    );
    this.name = 'UnknownBlueprintError';
  }
}

/**
 * The blueprint `id` and every blueprint it references, directly or not (a `dispatch_streams`
 * step references `build-review`), as plain data for a workflow input: deep copies, no Maps.
 */
export function resolveBlueprint(blueprints: ReadonlyMap<string, { blueprint: Blueprint }>, id: string): ResolvedBlueprints {
  const known = [...blueprints.keys()].sort();
  const root = blueprints.get(id)?.blueprint;
  if (!root) throw new UnknownBlueprintError(id, known);
  const refs: Record<string, Blueprint> = {};
  const visit = (bp: Blueprint) => {
    for (const step of bp.steps) {
      const refId =
        step.type === 'blueprint_ref' ? step.ref : step.type === 'deterministic' && step.action === 'dispatch_streams' ? DISPATCH_STREAMS_BLUEPRINT : undefined;
      if (refId === undefined || refId === root.id || refs[refId]) continue;
      const ref = blueprints.get(refId)?.blueprint;
      if (!ref) throw new UnknownBlueprintError(refId, known, bp.id);
      refs[refId] = structuredClone(ref);
      visit(ref);
    }
  };
  visit(root);
  return { root: structuredClone(root), refs };
}

/** A blueprint that is valid on its own but cannot run where it is used; `problems` point into its file. */
export class BlueprintUseError extends BlueprintError {
  constructor(
    problems: BlueprintProblem[],
    /** Set when the named blueprint itself is of the wrong level. */
    readonly wrongLevel?: { id: string; file: string; level: BlueprintLevel; expected: BlueprintLevel; candidates: string[] },
  ) {
    super(problems);
    this.name = 'BlueprintUseError';
  }
}

/**
 * `resolveBlueprint`, then the checks for the level it is used at (`validateBlueprintUse`), so a
 * stream blueprint named as an objective's is refused before anything starts rather than failing
 * the run ("a builder step cannot run at objective level").
 */
export async function resolveBlueprintForUse(blueprints: ReadonlyMap<string, LoadedBlueprint>, id: string, level: BlueprintLevel): Promise<ResolvedBlueprints> {
  const resolved = resolveBlueprint(blueprints, id);
  const issues = validateBlueprintUse(resolved, level);
  if (issues.length === 0) return resolved;
  const yamlOf = new Map<string, YamlWithPositions | undefined>();
  const problems: BlueprintProblem[] = [];
  for (const { blueprintId, issue } of issues) {
    const file = blueprints.get(blueprintId)?.file ?? blueprintId;
    if (!yamlOf.has(file)) yamlOf.set(file, await fs.readFile(file, 'utf8').then(parseYamlWithPositions, () => undefined));
    const [first, index, ...rest] = issue.path;
    const inStep = first === 'steps' && typeof index === 'number';
    const field = formatFieldPath(inStep ? rest : issue.path);
    problems.push({
      file,
      ...(yamlOf.get(file)?.locate(issue.path) ?? {}),
      ...(inStep ? { step: issue.stepId ?? `#${index + 1}` } : {}),
      ...(field ? { field } : {}),
      message: issue.message,
    });
  }
  const root = resolved.root;
  const wrongLevel =
    root.level === level
      ? undefined
      : { id, file: blueprints.get(id)!.file, level: root.level, expected: level, candidates: [...blueprints.values()].filter((b) => b.blueprint.level === level).map((b) => b.blueprint.id).sort() };
  throw new BlueprintUseError(problems, wrongLevel);
}

// ---------------------------------------------------------------------------------------
// One file

interface ParsedFile {
  file: string;
  source?: BlueprintSource;
  /** The blueprint's id, when it is valid (even if other parts are not). */
  id?: string;
  /** Set when the file passed the schema and its own graph checks. */
  blueprint?: Blueprint;
  problems: BlueprintProblem[];
  /** A problem at `path` of this file's document. */
  problemAt(path: PathSegment[], message: string, key?: string): BlueprintProblem;
  issueProblem(issue: BlueprintIssue): BlueprintProblem;
}

async function parseBlueprintFile(file: string, source?: BlueprintSource): Promise<ParsedFile> {
  let text: string | undefined;
  let readProblem: string | undefined;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (err) {
    readProblem = describeReadError(err);
  }
  const result = text === undefined ? undefined : parseBlueprintText(text);
  const yaml = result?.yaml;
  const raw = result?.raw;
  const problemAt = (segments: PathSegment[], message: string, key?: string): BlueprintProblem => {
    const pos = yaml ? (key === undefined ? yaml.locate(segments) : yaml.locateKey(segments, key)) : {};
    const full = key === undefined ? segments : [...segments, key];
    const problem: BlueprintProblem = { file, ...pos, message };
    if (full[0] === 'steps' && typeof full[1] === 'number') {
      problem.step = stepLabel(raw, full[1]);
      const field = formatFieldPath(full.slice(2));
      if (field) problem.field = field;
    } else {
      const field = formatFieldPath(full);
      if (field) problem.field = field;
    }
    return problem;
  };
  const parsed: ParsedFile = {
    file,
    source,
    problems: readProblem ? [{ file, message: readProblem }] : [],
    problemAt,
    issueProblem: (issue) => problemAt(issue.path, issue.message),
  };
  if (!result) return parsed;
  const id = BlueprintSchema.shape.id.safeParse(isRecord(raw) ? raw.id : undefined);
  if (id.success) parsed.id = id.data;
  parsed.problems.push(...result.problems.map((p) => (typeof p === 'string' ? { file, message: p } : 'path' in p ? problemAt(p.path, p.message, p.key) : { file, ...p })));
  if (result.blueprint && parsed.problems.length === 0) parsed.blueprint = result.blueprint;
  return parsed;
}

type TextProblem = string | (Position & { message: string }) | { path: PathSegment[]; key?: string; message: string };

/** Parse and check the text of one file; problems by path, positions resolved by the caller. */
function parseBlueprintText(text: string): { yaml?: YamlWithPositions; raw?: unknown; blueprint?: Blueprint; problems: TextProblem[] } {
  const yaml = parseYamlWithPositions(text);
  const { doc } = yaml;
  if (yaml.errors.length > 0) return { problems: yaml.errors.map(({ message, ...pos }) => ({ ...pos, message: `YAML syntax error: ${message}` })) };
  const root = doc.contents;
  if (root === null || isEmptyDocument(doc)) return { problems: ['the file is empty; expected a blueprint: a mapping with id, level and steps'] };
  if (!isMap(root)) {
    return { problems: [{ ...yaml.at(root.range?.[0]), message: `expected a mapping (key: value pairs) at the top level, found ${describeNode(root)}` }] };
  }
  let raw: unknown;
  try {
    raw = doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    return { problems: [{ ...yaml.at(root.range?.[0]), message: `cannot read the YAML: ${err instanceof Error ? err.message : String(err)}` }] };
  }

  const problems: TextProblem[] = [];
  const parsed = BlueprintSchema.safeParse(raw, { reportInput: true });
  if (!parsed.success) {
    for (const issue of parsed.error.issues) {
      const segments = issuePath(issue);
      if (issue.code === 'unrecognized_keys') {
        const known = knownKeys(BlueprintSchema, segments, raw);
        for (const key of issue.keys) {
          const guess = known ? didYouMean(key, known) : undefined;
          problems.push({
            path: segments,
            key,
            message: `unknown key "${key}"${guess ? ` (did you mean "${guess}"?)` : ''}${known ? `; expected one of: ${known.join(', ')}` : ''}`,
          });
        }
        continue;
      }
      const missing = (issue.code === 'invalid_type' || issue.code === 'invalid_value') && !doc.hasIn(segments);
      problems.push({ path: segments, message: describeIssue(issue, missing) });
      // zod checks nothing else of a step whose type is unknown; its id still matters.
      if (issue.code === 'invalid_union' && segments.length === 3 && segments[0] === 'steps' && segments[2] === 'type') {
        const stepPath = segments.slice(0, 2);
        const id = BlueprintSchema.shape.id.safeParse(doc.getIn([...stepPath, 'id']), { reportInput: true });
        if (!id.success) {
          for (const idIssue of id.error.issues) {
            problems.push({ path: [...stepPath, 'id'], message: describeIssue(idIssue, !doc.hasIn([...stepPath, 'id'])) });
          }
        }
      }
    }
    // The graph checks on the parts that are valid, so every problem shows at once.
    for (const issue of validatePartialBlueprint(raw)) problems.push(issue);
    return { yaml, raw, problems };
  }
  for (const issue of validateBlueprint(parsed.data)) problems.push(issue);
  return { yaml, raw, blueprint: parsed.data, problems };
}

// ---------------------------------------------------------------------------------------

async function listYamlFiles(dir: string): Promise<{ files: string[] } | { problem: BlueprintProblem }> {
  let entries;
  try {
    entries = await fs.readdir(dir, { withFileTypes: true });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException | undefined)?.code;
    if (code === 'ENOENT') return { files: [] };
    if (code === 'ENOTDIR') return { problem: { file: dir, message: 'expected a folder of blueprint files, found a file' } };
    return { problem: { file: dir, message: `cannot read the blueprint folder: ${err instanceof Error ? err.message : String(err)}` } };
  }
  const files: string[] = [];
  for (const e of entries) {
    if (!/\.ya?ml$/.test(e.name)) continue;
    const full = path.join(dir, e.name);
    if (e.isFile()) files.push(full);
    else if (e.isSymbolicLink()) {
      const stat = await fs.stat(full).catch(() => undefined);
      if (!stat?.isDirectory()) files.push(full); // a dangling link is reported as unreadable
    }
  }
  return { files: files.sort() };
}

function stepLabel(raw: unknown, index: number): string {
  const steps = isRecord(raw) && Array.isArray(raw.steps) ? raw.steps : [];
  const step: unknown = steps[index];
  const id = BlueprintSchema.shape.id.safeParse(isRecord(step) ? step.id : undefined);
  return id.success ? id.data : `#${index + 1}`;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

function describeReadError(err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'ENOENT') return 'cannot read the blueprint file: no such file';
  if (code === 'EISDIR') return 'cannot read the blueprint file: it is a directory';
  if (code === 'EACCES' || code === 'EPERM') return 'cannot read the blueprint file: permission denied';
  return `cannot read the blueprint file: ${err instanceof Error ? err.message : String(err)}`;
}
