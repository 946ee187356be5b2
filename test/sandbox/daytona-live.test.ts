/**
 * The sandbox contract against real Daytona (ADR 0019). Runs when DAYTONA_API_KEY is set in the
 * environment (DAYTONA_API_URL, DAYTONA_TARGET and DAYTONA_SNAPSHOT optional); skipped otherwise,
 * saying so: the one skip allowed, because it needs credentials, not a tool.
 *
 *   DAYTONA_API_KEY=... npx vitest run test/sandbox/daytona-live.test.ts
 */
import { promises as fs } from 'node:fs';
import { Daytona } from '@daytonaio/sdk';
import { describe, it } from 'vitest';
import { DaytonaSandboxProvider } from '../../activities/sandbox/daytona';
import { describeSandboxContract } from './contract';

const live = !!process.env.DAYTONA_API_KEY;

/** True while a process whose command line holds `marker` runs in any of the suite's Daytona sandboxes. */
async function remoteProcessRunning(marker: string): Promise<boolean> {
  const daytona = new Daytona();
  for await (const s of daytona.list({ labels: { 'slipway.group': 'contract' } })) {
    if (s.state !== 'started') continue;
    const r = await s.process.executeCommand(`/bin/sh -c 'for d in /proc/[0-9]*; do tr "\\000" " " < $d/cmdline 2>/dev/null; echo; done'`);
    if (r.result.includes(marker)) return true;
  }
  return false;
}

if (live) {
  // Processes run remotely: the suite's process check asks the sandbox itself.
  describeSandboxContract('daytona (live)', () => new DaytonaSandboxProvider({ snapshot: process.env.DAYTONA_SNAPSHOT, autoStopMinutes: 15, autoDeleteMinutes: 60 }), {
    processRunning: remoteProcessRunning,
    workspacePath: async (handle) => (JSON.parse(await fs.readFile(`${handle.root}.json`, 'utf8')) as { workspace: string }).workspace,
  });
} else {
  console.warn('daytona (live): skipped, DAYTONA_API_KEY is not set');
  describe('daytona (live)', () => {
    it.skip('skipped: DAYTONA_API_KEY is not set (set it, and optionally DAYTONA_API_URL, DAYTONA_TARGET, DAYTONA_SNAPSHOT, to run the sandbox contract against real Daytona)', () => undefined);
  });
}
