import { Context } from '@temporalio/activity';

/**
 * Heartbeats on a fixed interval while `work` runs, so the server notices a dead worker
 * quickly and the activity learns about cancellation. Returns the cancellation signal to pass
 * to child processes (which kill their process group on abort). Outside an activity (the CLI,
 * tests) `work` simply runs, with no signal. The SDK throttles what `beat` sends.
 */
export async function withHeartbeat<T>(
  work: (signal: AbortSignal | undefined, beat: (details?: unknown) => void) => Promise<T>,
  intervalMs = 2_000,
): Promise<T> {
  const ctx = activityContext();
  if (!ctx) return work(undefined, () => undefined);
  let latest: unknown;
  const beat = (details?: unknown) => {
    latest = details;
    ctx.heartbeat(details);
  };
  const timer = setInterval(() => ctx.heartbeat(latest), intervalMs);
  try {
    return await work(ctx.cancellationSignal, beat);
  } finally {
    clearInterval(timer);
  }
}

/** The running activity's context; undefined outside an activity (the CLI, tests), where `Context.current()` throws. */
export function activityContext(): Context | undefined {
  try {
    return Context.current();
  } catch {
    return undefined;
  }
}

/** `fn` as an activity that heartbeats while it runs (see withHeartbeat). */
export function heartbeating<A extends unknown[], R>(fn: (...args: A) => Promise<R>): (...args: A) => Promise<R> {
  return (...args: A) => withHeartbeat(() => fn(...args));
}
