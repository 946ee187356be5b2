/**
 * Objectives whose repository is a remote (here a local bare repository, by `file://` URL and by
 * plain path; no network in tests, so https/ssh are covered only by the pure classification in
 * test/remote-repository.test.ts): Slipway works on its own clone and pushes the integration
 * branch back, leaving the remote's other refs as they were.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, realpathSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import { objectiveWorkflow } from '../workflows/objective';
import { DEMO_DIR, gitIn, makeDemoRepo } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

let worker: TestWorker;
const previousHome = process.env.SLIPWAY_HOME;
beforeAll(async () => {
  process.env.SLIPWAY_HOME = realpathSync(mkdtempSync(path.join(os.tmpdir(), 'slipway-remote-home-')));
  worker = await startTestWorker();
});
afterAll(async () => {
  await worker?.stop();
  if (previousHome === undefined) delete process.env.SLIPWAY_HOME;
  else process.env.SLIPWAY_HOME = previousHome;
});

function bareRemote(): string {
  const checkout = makeDemoRepo();
  const bare = path.join(realpathSync(mkdtempSync(path.join(os.tmpdir(), 'slipway-remote-'))), 'remote.git');
  execFileSync('git', ['clone', '-q', '--bare', checkout, bare]);
  // Refs Slipway must leave alone.
  gitIn(bare, 'branch', 'other', 'main');
  gitIn(bare, 'tag', 'v1', 'main');
  return bare;
}

const refs = (bare: string) => gitIn(bare, 'for-each-ref', '--format=%(refname) %(objectname)');

describe('objective on a remote repository', () => {
  for (const form of ['file:// URL', 'plain path'] as const) {
    it(`completes on a bare repository given as a ${form} and pushes only the integration branch`, async () => {
      const bare = bareRemote();
      const before = refs(bare);
      const id = form === 'plain path' ? 'remote-path' : 'remote-url';
      const input = await loadObjectiveFile(path.join(DEMO_DIR, 'objective.yaml'), { repository: form === 'plain path' ? bare : `file://${bare}`, id });
      // Downstream works on Slipway's clone, never on the remote itself.
      expect(input.repository.startsWith(path.join(process.env.SLIPWAY_HOME!, 'repositories'))).toBe(true);

      const result = await worker.client.workflow.execute(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });

      expect(result.outcome).toBe('completed');
      expect(result.error).toBeUndefined();
      const branch = integrationBranch(id);
      expect(gitIn(bare, 'rev-parse', `refs/heads/${branch}`)).toBe(result.integrationHead);
      expect(gitIn(bare, 'cat-file', '-t', `${branch}:src/clamp.js`)).toBe('blob');
      // Every ref the remote had is unchanged; the integration branch is the only new one.
      const after = refs(bare).split('\n');
      expect(after.filter((l) => !l.startsWith(`refs/heads/${branch} `)).join('\n')).toBe(before);
      expect(gitIn(bare, 'for-each-ref', '--format=%(refname)', 'refs/heads/slipway/')).toBe(`refs/heads/${branch}`);
    });
  }
});
