/**
 * `spec.command` for a real agent: the executable, optionally followed by arguments, split into
 * words the way a POSIX shell would (quotes and backslashes, by shell-quote), but never run
 * through a shell: a shell operator in it is an error, `$NAME` stays literal.
 * `node /opt/fake-agent.mjs --format claude` -> `node` with `['/opt/fake-agent.mjs', '--format', 'claude']`
 * in front of the provider's own arguments. A path with spaces needs quotes: `"/opt/my tools/claude"`.
 * Also the pieces of a real provider's `buildCommand` that every provider shares.
 */
import { parse } from 'shell-quote';
import type { AgentCommand, AgentInvocation } from './provider';

export function splitCommandLine(line: string): string[] {
  const quote = unterminatedQuote(line);
  if (quote) throw new Error(`unterminated ${quote} quote in agent command: ${line}`);
  // `$NAME` stays as written: the command is not run through a shell, so nothing expands.
  const words: string[] = [];
  for (const entry of parse(line, (name) => `$${name}`)) {
    if (typeof entry === 'string') words.push(entry);
    else if ('op' in entry && entry.op === 'glob') words.push((entry as { pattern: string }).pattern);
    else if ('comment' in entry) words.push(`#${entry.comment}`);
    else throw new Error(`agent command contains "${(entry as { op: string }).op}", but it is not run through a shell (use sh -c '...' as the command): ${line}`);
  }
  return words;
}

/** shell-quote parses leniently; an unterminated quote is still a mistake worth naming. */
function unterminatedQuote(line: string): '"' | "'" | undefined {
  let open: '"' | "'" | undefined;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (open === "'") {
      if (c === "'") open = undefined;
    } else if (c === '\\') i++;
    else if (open === '"') {
      if (c === '"') open = undefined;
    } else if (c === '"' || c === "'") open = c;
  }
  return open;
}

/** The executable and leading arguments of a real agent's command line (`spec.command`, else the default). */
export function agentExecutable(command: string | undefined, defaultExecutable: string): { command: string; leadingArgs: string[] } {
  if (command === undefined) return { command: defaultExecutable, leadingArgs: [] };
  const [executable, ...leadingArgs] = splitCommandLine(command);
  if (!executable) throw new Error('the agent command is empty');
  return { command: executable, leadingArgs };
}

/** `{ command, args }` for a provider's built arguments, with `spec.command`'s leading arguments in front. */
export function withExecutable(command: string | undefined, defaultExecutable: string, args: string[]): { command: string; args: string[] } {
  const exe = agentExecutable(command, defaultExecutable);
  return { command: exe.command, args: [...exe.leadingArgs, ...args] };
}

/**
 * A real agent's command: `spec.command` (else `defaultExecutable`) with `args`, the prompt on
 * stdin (never in argv), and `env` (the invocation's by default) when it is not empty.
 */
export function stdinCommand(invocation: AgentInvocation, defaultExecutable: string, args: string[], env: Record<string, string> = invocation.env): AgentCommand {
  return {
    ...withExecutable(invocation.spec.command, defaultExecutable, args),
    stdin: invocation.prompt,
    env: Object.keys(env).length > 0 ? { ...env } : undefined,
  };
}

/** The entry of a provider's `permission_mode` table for `mode` (undefined when no mode is set); an unknown mode throws, naming the known ones. */
export function permissionEntry<T>(agent: string, table: Record<string, T>, mode: string | undefined): T | undefined {
  if (mode === undefined) return undefined;
  const entry = table[mode];
  if (!entry) throw new Error(`${agent} does not know permission_mode "${mode}" (use one of: ${Object.keys(table).join(', ')})`);
  return entry;
}
