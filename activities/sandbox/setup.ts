/**
 * Project setup: `commands` run once after a sandbox is created, `verify` checks after. A
 * failing command or check runs setup again, up to `attempts` times; then the create fails
 * with the output (the stream records `sandbox_failure`).
 */
import type { RunResult } from '../process';
import { tail } from '../process';
import type { ExecRequest, ProjectSetup } from './provider';

export const DEFAULT_SETUP_TIMEOUT_MS = 5 * 60_000;
export const DEFAULT_SETUP_ATTEMPTS = 2;
const OUTPUT_TAIL = 4_000;

export class SandboxSetupError extends Error {
  constructor(
    message: string,
    readonly output: string,
    readonly attempts: number,
  ) {
    super(`${message}\n${output}`);
    this.name = 'SandboxSetupError';
  }
}

export class SandboxCancelledError extends Error {
  constructor(what: string) {
    super(`${what} was cancelled`);
    this.name = 'SandboxCancelledError';
  }
}

export interface SetupResult {
  attempts: number;
  commandsRun: number;
  durationMs: number;
}

type Exec = (req: ExecRequest) => Promise<RunResult>;

/**
 * Runs setup through `exec` (which applies the sandbox's confinement). With `skipFirstCommands`
 * (the sandbox came from a prepared template that already ran them), the first attempt only
 * verifies; commands run when a check fails.
 */
export async function runProjectSetup(
  exec: Exec,
  setup: ProjectSetup,
  opts: { signal?: AbortSignal; onProgress?: (line: string) => void; skipFirstCommands?: boolean } = {},
): Promise<SetupResult> {
  const started = Date.now();
  const attempts = Math.max(1, setup.attempts ?? DEFAULT_SETUP_ATTEMPTS);
  const timeoutMs = setup.timeoutMs ?? DEFAULT_SETUP_TIMEOUT_MS;
  let commandsRun = 0;
  let lastFailure = '';
  let attempt = 0;
  // A template that already ran the commands earns one extra (verify-only) round.
  const rounds = opts.skipFirstCommands ? attempts + 1 : attempts;
  for (let round = 1; round <= rounds; round++) {
    const runCommands = !(opts.skipFirstCommands && round === 1);
    if (runCommands) attempt++;
    const failed = await (async (): Promise<string | undefined> => {
      const steps = [...(runCommands ? setup.commands.map((c) => ({ kind: 'setup', command: c })) : []), ...setup.verify.map((c) => ({ kind: 'verify', command: c }))];
      for (const step of steps) {
        opts.onProgress?.(`${step.kind}: ${step.command}`);
        const run = await exec({
          command: step.command,
          shell: true,
          timeoutMs,
          signal: opts.signal,
          env: { CI: 'true' },
          onLine: (_stream, line) => opts.onProgress?.(line),
        });
        if (step.kind === 'setup') commandsRun++;
        if (run.cancelled) throw new SandboxCancelledError('project setup');
        if (run.exitCode !== 0 || run.timedOut) {
          const how = run.timedOut ? `timed out after ${Math.round(timeoutMs / 1000)} s` : `exited with ${run.exitCode ?? run.signal}`;
          const output = `${run.stdout}${run.stderr ? `\n${run.stderr}` : ''}`.trim();
          return `${step.kind} command \`${step.command}\` ${how}${output ? `:\n${tail(output, OUTPUT_TAIL)}` : ''}`;
        }
      }
      return undefined;
    })();
    if (failed === undefined) return { attempts: Math.max(attempt, 1), commandsRun, durationMs: Date.now() - started };
    lastFailure = failed;
    opts.onProgress?.(`project setup failed (${runCommands ? `attempt ${attempt}/${attempts}` : 'template check'}): ${failed.split('\n')[0]}`);
  }
  throw new SandboxSetupError(`project setup failed after ${attempts} attempt${attempts === 1 ? '' : 's'}; last failure:`, lastFailure, attempts);
}
