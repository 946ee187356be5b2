/**
 * An objective id names branches in the user's repository: a run claims it there, and an id used
 * before (branches or a claim left by an earlier run, on this server or another) is refused
 * instead of silently building on the old branches.
 */
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { claimObjectiveId, objectiveIdInUse } from '../activities/objective-id';
import { testPort } from './helpers/ports';
import { slipway } from './helpers/cli';
import { gitIn, makeTinyRepo, tempDir } from './helpers/repo';

describe('objective id claims', () => {
  it('claims once per run: the same run again is fine, another run or leftover branches are refused', async () => {
    const repo = makeTinyRepo();
    expect(await objectiveIdInUse(repo, 'one')).toBeUndefined();
    await claimObjectiveId(repo, 'one', 'objective:one run-a');
    await claimObjectiveId(repo, 'one', 'objective:one run-a'); // a retried activity
    await expect(claimObjectiveId(repo, 'one', 'objective:one run-b')).rejects.toThrow(/objective id "one" was used before .*refs\/slipway-objectives\/one/);
    expect(await objectiveIdInUse(repo, 'one')).toMatch(/claimed by an earlier run/);

    // Branches of an earlier run without a claim (an older Slipway, another tool) count too.
    gitIn(repo, 'branch', 'slipway/two/integration', 'main');
    await expect(claimObjectiveId(repo, 'two', 'objective:two run-a')).rejects.toThrow(/branches slipway\/two\/integration/);
    // Ids that only share a prefix are different ids.
    await claimObjectiveId(repo, 't', 'objective:t run-a');
    // The claim is a blob naming its run; with branches beside it, both are named.
    expect(gitIn(repo, 'cat-file', 'blob', 'refs/slipway-objectives/t')).toBe('objective:t run-a');
    gitIn(repo, 'branch', 'slipway/t/integration', 'main');
    await expect(claimObjectiveId(repo, 't', 'objective:t run-b')).rejects.toThrow(/claimed by an earlier run \(refs\/slipway-objectives\/t\); branches slipway\/t\/integration\..*git update-ref -d refs\/slipway-objectives\/t; git branch -D slipway\/t\/integration$/);
  });

  it('branches come with the claim, all or nothing: of two racing runs the winner makes them, the loser nothing', async () => {
    const repo = makeTinyRepo();
    const main = gitIn(repo, 'rev-parse', 'main');
    gitIn(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '--allow-empty', '-qm', 'second');
    const second = gitIn(repo, 'rev-parse', 'main');
    const runs = await Promise.allSettled([
      claimObjectiveId(repo, 'race', 'objective:race run-a', [{ name: 'slipway/race/integration', commit: main }]),
      claimObjectiveId(repo, 'race', 'objective:race run-b', Promise.resolve([{ name: 'slipway/race/integration', commit: second }])),
    ]);
    expect(runs.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const winner = runs[0].status === 'fulfilled' ? 'a' : 'b';
    expect(gitIn(repo, 'cat-file', 'blob', 'refs/slipway-objectives/race')).toBe(`objective:race run-${winner}`);
    expect(gitIn(repo, 'rev-parse', 'slipway/race/integration')).toBe(winner === 'a' ? main : second);
    const lost = runs.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect((lost.reason as Error).message).toMatch(/objective id "race" (was claimed by another run at the same time|was used before)/);

    // A retried activity whose claim is there but whose branch is not (made by an older Slipway): made now.
    gitIn(repo, 'branch', '-D', 'slipway/race/integration');
    await claimObjectiveId(repo, 'race', `objective:race run-${winner}`, [{ name: 'slipway/race/integration', commit: main }]);
    expect(gitIn(repo, 'rev-parse', 'slipway/race/integration')).toBe(main);

    // Branches that could not be resolved: that error, and no claim.
    await expect(claimObjectiveId(repo, 'nobase', 'objective:nobase run-a', Promise.reject(new Error('base branch "nope" does not exist')))).rejects.toThrow('base branch "nope" does not exist');
    expect(await objectiveIdInUse(repo, 'nobase')).toBeUndefined();
  });

  it('`slipway run --id` with an id used before: exit 2, says what is in the way, nothing started', async () => {
    const repo = makeTinyRepo();
    gitIn(repo, 'branch', 'slipway/again/integration', 'main');
    gitIn(repo, 'branch', 'slipway/again/a', 'main');
    const file = path.join(tempDir('slipway-id-'), 'objective.yaml');
    writeFileSync(file, stringify({ objective: 'x', repository: repo, agents: { builder: { provider: 'script', command: 'true' } }, streams: [{ id: 'a', task: 'do a' }] }));
    const home = tempDir('slipway-home-');
    const run = await slipway(['run', file, '--id', 'again'], { SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(await testPort()) });
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('objective id "again" was used before');
    expect(run.stderr).toContain('slipway/again/a, slipway/again/integration');
    expect(run.stderr).toContain('--id');
    expect(existsSync(path.join(home, 'temporal.sqlite'))).toBe(false);
    expect(existsSync(path.join(repo, '.slipway', 'worktrees'))).toBe(false);
  });
});
