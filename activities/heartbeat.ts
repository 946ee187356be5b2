import { Context } from '@temporalio/activity';

/**
 * Heartbeats on a fixed interval while `work` runs, so the server notices a dead worker
 * quickly and the activity learns about cancellation. Returns the cancellation signal to pass
 * to child processes (which kill their process group on abort).
 */
export async function withHeartbeat<T>(
  work: (signal: AbortSignal, beat: (details?: unknown) => void) => Promise<T>,
  intervalMs = 2_000,
): Promise<T> {
  const ctx = Context.current();
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
