/**
 * Interactive processes in a sandbox (shells, terminals, streaming exec): the provider
 * primitive under `slipway sandbox shell`, the streaming exec API and `slipway attach`.
 *
 * A session is spawned from exactly the same prepared command as `exec` (exec.ts
 * `preparedCommand`: confinement, limits, environment scrubbing, host-path translation), and
 * differs only in keeping its pipes open to the caller. Under a PTY the terminal is allocated
 * *inside* the confinement by script(1) (ADR 0014): Slipway talks to it over pipes only, so no
 * host terminal descriptor ever enters the sandbox (TIOCSTI, and bwrap's --new-session stays).
 *
 *   bwrap ... -- /bin/sh -c CONTROLLER slipway-session <script command>
 *     ├─ script -qfe -E always -c "<initial stty>; exec <command>" /dev/null
 *     └─ resize loop: reads "rows cols" lines on fd 9 (a pipe from Slipway), sets the size of
 *         the terminal script gave the command (found through /proc/self: pids as the mounted
 *         /proc counts them, in or outside a PID namespace) with `stty -F`; the kernel sends
 *         SIGWINCH to the terminal's foreground group
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { Writable, type Readable } from 'node:stream';
import { childEnv, killProcessGroup, signalTree } from '../process';
import { preparedCommand, type ExecTarget } from './exec';
import type { SandboxSession, SessionExit, SessionRequest } from './provider';

/** The descriptor resize requests arrive on, inside the session's wrapper (fixed: past every wrapper's own pipes). */
export const CONTROL_FD = 9;
/** What a terminal sends for the signals a user raises from the keyboard. */
export const TERMINAL_SIGNAL_KEYS: Partial<Record<NodeJS.Signals, string>> = { SIGINT: '\x03', SIGQUIT: '\x1c', SIGTSTP: '\x1a' };
const MAX_TERMINAL_SIDE = 10_000;

/** Bytes after which a terminal's line holds nothing unread, so one ^D typed then ends the input. */
const LINE_DONE = new Set([0x0a, 0x0d, 0x04, ...Object.values(TERMINAL_SIGNAL_KEYS).map((k) => k!.charCodeAt(0))]);

/**
 * A pty session's stdin for every provider: closing it ends the command's input the way a user
 * ends it at a terminal. In canonical mode ^D only delivers a partial line (`printf x | cat`
 * under a terminal would wait for ever), so after one a second ^D is typed. `closeTypesEof`:
 * the transport's own close types one (script(1) does at its input's EOF); otherwise it is typed
 * here. A command reading the terminal raw gets the ^D bytes, as it would from a keyboard.
 */
export function terminalInput(sink: Writable, closeTypesEof: boolean): Writable {
  let midLine = false;
  const input = new Writable({
    write(chunk: Buffer, _e, cb) {
      if (chunk.length > 0) midLine = !LINE_DONE.has(chunk[chunk.length - 1]!);
      sink.write(chunk, () => cb());
    },
    final(cb) {
      const eof = '\x04'.repeat(Number(midLine) + Number(!closeTypesEof));
      if (eof) sink.write(eof);
      sink.end();
      cb();
    },
  });
  input.on('error', () => undefined); // written after the command ended or the input closed
  return input;
}

export class SessionRequestError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SessionRequestError';
  }
}

export function checkSize(cols: unknown, rows: unknown, field = 'pty'): { cols: number; rows: number } {
  for (const [name, v] of [['cols', cols], ['rows', rows]] as const) {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > MAX_TERMINAL_SIDE) {
      throw new SessionRequestError(`${field}.${name} must be an integer from 1 to ${MAX_TERMINAL_SIDE}, got ${JSON.stringify(v)}`);
    }
  }
  return { cols: cols as number, rows: rows as number };
}

