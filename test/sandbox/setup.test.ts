/**
 * Project setup on local sandboxes: commands once after creation, verify after, retries, the
 * failure with its output, confinement of setup commands, and the sandbox_failure a stream sees.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApplicationFailure } from '@temporalio/common';
import { findExecutable } from '../../activities/sandbox/bubblewrap';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { sandboxFailure } from '../../activities/sandbox/objective-sandboxes';
import type { SandboxCreateRequest } from '../../activities/sandbox/provider';
import { SandboxSetupError } from '../../activities/sandbox/setup';
import { exists, gitIn, makeRepo, sandboxRequest, snapshotCheckout, tempDir } from './helpers';

const hasBwrap = findExecutable('bwrap') !== undefined;

let parent: string;
let repo: string;
let counters: string;
let before: Record<string, string>;
const provider = new LocalSandboxProvider();
const req = (label: string, extra: Partial<SandboxCreateRequest> = {}) => sandboxRequest(repo, label, { group: 'setup', ...extra });
const lines = async (file: string) => (await fs.readFile(file, 'utf8').catch(() => '')).split('\n').filter(Boolean);

beforeAll(async () => {
  parent = tempDir('setup');
  ({ repo } = makeRepo(parent));
  counters = path.join(parent, 'counters');
  await fs.mkdir(counters);
  before = await snapshotCheckout(repo);
});
afterAll(async () => {
  await fs.rm(parent, { recursive: true, force: true });
});

describe('project setup', () => {
  it('runs the commands once after creation, then verify, in the worktree; a reused sandbox runs nothing', async () => {
    const log = path.join(counters, 'once.log');
    const r = req('once', { setup: { commands: [`echo setup >> ${log}`, 'echo made > made-by-setup.txt'], verify: [`echo verify >> ${log}`, 'test -f made-by-setup.txt'] } });
    const h = await provider.create(r);
    expect(h.setup).toMatchObject({ attempts: 1, commandsRun: 2 });
    expect(await lines(log)).toEqual(['setup', 'verify']);
    expect(await fs.readFile(path.join(h.root, 'made-by-setup.txt'), 'utf8')).toBe('made\n');
    const again = await provider.create(r);
    expect(again.reused).toBe(true);
    expect(await lines(log)).toEqual(['setup', 'verify']);
    await provider.destroy({ repository: repo, root: h.root });
  });

  it('retries setup when verify fails, and succeeds on the second attempt', async () => {
    const log = path.join(counters, 'retry.log');
    // Verify passes only once setup has run twice.
    const h = await provider.create(
      req('retry', { setup: { commands: [`echo run >> ${log}`], verify: [`test "$(wc -l < ${log})" -ge 2`], attempts: 2 } }),
    );
    expect(await lines(log)).toEqual(['run', 'run']);
    expect(h.setup?.attempts).toBe(2);
    await provider.destroy({ repository: repo, root: h.root });
  });

  it('fails with the output after the last attempt; a retried create starts again', async () => {
    const log = path.join(counters, 'fail.log');
    const r = req('fails', { setup: { commands: [`echo run >> ${log}`], verify: ['echo "left-pad is missing" >&2; exit 3'], attempts: 3 } });
    const err = await provider.create(r).catch((e) => e);
    expect(err).toBeInstanceOf(SandboxSetupError);
    expect((err as SandboxSetupError).attempts).toBe(3);
    expect(err.message).toMatch(/project setup failed after 3 attempts/);
    expect(err.message).toContain('verify command `echo "left-pad is missing" >&2; exit 3` exited with 3');
    expect(err.message).toContain('left-pad is missing');
    expect(await lines(log)).toHaveLength(3);
    // The record still says "creating": the next create does everything again rather than reuse it.
    const record = JSON.parse(await fs.readFile(path.join(repo, '.slipway/sandboxes/setup/fails.json'), 'utf8'));
    expect(record.state).toBe('creating');
    await expect(provider.create(r)).rejects.toBeInstanceOf(SandboxSetupError);
    expect(await lines(log)).toHaveLength(6);
    // As a Temporal failure: sandbox_failure, not retried by Temporal (setup already retried), output kept.
    const typed = sandboxFailure(err, 'could not create sandbox setup.fails') as ApplicationFailure;
    expect(typed).toBeInstanceOf(ApplicationFailure);
    expect(typed.type).toBe('sandbox_failure');
    expect(typed.nonRetryable).toBe(true);
    expect(typed.message).toContain('left-pad is missing');
    await provider.destroy({ repository: repo, root: path.join(repo, '.slipway/worktrees/setup/fails') });
  });

  it('a failing setup command counts like a failing check, and a command past its time limit is killed', async () => {
    const failing = await provider.create(req('cmd-fails', { setup: { commands: ['exit 7'], verify: [], attempts: 1 } })).catch((e) => e);
    expect(failing.message).toContain('setup command `exit 7` exited with 7');
    const slow = await provider.create(req('slow', { setup: { commands: ['sleep 30'], verify: [], attempts: 1, timeoutMs: 300 } })).catch((e) => e);
    expect(slow.message).toMatch(/setup command `sleep 30` timed out after 0 s/);
  });

  it('runs setup under the sandbox\'s confinement: writes inside only, no network when off', async () => {
    expect(hasBwrap, 'bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap`').toBe(true);
    // The user's checkout: visible (read-only) inside the sandbox, unlike the rest of /tmp.
    const outside = path.join(repo, 'escape-from-setup.txt');
    const r = req('confined', {
      confinement: { kind: 'bubblewrap', network: false },
      setup: {
        commands: [`(echo escaped > ${outside}) 2>/dev/null; echo inside > setup-inside.txt`],
        verify: ['test -f setup-inside.txt', `test ! -e ${outside}`],
      },
    });
    const h = await provider.create(r);
    expect(await exists(outside)).toBe(false);
    expect(await fs.readFile(path.join(h.root, 'setup-inside.txt'), 'utf8')).toBe('inside\n');
    // Every later exec in the sandbox honours the recorded confinement, even through an unconfined provider.
    const later = await new LocalSandboxProvider().exec(h, { command: `echo again > ${outside}`, shell: true });
    // The write went to the sandbox's private /tmp, if anywhere: never to the host.
    expect(await exists(outside)).toBe(false);
    expect(await exists(outside)).toBe(false);
    await provider.destroy({ repository: repo, root: h.root });
  });

  it("leaves the user's checkout untouched", async () => {
    expect(await snapshotCheckout(repo)).toEqual(before);
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)!.length).toBeGreaterThanOrEqual(1);
  });
});
