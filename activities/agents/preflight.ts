/**
 * What `slipway run` checks about each real agent before it starts anything: the executable is
 * there, and the chosen provider has credentials (names and presence only, never a value). The
 * check runs where `run` runs, which may not be the worker that will start the agent, so every
 * message says "on this machine"; `slipway run --no-agent-checks` skips it for a remote worker.
 * The worker still classifies the same failures as configuration errors when they happen there.
 *
 * Environment: this process's, with `<repository>/.slipway/.env` on top, as the agent gets it.
 */
import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { PROJECT_ENV_FILE, readProjectEnv } from '../../agents/credentials';
import { agentProvider } from '../../agents/registry';
import type { AgentRole } from '../../core/states';
import type { AgentSpec, ObjectiveInput } from '../../core/types';
import { findExecutable } from '../sandbox/bubblewrap';

export interface AgentCheckProblem {
  /** `agents.<role>.<field>`. */
  field: string;
  message: string;
}

function isFile(file: string): boolean {
  try {
    return statSync(file).isFile();
  } catch {
    return false;
  }
}

function readText(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
}

/** Problems of one role's agent on this machine (none for the script provider, whose command is run by a shell). */
export function checkAgent(role: AgentRole, spec: AgentSpec, env: Record<string, string | undefined>, repository: string): AgentCheckProblem[] {
  if (spec.provider === 'script') return [];
  const provider = agentProvider(spec.provider);
  const problems: AgentCheckProblem[] = [];
  const label = `the ${role} agent (${spec.provider})`;

  const { command } = provider.buildCommand({ role, spec, prompt: '', cwd: repository, env: {} });
  const found = command.includes('/') ? (path.isAbsolute(command) ? findExecutable(command) : undefined) : findExecutable(command, env.PATH ?? '');
  if (!found || !isFile(found)) {
    const where = command.includes('/') ? (path.isAbsolute(command) ? `"${command}" does not exist or is not executable` : `"${command}" is a relative path; give an absolute one`) : `"${command}" is not on PATH`;
    problems.push({
      field: `agents.${role}.command`,
      message: `${label}: ${where} on this machine; install it there (and on the worker), or set agents.${role}.command to its absolute path`,
    });
  }

  const home = env.HOME || '/';
  const sources = provider.credentialSources?.(spec, { env, home, readText });
  if (sources && !sources.keyless && !sources.env.some((name) => env[name]) && !sources.files.some(isFile)) {
    const names = sources.env.length === 1 ? `${sources.env[0]} is not set` : `none of ${sources.env.join(', ')} is set`;
    const shown = sources.files.map((f) => (f.startsWith(`${home}/`) ? `~/${path.relative(home, f)}` : f));
    const files = shown.length === 1 ? `${shown[0]} does not exist` : `none of ${shown.join(', ')} exists`;
    problems.push({
      field: `agents.${role}.provider`,
      message:
        `${label} has no credentials on this machine: ${names} (in the environment or ${path.join(repository, PROJECT_ENV_FILE)})${shown.length ? ` and ${files}` : ''}. ` +
        `${provider.setupHint ? `${provider.setupHint}. ` : ''}The worker that runs the agent needs them too; when that is another machine, skip this check with --no-agent-checks.`,
    });
  }
  return problems;
}

/** Every role's problems, for `slipway run`. */
export async function checkAgentsOnThisMachine(input: Pick<ObjectiveInput, 'agents' | 'repository' | 'remote'>, baseEnv: NodeJS.ProcessEnv = process.env): Promise<AgentCheckProblem[]> {
  // A remote has no checkout here (its clone is the worker's, ADR 0028): this machine's environment only.
  const env = { ...baseEnv, ...(input.remote ? {} : await readProjectEnv(input.repository)) };
  return Object.entries(input.agents).flatMap(([role, spec]) => (spec ? checkAgent(role as AgentRole, spec, env, input.repository) : []));
}