/** Single-quotes a word for /bin/sh. */
export function shQuote(word: string): string {
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

// $1: the command line script(1) runs. script waits for any child of its own, so the resize
// loop is script's sibling, not its child; and script runs in the foreground (an asynchronous
// command of a non-interactive shell ignores SIGINT, and so would the command: ^C would not
// reach it). SHELL is /bin/sh for script (it runs `$SHELL -c`); the command gets its own back.
export const CONTROLLER = `
{
  read -r self _ _ parent _ < /proc/self/stat
  while read -r rows cols; do
    n=0
    while [ "$n" -lt 250 ]; do
      child=
      read -r kids < /proc/$parent/task/$parent/children || true
      for k in $kids; do [ "$k" = "$self" ] || { read -r c _ < /proc/$k/task/$k/children; child=$c; } || true; done
      if [ -n "$child" ]; then
        tty=$(readlink /proc/$child/fd/0) && stty -F "$tty" rows "$rows" cols "$cols"
        break
      fi
      n=$((n + 1))
      sleep 0.02
    done
  done
} <&${CONTROL_FD} >/dev/null 2>&1 &
loop=$!
exec ${CONTROL_FD}<&-
[ -n "\${SHELL+x}" ] && export SLIPWAY_PTY_SHELL="$SHELL"
SHELL=/bin/sh script -qfe -E always -c "$1" /dev/null
status=$?
kill "$loop" 2>/dev/null
exit "$status"
`;

export const RESTORE_SHELL = 'if [ -n "${SLIPWAY_PTY_SHELL+x}" ]; then SHELL=$SLIPWAY_PTY_SHELL; export SHELL; unset SLIPWAY_PTY_SHELL; else unset SHELL; fi';

/** What script(1) runs under a PTY: the caller's SHELL back, the initial size, then the command. */
export function terminalCommandLine(inner: string[], pty: { cols: number; rows: number }): string {
  return `${RESTORE_SHELL}; stty rows ${pty.rows} cols ${pty.cols} 2>/dev/null; exec ${inner.map(shQuote).join(' ')}`;
}

export async function openSessionInWorktree(target: ExecTarget, req: SessionRequest): Promise<SandboxSession> {
  if (!req.command) throw new SessionRequestError('command must not be empty');
  const pty = req.pty ? checkSize(req.pty.cols, req.pty.rows) : undefined;
  const inner = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
  const env = pty ? { TERM: 'xterm-256color', ...req.env } : req.env;
  const cmd = await preparedCommand(target, {
    ...req,
    env,
    shell: false,
    ...(pty
      ? {
          command: '/bin/sh',
          args: ['-c', CONTROLLER, 'slipway-session', terminalCommandLine(inner, pty)],
        }
      : { command: inner[0], args: inner.slice(1) }),
  }, pty ? [CONTROL_FD] : []);
  const s = cmd.spawn;
  const stdio: Array<'pipe' | 'ignore'> = ['pipe', 'pipe', 'pipe', ...Array.from({ length: s.extraPipes }, () => 'pipe' as const)];
  if (pty) {
    while (stdio.length < CONTROL_FD) stdio.push('ignore');
    stdio.push('pipe');
  }
  let child: ChildProcess;
  try {
    child = spawn(s.command, s.args, { cwd: s.cwd, env: childEnv(s.pwd ?? s.cwd, s.env), detached: true, stdio });
  } catch (e) {
    await cmd.cleanup?.();
    throw e;
  }
  const spawned = new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', reject);
  });
  let cleaned: Promise<void> | undefined;
  const cleanup = () => (cleaned ??= (cmd.cleanup?.() ?? Promise.resolve()).catch(() => undefined));
  const exit = new Promise<SessionExit>((resolve) => {
    child.once('exit', (exitCode, signal) => {
      // What the command left (in its cgroup, or a daemon in its group) ends with it.
      void cleanup().finally(() => {
        killProcessGroup(child.pid);
        resolve({ exitCode, signal });
      });
    });
    child.once('error', () => void cleanup().finally(() => resolve({ exitCode: null, signal: null })));
  });
  try {
    await spawned;
    await s.prepare?.(child);
  } catch (e) {
    killProcessGroup(child.pid);
    await exit;
    throw e;
  }
  const control = pty ? ((child.stdio as unknown as Array<Writable | null>)[CONTROL_FD] ?? undefined) : undefined;
  return sessionOver(child, {
    pty: pty !== undefined,
    control,
    exit,
    signalOther: (sig) => signalTree(child.pid, sig),
    killAll: () => killProcessGroup(child.pid),
  });
}

/**
 * The SandboxSession over a spawned session wrapper, for every provider: resize requests on its
 * control pipe, keyboard signals typed into the terminal under a pty; how other signals and a
 * kill reach the command is the provider's (a process tree here, the command inside a container).
 */
export function sessionOver(
  child: ChildProcess,
  opts: { pty: boolean; control: Writable | undefined; exit: Promise<SessionExit>; signalOther: (sig: NodeJS.Signals) => void; killAll: () => void },
): SandboxSession {
  const { control, exit } = opts;
  const pipe = child.stdin as Writable;
  pipe.on('error', () => undefined); // the command may exit without reading its input
  // Every wrapper here runs script(1) under a pty, which types one ^D at its input's EOF.
  const stdin = opts.pty ? terminalInput(pipe, true) : pipe;
  control?.on('error', () => undefined);
  let exited = false;
  void exit.then(() => {
    exited = true;
    control?.destroy();
  });
  return {
    pid: child.pid,
    pty: opts.pty,
    stdin,
    stdout: child.stdout as Readable,
    stderr: child.stderr as Readable,
    exit,
    resize(cols: number, rows: number) {
      if (!control) throw new SessionRequestError('resize needs a session with a pty');
      const size = checkSize(cols, rows, 'resize');
      if (!exited) control.write(`${size.rows} ${size.cols}\n`);
    },
    signal(sig: NodeJS.Signals) {
      if (exited) return;
      // Under a terminal, keyboard signals go where a terminal sends them: its foreground group.
      const key = opts.pty ? TERMINAL_SIGNAL_KEYS[sig] : undefined;
      if (key) stdin.write(key);
      else opts.signalOther(sig);
    },
    kill() {
      if (!exited) opts.killAll();
    },
  };
}
