/**
 * Refills of a warm pool in this process, one per key at a time. A refill asked for while one
 * runs makes that one run once more when it ends, never a second at once (two would overshoot)
 * and never nothing: the running pass counted the pool before the latest claims, so coalescing
 * into it alone left the pool short until the next create (after 12 concurrent creates the
 * Kubernetes pool never got back to its 4 pods). Shared by every provider with a warm pool.
 */
export class PoolFills {
  private readonly fills = new Map<string, { again: boolean; done: Promise<number> }>();

  /**
   * Runs `fill` for `key` (off the caller's critical path: after the current turn), or marks the
   * running one to pass again. Resolves with what every pass made once the key's passes end;
   * rejects with a pass's error, which ends them (callers in the background catch in `fill`).
   */
  run(key: string, fill: () => Promise<number>): Promise<number> {
    const current = this.fills.get(key);
    if (current) {
      current.again = true;
      return current.done;
    }
    const state = { again: false, done: Promise.resolve(0) };
    state.done = (async () => {
      await new Promise((r) => setImmediate(r));
      let made = 0;
      do {
        state.again = false;
        made += await fill();
      } while (state.again);
      return made;
    })().finally(() => this.fills.delete(key));
    this.fills.set(key, state);
    return state.done;
  }

  /** Settles once no fill runs (tests, benchmarks, shutdown). */
  async whenIdle(): Promise<void> {
    while (this.fills.size > 0) await Promise.allSettled([...this.fills.values()].map((f) => f.done));
  }
}
