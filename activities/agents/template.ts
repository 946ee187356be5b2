/**
 * Prompt templates: `{{KEY}}` arguments and `` !`command` `` expansions.
 *
 * - Arguments come from the built-ins below and the agent's `args`. A key with no value is an
 *   error found when the objective is loaded (config/agent-config.ts), before anything starts.
 * - Expansions are shell commands run inside the sandbox (cwd = sandbox root) before each agent
 *   run; their output (trailing newlines trimmed) takes their place. A `{{KEY}}` inside a command
 *   is replaced by the value quoted for the shell, so no value can inject a command.
 * - One pass over the template: values and command output are inserted as they are, never scanned
 *   again. Gate output or reviewer findings that happen to contain `{{X}}` or `` !`rm -rf .` ``
 *   stay text.
 *
 * Pure apart from the `runCommand` callback; the loader uses it to validate, the agent activity to render.
 */

/** Built-in arguments, available to every template. Fix-loop ones are empty when there is no failure. */
export const BUILTIN_TEMPLATE_KEYS = {
  SOURCE_BRANCH: 'the branch the agent works on (the stream branch)',
  TARGET_BRANCH: "the branch the work is merged into (the objective's integration branch)",
  OBJECTIVE: "the objective's text",
  OBJECTIVE_ID: "the objective's id",
  STREAM: 'the stream id (`plan` for the planner)',
  TASK: "the stream's task (the objective's text for the planner)",
  ITERATION: "the agent run within the step's iteration loop, from 1 to MAX_ITERATIONS",
  MAX_ITERATIONS: "the step's max_iterations",
  FIX_ITERATION: 'how many times the builder step has run for this stream, this run included (1 on the first build)',
  GATE_OUTPUT: 'in a fix loop after a failing gate: the failing gates and their output',
  REVIEW_FEEDBACK: "in a fix loop after a review rejection: the reviewer's summary and findings",
  LEDGER: "the stream's recovery ledger so far, one line per entry",
  GUIDANCE: "a human's guidance sent with `slipway mail send`",
  FEEDBACK: 'any failure sent back to this agent (kind, summary, details): gates, review, merge conflict, rejected plan',
} as const;
export type BuiltinTemplateKey = keyof typeof BUILTIN_TEMPLATE_KEYS;
export const BUILTIN_KEYS = Object.keys(BUILTIN_TEMPLATE_KEYS) as BuiltinTemplateKey[];

/** Keys that carry a failure back to the agent; a template using none of them gets the standard feedback appended. */
export const FEEDBACK_KEYS: BuiltinTemplateKey[] = ['GATE_OUTPUT', 'REVIEW_FEEDBACK', 'LEDGER', 'GUIDANCE', 'FEEDBACK'];

export interface TemplatePosition {
  /** 1-based, within the template text. */
  line: number;
  column: number;
}

type Piece = { kind: 'text'; text: string } | ({ kind: 'key'; key: string } & TemplatePosition);
type Part = Piece | ({ kind: 'command'; pieces: Piece[]; source: string } & TemplatePosition);

export interface ParsedTemplate {
  parts: Part[];
}

