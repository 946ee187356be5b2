/**
 * A cancelled or timed-out command with a grace period gets SIGTERM first (an agent saves its
 * session and exits cleanly), then SIGKILL for what is left; under bubblewrap too, which does
 * not forward signals itself.
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { makeRepo, processesWith, tempDir } from './helpers';

const TRAPS = (marker: string, onTerm: string) =>
  `trap '${onTerm}' TERM; echo ready; while :; do sleep 0.05; done # ${marker}`;

for (const confined of [false, true]) {
  describe(`graceful stop (${confined ? 'bubblewrap' : 'unconfined'})`, () => {
    let parent: string;
    let box: SandboxHandle;
    const sandboxes = new LocalSandboxProvider({ ...(confined ? { confinement: { kind: 'bubblewrap' as const, network: false } } : {}), backgroundFill: false });
    beforeAll(async () => {
      parent = tempDir('graceful');
      const { repo } = makeRepo(parent);
      box = await sandboxes.create({ sandboxId: 's', repository: repo, group: 'g', name: 'n', branch: 'slipway/g/n', base: 'main' });
    });
    afterAll(async () => {
      await fs.rm(parent, { recursive: true, force: true });
    });

    const runUntilReady = async (command: string, killGraceMs: number | undefined) => {
      const abort = new AbortController();
      return sandboxes.exec(box, {
        command,
        shell: true,
        signal: abort.signal,
        killGraceMs,
        onLine: (_s, line) => {
          if (line === 'ready') abort.abort();
        },
      });
    };

    it('SIGTERM first: the command cleans up and exits on its own', async () => {
      const marker = `graceful-${confined}-${process.pid}`;
      const r = await runUntilReady(TRAPS(marker, 'echo cleaned > cleaned.txt; exit 0'), 60_000);
      expect(r.cancelled).toBe(true);
      expect(existsSync(path.join(box.root, 'cleaned.txt'))).toBe(true);
      expect(await processesWith(marker)).toEqual([]);
      await fs.rm(path.join(box.root, 'cleaned.txt'));
    });

    it('SIGKILL after the grace period for a command that ignores SIGTERM; no grace: SIGKILL at once', async () => {
      const marker = `stubborn-${confined}-${process.pid}`;
      const r = await runUntilReady(TRAPS(marker, ''), 300);
      expect(r.cancelled).toBe(true);
      expect(await processesWith(marker)).toEqual([]);
      const quick = await runUntilReady(TRAPS(`${marker}-2`, 'echo cleaned > cleaned.txt; exit 0'), undefined);
      expect(quick.cancelled).toBe(true);
      expect(existsSync(path.join(box.root, 'cleaned.txt'))).toBe(false);
    });
  });
}
