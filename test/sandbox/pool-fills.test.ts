/**
 * PoolFills: one refill per key at a time; one asked for while a pass runs makes exactly one
 * more pass after it (the running pass counted the pool before the latest claims), never two at
 * once and never none. A pure unit: passes are gated by hand, no clock.
 */
import { describe, expect, it } from 'vitest';
import { PoolFills } from '../../activities/sandbox/pool-fills';

/** A fill whose passes each wait until released; records how many run at once. */
function gatedFill() {
  const gates: Array<() => void> = [];
  let running = 0;
  let most = 0;
  let passes = 0;
  const fill = async () => {
    passes += 1;
    running += 1;
    most = Math.max(most, running);
    await new Promise<void>((r) => gates.push(r));
    running -= 1;
    return 1;
  };
  const waitForPass = async (n: number) => {
    while (gates.length < n) await new Promise((r) => setImmediate(r));
  };
  return { fill, gates, waitForPass, stats: () => ({ passes, most }) };
}

describe('PoolFills', () => {
  it.each([
    ['nothing asked meanwhile: one pass', 0, 1],
    ['one asked meanwhile: one more pass', 1, 2],
    ['three asked meanwhile: still one more pass', 3, 2],
  ])('%s', async (_name, meanwhile, passes) => {
    const fills = new PoolFills();
    const g = gatedFill();
    const first = fills.run('k', g.fill);
    await g.waitForPass(1);
    const later = Array.from({ length: meanwhile }, () => fills.run('k', g.fill));
    g.gates[0]!();
    if (passes > 1) {
      await g.waitForPass(2);
      g.gates[1]!();
    }
    expect(await first).toBe(passes);
    for (const l of later) expect(await l).toBe(passes);
    expect(g.stats()).toEqual({ passes, most: 1 });
  });

  it('keys are independent; whenIdle waits for every one; a failed pass rejects and ends its key', async () => {
    const fills = new PoolFills();
    const a = gatedFill();
    const b = gatedFill();
    const ra = fills.run('a', a.fill);
    const rb = fills.run('b', b.fill);
    await a.waitForPass(1);
    await b.waitForPass(1);
    expect(a.stats().most + b.stats().most).toBe(2);
    let idle = false;
    const whenIdle = fills.whenIdle().then(() => (idle = true));
    a.gates[0]!();
    expect(await ra).toBe(1);
    expect(idle).toBe(false);
    b.gates[0]!();
    await whenIdle;
    expect(await rb).toBe(1);

    const failing = fills.run('a', async () => {
      throw new Error('no pods');
    });
    await expect(failing).rejects.toThrow('no pods');
    // The key is free again: the next run starts a pass of its own.
    expect(await fills.run('a', async () => 3)).toBe(3);
  });
});
