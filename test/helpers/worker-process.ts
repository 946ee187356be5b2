/** A worker in its own process (`slipway worker`), so a test can SIGKILL it like a crashed machine. */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { BIN, waitFor } from './cli';
import { PROJECT_ROOT } from './repo';

export interface WorkerProcess {
  child: ChildProcess;
  output: () => string;
  /** SIGKILL the worker and every process it started (agents and gates run in their own groups). */
  crash(): void;
  stop(): Promise<void>;
}

function descendants(pid: number): number[] {
  let out = '';
  try {
    out = execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8' });
  } catch {
    return [];
  }
  const children = out.split('\n').map((l) => Number(l.trim())).filter((n) => n > 0);
  return children.flatMap((c) => [c, ...descendants(c)]);
}

export async function startWorkerProcess(env: NodeJS.ProcessEnv): Promise<WorkerProcess> {
  let output = '';
  const child = spawn(process.execPath, [BIN, 'worker'], { cwd: PROJECT_ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.on('data', (c) => (output += c));
  child.stderr!.on('data', (c) => (output += c));
  await waitFor(async () => output.includes('worker polling') || (child.exitCode !== null && Promise.reject(new Error(output))), 'the worker process to poll', 120_000);
  return {
    child,
    output: () => output,
    crash() {
      const all = [child.pid!, ...descendants(child.pid!)];
      for (const pid of all.reverse()) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
    },
    async stop() {
      if (child.exitCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    },
  };
}
