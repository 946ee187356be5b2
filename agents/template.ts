/**
 * Prompt templates: `{{KEY}}` arguments and `` !`command` `` expansions.
 *
 * - Arguments come from the built-ins below and the agent's `args`. A key with no value is an
 *   error found when the objective is loaded (config/agent-config.ts), before anything starts.
 * - Expansions are shell commands run inside the sandbox (cwd = sandbox root) before each agent
 *   run; their output (trailing newlines trimmed) takes their place. A `{{KEY}}` inside a command
 *   never puts the value into the command text: it becomes a reference to an environment variable
 *   (`SLIPWAY_ARG_<KEY>`) handed to that command, `"${SLIPWAY_ARG_KEY}"` unquoted and
 *   `${SLIPWAY_ARG_KEY}` inside double quotes. The shell expands a variable once and never parses
 *   the result as syntax, so no value (task text, planner output, gate output, review findings)
 *   can run a command. Inside single quotes (or `$'...'`, or arithmetic `$((...))`) a reference
 *   would not expand or would be evaluated, so such a key is rejected when the objective loads.
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
  REBUILD: 'for a reviewer of a stream rebuilt after a merge conflict: the conflict, the earlier change, and that both intents must survive',
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

/**
 * Where a `{{KEY}}` stands inside a command, in shell terms: `plain` (unquoted, also inside
 * `$(...)` or `${...}`), `double` (inside "..."), or, where no value can be passed safely:
 * `literal` (inside '...' or $'...') and `escaped` (right after a backslash), where no reference
 * expands, and `arithmetic` (inside $((...)), where the shell would evaluate the value).
 */
export type ShellContext = 'plain' | 'double' | 'literal' | 'escaped' | 'arithmetic';

type Piece = { kind: 'text'; text: string } | ({ kind: 'key'; key: string; context?: ShellContext } & TemplatePosition);
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
  const lexer = new ShellLexer();
  let last = 0;
  for (const m of text.matchAll(KEY)) {
    if (m.index > last) {
      out.push({ kind: 'text', text: text.slice(last, m.index) });
      lexer.feed(text.slice(last, m.index));
    }
    out.push({ kind: 'key', key: m[1], context: lexer.context(), ...positionAt(whole, base + m.index) });
    // The reference that replaces the key is one complete word part: the quoting state is unchanged.
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push({ kind: 'text', text: text.slice(last) });
  return out;
}

type Frame = 'top' | 'subshell' | 'paren' | 'param' | 'double' | 'single' | 'arithmetic';

/**
 * Just enough of the POSIX shell grammar to know the quoting context at a point of a one-line
 * command: quotes, backslashes, `$(...)`, `${...}`, `$((...))` and parentheses. Commands cannot
 * hold backticks or newlines (the `` !`...` `` syntax ends at either), so there are no
 * backquoted substitutions and no here-documents to follow.
 */
class ShellLexer {
  private stack: Frame[] = ['top'];
  private escaped = false;

  private get top(): Frame {
    return this.stack[this.stack.length - 1];
  }

  feed(text: string): void {
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      const next = text[i + 1];
      const frame = this.top;
      if (this.escaped) {
        this.escaped = false;
        continue;
      }
      if (frame === 'single') {
        if (c === "'") this.stack.pop();
        continue;
      }
      if (c === '\\') {
        this.escaped = true;
        continue;
      }
      if (c === '$' && next === '(' && text[i + 2] === '(') {
        this.stack.push('arithmetic');
        i += 2;
      } else if (c === '$' && next === '(') {
        this.stack.push('subshell');
        i += 1;
      } else if (c === '$' && next === '{') {
        this.stack.push('param');
        i += 1;
      } else if (c === '$' && next === "'" && frame !== 'double') {
        this.stack.push('single'); // $'...' (bash): literal for our purposes
        i += 1;
      } else if (frame === 'double') {
        if (c === '"') this.stack.pop();
      } else if (c === "'") {
        this.stack.push('single');
      } else if (c === '"') {
        this.stack.push('double');
      } else if (c === '(') {
        this.stack.push('paren');
      } else if (c === ')') {
        if (frame === 'arithmetic' && next === ')') {
          this.stack.pop();
          i += 1;
        } else if (frame === 'paren' || frame === 'subshell') this.stack.pop();
      } else if (c === '}' && frame === 'param') {
        this.stack.pop();
      }
    }
  }

  context(): ShellContext {
    // A key right after a backslash would lose the reference's `$`.
    if (this.escaped) return 'escaped';
    for (let i = this.stack.length - 1; i >= 0; i--) {
      const frame = this.stack[i];
      if (frame === 'single') return 'literal';
      if (frame === 'arithmetic') return 'arithmetic';
      if (frame === 'double') return 'double';
      if (frame !== 'param') return 'plain';
    }
    return 'plain';
  }
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