const TOKEN = /!`([^`\n]*)`|\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}/g;
const KEY = /\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}/g;

function positionAt(text: string, offset: number): TemplatePosition {
  let line = 1;
  let lineStart = 0;
  for (let i = text.indexOf('\n'); i !== -1 && i < offset; i = text.indexOf('\n', i + 1)) {
    line += 1;
    lineStart = i + 1;
  }
  return { line, column: offset - lineStart + 1 };
}

function pieces(text: string, base: number, whole: string): Piece[] {
  const out: Piece[] = [];
  let last = 0;
  for (const m of text.matchAll(KEY)) {
    if (m.index > last) out.push({ kind: 'text', text: text.slice(last, m.index) });
    out.push({ kind: 'key', key: m[1], ...positionAt(whole, base + m.index) });
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push({ kind: 'text', text: text.slice(last) });
  return out;
}

export function parseTemplate(text: string): ParsedTemplate {
  const parts: Part[] = [];
  let last = 0;
  for (const m of text.matchAll(TOKEN)) {
    if (m.index > last) parts.push({ kind: 'text', text: text.slice(last, m.index) });
    const pos = positionAt(text, m.index);
    if (m[1] !== undefined) parts.push({ kind: 'command', source: m[1], pieces: pieces(m[1], m.index + 2, text), ...pos });
    else parts.push({ kind: 'key', key: m[2], ...pos });
    last = m.index + m[0].length;
  }
  if (last < text.length) parts.push({ kind: 'text', text: text.slice(last) });
  return { parts };
}

/** Every `{{KEY}}` of the template (also inside commands), in order, with its position. */
export function templateKeys(template: ParsedTemplate): Array<{ key: string } & TemplatePosition> {
  const keys: Array<{ key: string } & TemplatePosition> = [];
  for (const part of template.parts) {
    if (part.kind === 'key') keys.push({ key: part.key, line: part.line, column: part.column });
    else if (part.kind === 'command') for (const p of part.pieces) if (p.kind === 'key') keys.push({ key: p.key, line: p.line, column: p.column });
  }
  return keys;
}

/** Every `` !`command` `` of the template, with its position. */
export function templateCommands(template: ParsedTemplate): Array<{ source: string } & TemplatePosition> {
  return template.parts.flatMap((p) => (p.kind === 'command' ? [{ source: p.source, line: p.line, column: p.column }] : []));
}

export interface TemplateProblem extends TemplatePosition {
  message: string;
}

/**
 * Checks a template against the keys it may use: built-ins plus `args`. Reports keys with no
 * value, commands that are empty, and `args` that shadow a built-in. `args` the template does not
 * use are returned separately (the loader reports them at the `args` field).
 */
export function checkTemplate(text: string, args: Record<string, string>): { problems: TemplateProblem[]; unusedArgs: string[] } {
  const template = parseTemplate(text);
  const problems: TemplateProblem[] = [];
  const known = new Set<string>([...BUILTIN_KEYS, ...Object.keys(args)]);
  const used = new Set<string>();
  for (const k of templateKeys(template)) {
    used.add(k.key);
    if (!known.has(k.key)) {
      const near = [...known].find((candidate) => candidate.toLowerCase() === k.key.toLowerCase());
      problems.push({
        line: k.line,
        column: k.column,
        message: `{{${k.key}}} has no value${near ? ` (did you mean {{${near}}}?)` : ''}; give it in "args", or use a built-in: ${BUILTIN_KEYS.join(', ')}`,
      });
    }
  }
  for (const c of templateCommands(template)) {
    if (!c.source.trim()) problems.push({ line: c.line, column: c.column, message: 'empty !`command` expansion' });
  }
  const unusedArgs = Object.keys(args).filter((k) => !used.has(k));
  return { problems, unusedArgs };
}

/** Single quotes for /bin/sh: the value stays one word, nothing in it is interpreted. */
export function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

export class TemplateError extends Error {}

/**
 * Renders a template: keys from `values`, commands through `runCommand` (which returns the
 * command's output or throws). A key without a value throws (the loader should have caught it).
 */
export async function renderTemplate(
  template: ParsedTemplate,
  values: Record<string, string>,
  runCommand: (command: string, at: TemplatePosition) => Promise<string>,
): Promise<string> {
  const value = (key: string, at: TemplatePosition) => {
    if (!Object.hasOwn(values, key)) throw new TemplateError(`line ${at.line}: {{${key}}} has no value`);
    return values[key];
  };
  let out = '';
  for (const part of template.parts) {
    if (part.kind === 'text') out += part.text;
    else if (part.kind === 'key') out += value(part.key, part);
    else {
      const command = part.pieces.map((p) => (p.kind === 'text' ? p.text : shellQuote(value(p.key, p)))).join('');
      out += (await runCommand(command, part)).replace(/\n+$/, '');
    }
  }
  return out;
}
