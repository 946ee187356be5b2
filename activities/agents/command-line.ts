/**
 * `spec.command` for a real agent: the executable, optionally followed by arguments, split into
 * words the way a POSIX shell would (quotes and backslashes), but never run through a shell.
 * `node /opt/fake-agent.mjs --format claude` -> `node` with `['/opt/fake-agent.mjs', '--format', 'claude']`
 * in front of the provider's own arguments. A path with spaces needs quotes: `"/opt/my tools/claude"`.
 * Also the pieces of a real provider's `buildCommand` that every provider shares.
 */
import type { AgentCommand, AgentInvocation } from './provider';

export function splitCommandLine(line: string): string[] {
  const words: string[] = [];
  let word = '';
  let inWord = false;
  let quote: '"' | "'" | undefined;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote === "'") {
      if (c === "'") quote = undefined;
      else word += c;
    } else if (quote === '"') {
      if (c === '"') quote = undefined;
      else if (c === '\\' && i + 1 < line.length && '"\\$`'.includes(line[i + 1])) word += line[++i];
      else word += c;
    } else if (c === "'" || c === '"') {
      quote = c;
      inWord = true;
    } else if (c === '\\' && i + 1 < line.length) {
      word += line[++i];
      inWord = true;
    } else if (/\s/.test(c)) {
      if (inWord) words.push(word);
      word = '';
      inWord = false;
    } else {
      word += c;
      inWord = true;
    }
  }
  if (quote) throw new Error(`unterminated ${quote} quote in agent command: ${line}`);
  if (inWord) words.push(word);
  return words;
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
