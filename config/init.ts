/**
 * What `slipway init` writes into a repository, worked out from the repository itself: the
 * package manager (from its lock file), gates from the project's own scripts (test, lint,
 * typecheck), and agents per role. Pure apart from reading package.json and listing lock files;
 * the CLI writes the files (cli/commands/init.ts).
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { stringify } from 'yaml';
import { AGENT_PROVIDERS, type AgentProviderKind } from '../core/objective-schema';
import { PROJECT_CONFIG_FILE } from './agent-config';

export type PackageManager = 'npm' | 'pnpm' | 'yarn' | 'bun';

/** Lock file -> package manager, first match wins (a repository with two keeps the first). */
export const LOCK_FILES: Array<[string, PackageManager]> = [
  ['pnpm-lock.yaml', 'pnpm'],
  ['yarn.lock', 'yarn'],
  ['bun.lock', 'bun'],
  ['bun.lockb', 'bun'],
  ['package-lock.json', 'npm'],
  ['npm-shrinkwrap.json', 'npm'],
];

/** The scripts that become gates, by gate name, in order; the first script name present wins. */
export const GATE_SCRIPTS: Array<[string, string[]]> = [
  ['typecheck', ['typecheck', 'type-check', 'tsc', 'check-types']],
  ['lint', ['lint']],
  ['test', ['test']],
];

export const EXAMPLE_OBJECTIVE_FILE = path.join('.slipway', 'objectives', 'example.yaml');

export interface Gate {
  name: string;
  command: string;
}

export interface InitPlan {
  packageManager?: PackageManager;
  gates: Gate[];
  agents: { builder: AgentProviderKind; reviewer: AgentProviderKind };
  files: Array<{ path: string; content: string }>;
}

export class InitError extends Error {}

export function detectPackageManager(repository: string): PackageManager | undefined {
  for (const [file, pm] of LOCK_FILES) if (existsSync(path.join(repository, file))) return pm;
  return existsSync(path.join(repository, 'package.json')) ? 'npm' : undefined;
}

export function runScriptCommand(pm: PackageManager, script: string): string {
  return pm === 'npm' ? (script === 'test' ? 'npm test' : `npm run ${script}`) : `${pm} run ${script}`;
}

export function detectGates(repository: string, pm: PackageManager | undefined): Gate[] {
  if (!pm) return [];
  const file = path.join(repository, 'package.json');
  let scripts: Record<string, unknown> = {};
  try {
    const parsed = JSON.parse(readFileSync(file, 'utf8')) as { scripts?: Record<string, unknown> };
    scripts = parsed.scripts && typeof parsed.scripts === 'object' ? parsed.scripts : {};
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw new InitError(`${file}: cannot read it: ${(e as Error).message}`);
  }
  const gates: Gate[] = [];
  for (const [name, candidates] of GATE_SCRIPTS) {
    const script = candidates.find((s) => typeof scripts[s] === 'string');
    // npm's placeholder test script fails on purpose; it is no gate.
    if (!script || /no test specified/.test(String(scripts[script]))) continue;
    gates.push({ name, command: runScriptCommand(pm, script) });
  }
  return gates;
}

/** `--gate name=command`, each checked; the error names the flag and the value's problem. */
export function parseGateFlag(value: string): Gate {
  const at = value.indexOf('=');
  const name = at > 0 ? value.slice(0, at).trim() : '';
  const command = at > 0 ? value.slice(at + 1).trim() : '';
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(name) || command === '') throw new InitError(`--gate "${value}": expected name=command, e.g. --gate "test=npm test"`);
  return { name, command };
}

export function parseAgentFlag(value: string): AgentProviderKind {
  const usable = AGENT_PROVIDERS.filter((p) => p !== 'script');
  if (!(usable as readonly string[]).includes(value)) throw new InitError(`--agent "${value}": expected one of ${usable.join(', ')}`);
  return value as AgentProviderKind;
}

export function planInit(repository: string, opts: { agents?: string[]; gates?: string[] } = {}): InitPlan {
  const packageManager = detectPackageManager(repository);
  const gates = opts.gates && opts.gates.length > 0 ? opts.gates.map(parseGateFlag) : detectGates(repository, packageManager);
  const names = new Set<string>();
  for (const g of gates) {
    if (names.has(g.name)) throw new InitError(`--gate: "${g.name}" is given twice`);
    names.add(g.name);
  }
  // One --agent: every role; two: builder, then reviewer.
  const chosen = (opts.agents ?? []).map(parseAgentFlag);
  if (chosen.length > 2) throw new InitError('--agent: at most two (builder, then reviewer)');
  const agents = { builder: chosen[0] ?? 'claude-code', reviewer: chosen[1] ?? chosen[0] ?? 'claude-code' };
  const config = [
    '# Slipway project defaults (README: .slipway/config.yaml). Objectives may leave `agents:` out',
    '# and get these, once you run `slipway trust` here.',
    stringify({ agents: { builder: { provider: agents.builder }, reviewer: { provider: agents.reviewer } } }),
  ].join('\n');
  const objective = [
    '# An example objective: edit the task, then `slipway run .slipway/objectives/example.yaml`.',
    stringify({
      objective: 'Describe the outcome you want',
      repository: '../..',
      ...(gates.length > 0 ? { gates: gates.map((g) => ({ name: g.name, command: g.command, timeout_seconds: 600 })) } : {}),
      agents: { builder: { provider: agents.builder }, reviewer: { provider: agents.reviewer } },
      streams: [{ id: 'example', task: 'Describe one change a builder agent should make, with how to check it' }],
    }),
  ].join('\n');
  return {
    packageManager,
    gates,
    agents,
    files: [
      { path: PROJECT_CONFIG_FILE, content: config },
      { path: EXAMPLE_OBJECTIVE_FILE, content: objective },
    ],
  };
}
