/**
 * Shared by the loaders that read a YAML file, validate it with zod and report every
 * problem as `file:LINE:COL: field: message` (the objective file, blueprints):
 *
 * - parse with positions (`parseYamlWithPositions`), and map a zod path (or a key of a
 *   mapping) back to the line and column of the YAML node it names;
 * - word zod issues for people (`describeIssue`), list the keys a mapping accepts
 *   (`knownKeys`), and sort problems by position.
 *
 * Pure apart from `yaml` and `zod`: no file system access.
 */
import { LineCounter, isCollection, isMap, isScalar, isSeq, parseDocument, type Document, type Node } from 'yaml';
import { z } from 'zod';

export type PathSegment = string | number;

/** 1-based line and column; both absent when unknown. */
export interface Position {
  line?: number;
  column?: number;
}

export interface YamlSyntaxError extends Position {
  message: string;
}

export interface YamlWithPositions {
  doc: Document;
  /** YAML syntax errors, each at its position. Empty when the text parsed. */
  errors: YamlSyntaxError[];
  /** Position of a character offset (empty when the offset is unknown). */
  at(offset: number | undefined): Position;
  /**
   * Position of the node a zod path names. Scalars point at the value; block collections
   * at their key (the `steps:` line); a missing key at its parent mapping.
   */
  locate(segments: readonly PathSegment[]): Position;
  /** Position of `key` in the mapping at `mapPath` (the mapping itself when the key is absent). */
  locateKey(mapPath: readonly PathSegment[], key: string): Position;
}

export function parseYamlWithPositions(text: string): YamlWithPositions {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, prettyErrors: false });
  const at = (offset: number | undefined): Position => {
    if (offset === undefined) return {};
    const { line, col } = lineCounter.linePos(offset);
    return { line, column: col };
  };
  return {
    doc,
    errors: doc.errors.map((e) => ({ ...at(e.pos?.[0]), message: e.message })),
    at,
    locate: (segments) => at(locateOffset(doc, segments)),
    locateKey: (mapPath, key) => at(locateKeyOffset(doc, mapPath, key)),
  };
}

/** True when the document holds nothing (an empty file, or only comments). */
export function isEmptyDocument(doc: Document): boolean {
  const root = doc.contents;
  return root === null || (isScalar(root) && (root.value === null || root.value === undefined));
}

/** `['streams', 1, 'depends_on', 0]` -> `streams[1].depends_on[0]`. */
export function formatFieldPath(segments: readonly PathSegment[]): string {
  let out = '';
  for (const seg of segments) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else out += out === '' ? seg : `.${seg}`;
  }
  return out;
}

/** `file:LINE:COL` (or less, when the position is unknown). */
export function formatPosition(file: string, pos: Position): string {
  let where = file;
  if (pos.line !== undefined) {
    where += `:${pos.line}`;
    if (pos.column !== undefined) where += `:${pos.column}`;
  }
  return where;
}

/** Stable sort by line, then column; problems without a position come first. */
export function sortByPosition<T extends Position>(problems: readonly T[]): T[] {
  return problems
    .map((p, i) => ({ p, i }))
    .sort((a, b) => (a.p.line ?? 0) - (b.p.line ?? 0) || (a.p.column ?? 0) - (b.p.column ?? 0) || a.i - b.i)
    .map(({ p }) => p);
}

/** The zod issue path without symbol segments. */
export function issuePath(issue: { path: readonly PropertyKey[] }): PathSegment[] {
  return issue.path.filter((s): s is PathSegment => typeof s !== 'symbol');
}

// ---------------------------------------------------------------------------------------
// Zod issues -> messages

export type Issue = z.core.$ZodIssue;

/**
 * A zod issue in words. `missing` says the value is absent from the file (so "is
 * required" reads better than "expected a string, got nothing").
 */
export function describeIssue(issue: Issue, missing: boolean): string {
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
      if (missing) return `is required (one of ${issue.values.map((v) => JSON.stringify(v)).join(', ')})`;
      return `must be one of ${issue.values.map((v) => JSON.stringify(v)).join(', ')}, got ${describeValue(issue.input)}`;
    case 'invalid_format':
      return `${describeValue(issue.input)} ${issue.message}`;
    case 'invalid_union': {
      // A discriminated union whose discriminator matched no option: the issue's input is
      // the whole object, its path ends at the discriminator.
      const d = issue as Issue & { note?: string; discriminator?: string; options?: unknown[] };
      if (d.note === 'No matching discriminator' && d.discriminator !== undefined && Array.isArray(d.options)) {
        const choices = d.options.map((v) => JSON.stringify(v)).join(', ');
        const input = issue.input;
        const value = input !== null && typeof input === 'object' ? (input as Record<string, unknown>)[d.discriminator] : undefined;
        return value === undefined ? `is required (one of ${choices})` : `must be one of ${choices}, got ${describeValue(value)}`;
      }
      return issue.message;
    }
    case 'custom':
      // Refinements such as "is reserved (...)" read better with the value in front.
      return issue.message.startsWith('is ') && typeof issue.input === 'string'
        ? `"${issue.input}" ${issue.message}`
        : issue.message;
    default:
      return issue.message;
  }
}

export function expectedName(expected: string): string {
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

export function describeValue(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'an empty value';
  if (typeof value === 'string') return `"${value.length > 40 ? `${value.slice(0, 40)}...` : value}"`;
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  return typeof value;
}

export function describeNode(node: Node): string {
  if (isSeq(node)) return 'a list';
  if (isScalar(node)) return `the value ${describeValue(node.value)}`;
  return 'something else';
}

/**
 * Keys the object schema at `segments` of `root` accepts, for "unknown key" messages.
 * Walks discriminated unions by the discriminator's value in `input` (the parsed YAML).
 */
export function knownKeys(root: z.ZodType, segments: readonly PathSegment[], input?: unknown): string[] | undefined {
  const unwrap = (s: unknown, value: unknown): unknown => {
    let cur = s;
    for (let i = 0; i < 10; i++) {
      if (cur instanceof z.ZodOptional || cur instanceof z.ZodDefault || cur instanceof z.ZodNullable) cur = cur.unwrap();
      else if (cur instanceof z.ZodDiscriminatedUnion) {
        const disc = (cur._zod.def as { discriminator: string }).discriminator;
        const tag = value !== null && typeof value === 'object' ? (value as Record<string, unknown>)[disc] : undefined;
        const option = (cur.options as unknown[]).find((o) => {
          const lit = o instanceof z.ZodObject ? (o.shape as Record<string, unknown>)[disc] : undefined;
          return lit instanceof z.ZodLiteral && lit.values.has(tag as never);
        });
        if (!option) return undefined;
        cur = option;
      } else break;
    }
    return cur;
  };
  const child = (value: unknown, seg: PathSegment): unknown =>
    value !== null && typeof value === 'object' ? (value as Record<PathSegment, unknown>)[seg] : undefined;
  let schema: unknown = root;
  let value = input;
  for (const seg of segments) {
    schema = unwrap(schema, value);
    if (typeof seg === 'number' && schema instanceof z.ZodArray) schema = schema.element;
    else if (typeof seg === 'string' && schema instanceof z.ZodObject) schema = (schema.shape as Record<string, unknown>)[seg];
    else return undefined;
    value = child(value, seg);
  }
  schema = unwrap(schema, value);
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
