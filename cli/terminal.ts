/**
 * The local end of an interactive session (`slipway sandbox shell`, `slipway attach`): this
 * terminal in raw mode, so every key (^C included) goes to the remote terminal and the remote
 * side decides what it means; the window size follows SIGWINCH. Resolves with the remote exit code.
 */
export interface RemoteTerminal {
  write(bytes: Buffer): void;
  resize(cols: number, rows: number): void;
  /** Raised locally when this end is not a terminal (piped input): forwarded as a signal. */
  interrupt(): void;
  /** The exit code of the remote command (128 + n when a signal ended it). */
  exit: Promise<number>;
}

export function terminalSize(): { cols: number; rows: number } {
  return { cols: process.stdout.columns || 80, rows: process.stdout.rows || 24 };
}

export async function runTerminal(remote: RemoteTerminal): Promise<number> {
  const stdin = process.stdin;
  const raw = stdin.isTTY === true;
  if (raw) stdin.setRawMode(true);
  const onData = (d: Buffer) => remote.write(d);
  const onResize = () => {
    const size = terminalSize();
    remote.resize(size.cols, size.rows);
  };
  const onInterrupt = () => remote.interrupt();
  stdin.on('data', onData);
  stdin.resume();
  process.stdout.on('resize', onResize);
  if (!raw) process.on('SIGINT', onInterrupt);
  try {
    return await remote.exit;
  } finally {
    stdin.off('data', onData);
    if (raw) stdin.setRawMode(false);
    stdin.pause();
    process.stdout.off('resize', onResize);
    process.off('SIGINT', onInterrupt);
  }
}

const SIGNAL_NUMBERS: Partial<Record<string, number>> = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGKILL: 9, SIGTERM: 15 };

/** An exit as a shell reports it: the code, or 128 + the signal's number. */
export function exitStatus(exitCode: number | null, signal: string | null): number {
  if (exitCode !== null) return exitCode;
  return 128 + (signal ? (SIGNAL_NUMBERS[signal] ?? 1) : 1);
}