/** Every `{{KEY}}` of the template (also inside commands, with their shell context), in order, with its position. */
export function templateKeys(template: ParsedTemplate): Array<{ key: string; context?: ShellContext } & TemplatePosition> {
  const keys: Array<{ key: string; context?: ShellContext } & TemplatePosition> = [];
  for (const part of template.parts) {
    if (part.kind === 'key') keys.push({ key: part.key, line: part.line, column: part.column });
    else if (part.kind === 'command') {
      for (const p of part.pieces) if (p.kind === 'key') keys.push({ key: p.key, context: p.context, line: p.line, column: p.column });
    }
  }
  return keys;
}

/** The environment variable that carries `{{KEY}}`'s value into a `` !`command` ``. */
export function templateArgVariable(key: string): string {
  return `SLIPWAY_ARG_${key}`;
}

/** Why a key cannot stand where it is in a command, or undefined when it can. */
function contextProblem(key: string, context: ShellContext | undefined): string | undefined {
  if (context === 'literal') {
    return `{{${key}}} is inside single quotes in a !\`command\`, where its value cannot be passed safely; use double quotes ("{{${key}}}") or none: the value arrives as one word either way`;
  }
  if (context === 'escaped') return `{{${key}}} follows a backslash in a !\`command\`, where its value cannot be passed; remove the backslash`;
  if (context === 'arithmetic') return `{{${key}}} is inside $((...)) in a !\`command\`, where the shell would evaluate its value; pass it as a plain argument instead`;
  return undefined;
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
    const misplaced = contextProblem(k.key, k.context);
    if (misplaced) problems.push({ line: k.line, column: k.column, message: misplaced });
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

export class TemplateError extends Error {}

/** NUL cannot travel in an environment variable (and means nothing in a prompt). */
const NUL = new RegExp(String.fromCharCode(0), 'g');

/**
 * Renders a template: keys from `values`, commands through `runCommand` (which returns the
 * command's output or throws). `runCommand` gets, beside the command text, the environment
 * variables that carry the values of the keys the command references; it must pass them to the
 * command. A key without a value throws (the loader should have caught it), and so does a key
 * placed where it cannot be passed safely (single quotes, arithmetic).
 */
export async function renderTemplate(
  template: ParsedTemplate,
  values: Record<string, string>,
  runCommand: (command: string, at: TemplatePosition, env: Record<string, string>) => Promise<string>,
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
      const env: Record<string, string> = {};
      let command = '';
      for (const p of part.pieces) {
        if (p.kind === 'text') {
          command += p.text;
          continue;
        }
        const misplaced = contextProblem(p.key, p.context);
        if (misplaced) throw new TemplateError(`line ${p.line}:${p.column}: ${misplaced}`);
        const name = templateArgVariable(p.key);
        env[name] = value(p.key, p).replace(NUL, '');
        // Braces keep a following letter out of the name; quotes keep the value one word, unglobbed.
        command += p.context === 'double' ? `\${${name}}` : `"\${${name}}"`;
      }
      out += (await runCommand(command, part, env)).replace(/\n+$/, '');
    }
  }
  return out;
}
