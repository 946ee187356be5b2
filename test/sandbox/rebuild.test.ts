/**
 * resetOntoIntegration (a stream rebuilt on the integration branch after a conflict) is
 * idempotent: a retry after the reset already happened returns the same previous change.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createActivities } from '../../activities';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { gitIn, makeRepo, tempDir } from './helpers';

describe('resetOntoIntegration', () => {
  let parent: string;
  let repo: string;
  let stream: SandboxHandle;
  const sandboxes = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false });
  const activities = createActivities({ sandboxes });

  beforeAll(async () => {
    parent = tempDir('rebuild');
    ({ repo } = makeRepo(parent));
    stream = await sandboxes.create({ sandboxId: 's', repository: repo, group: 'obj', name: 'one', branch: 'slipway/obj/one', base: 'main' });
  });
  afterAll(async () => {
    await fs.rm(parent, { recursive: true, force: true });
  });

  it('returns the same previous change when retried after the reset', async () => {
    await fs.writeFile(path.join(stream.root, 'feature.txt'), 'the stream intent\n');
    const { head } = await activities.commitWork({ path: stream.root, message: 'feature' });
    // The integration branch moved on meanwhile (another stream merged).
    gitIn(repo, 'branch', 'slipway/obj/integration', 'main');
    const tree = gitIn(repo, 'rev-parse', 'main^{tree}');
    const other = gitIn(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit-tree', tree, '-p', 'main', '-m', 'other stream');
    gitIn(repo, 'update-ref', 'refs/heads/slipway/obj/integration', other);

    const first = await activities.resetOntoIntegration({ path: stream.root, onto: 'slipway/obj/integration' });
    expect(first.head).toBe(other);
    expect(first.previousDiff).toContain('the stream intent');
    expect(gitIn(repo, 'rev-parse', 'slipway/obj/one')).toBe(other);
    // The worker died before reporting: the activity runs again on the reset sandbox.
    const retry = await activities.resetOntoIntegration({ path: stream.root, onto: 'slipway/obj/integration' });
    expect(retry).toEqual(first);
    expect(head).not.toBe(other);
  });
});
