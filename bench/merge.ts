/**
 * One merge, side by side in one run (ADR 0033): the merge activity (`mergeStream`) by git's
 * plumbing with no merger worktree, by plumbing with a merger worktree that follows the result
 * (post-merge gates), and by `git merge` in the merger worktree (git < 2.38, and every merge
 * before ADR 0033); then making the merger: `prepareMerger` (bare worktree) against the
 * integration branch alone (`prepareObjective` with `withoutMerger`); and a batch of 8 merges
 * (`mergeBatch`) into a merger worktree, by plumbing and by git merge. Each stream head is merged
 * by every variant in turn, in a rotating order, so drift in the machine's speed hits all alike;
 * medians of wall time.
 *   npx tsx bench/merge.ts [--quick] [--files N] [--json]
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createActivities } from '../activities';
import { LocalSandboxProvider, localSandboxRoot } from '../activities/sandbox/local';
import { MERGER_SANDBOX_NAME } from '../core/ids';

const quick = process.argv.includes('--quick');
const json = process.argv.includes('--json');
const filesAt = process.argv.indexOf('--files');
const files = filesAt > 0 ? Number(process.argv[filesAt + 1]) : 2000;
const rounds = quick ? 8 : 24;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const git = (cwd: string, ...args: string[]) => execFileSync('git', ['-C', cwd, '-c', 'user.name=b', '-c', 'user.email=b@b', ...args], { encoding: 'utf8' }).trim();
const ms = async (work: () => Promise<unknown>) => {
  const t = process.hrtime.bigint();
  await work();
  return Number(process.hrtime.bigint() - t) / 1e6;
};

(async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-bench-merge-'));
  process.env.SLIPWAY_HOME = path.join(dir, 'home');
  const repo = path.join(dir, 'repo');
  try {
    execFileSync('git', ['init', '-q', '-b', 'main', repo]);
    execFileSync('sh', ['-c', `mkdir -p src && for i in $(seq 1 ${files}); do echo "line $i" > src/f$i.txt; done`], { cwd: repo });
    git(repo, 'add', '-A');
    git(repo, 'commit', '-q', '-m', 'base');
    const sandboxes = new LocalSandboxProvider({ backgroundFill: false });
    const plumbing = createActivities({ sandboxes });
    const porcelain = createActivities({ sandboxes, mergeTree: false });
    const worktree = async (group: string) =>
      (await sandboxes.create({ sandboxId: group, repository: repo, group, name: MERGER_SANDBOX_NAME, branch: `slipway/${group}/integration`, base: 'main', copyIgnored: false })).root;
    git(repo, 'branch', 'slipway/plain/integration', 'main');
    const variants = [
      { name: 'plumbing, no worktree', mergerPath: localSandboxRoot(repo, 'plain', MERGER_SANDBOX_NAME), activities: plumbing, times: [] as number[] },
      { name: 'plumbing, worktree follows', mergerPath: await worktree('follow'), activities: plumbing, times: [] as number[] },
      { name: 'git merge in the worktree', mergerPath: await worktree('porc'), activities: porcelain, times: [] as number[] },
    ];
    const tips = new Map(variants.map((v) => [v.name, git(repo, 'rev-parse', 'main')]));
    for (let r = 0; r < rounds; r++) {
      // A stream's head: one new file and one changed file, on its own branch from the base.
      git(repo, 'checkout', '-q', '-b', `s${r}`, 'main');
      writeFileSync(path.join(repo, `new${r}.txt`), `${r}\n`);
      writeFileSync(path.join(repo, 'src', `f${r + 1}.txt`), `changed ${r}\n`);
      git(repo, 'add', '-A');
      git(repo, 'commit', '-q', '-m', `s${r}`);
      const headCommit = git(repo, 'rev-parse', 'HEAD');
      git(repo, 'checkout', '-q', 'main');
      for (let i = 0; i < variants.length; i++) {
        const v = variants[(r + i) % variants.length]!;
        let outcome: Awaited<ReturnType<typeof plumbing.mergeStream>> | undefined;
        v.times.push(await ms(async () => (outcome = await v.activities.mergeStream({ mergerPath: v.mergerPath, branch: `s${r}`, headCommit, message: `merge s${r}`, expectedTip: tips.get(v.name) }))));
        if (outcome?.status !== 'merged') throw new Error(`${v.name}: ${JSON.stringify(outcome)}`);
        tips.set(v.name, outcome.commit);
      }
    }
    // A batch of 8 (ADR 0031) into a merger worktree the gates would run in: plumbing (the worktree
    // follows once, after the last merge) against git merge in the worktree.
    const batch = { plumbing: [] as number[], porcelain: [] as number[] };
    for (let r = 0; r < Math.ceil(rounds / 4); r++) {
      const items: Array<{ branch: string; headCommit: string; message: string }> = [];
      for (let i = 0; i < 8; i++) {
        git(repo, 'checkout', '-q', '-b', `b${r}-${i}`, 'main');
        writeFileSync(path.join(repo, `batch${r}-${i}.txt`), `${i}\n`);
        git(repo, 'add', '-A');
        git(repo, 'commit', '-q', '-m', `b${r}-${i}`);
        items.push({ branch: `b${r}-${i}`, headCommit: git(repo, 'rev-parse', 'HEAD'), message: `merge b${r}-${i}` });
        git(repo, 'checkout', '-q', 'main');
      }
      const runs = [
        { into: variants[1]!, times: batch.plumbing },
        { into: variants[2]!, times: batch.porcelain },
      ];
      for (const run of r % 2 ? runs.reverse() : runs) {
        let done: Awaited<ReturnType<typeof plumbing.mergeBatch>> | undefined;
        run.times.push(await ms(async () => (done = await run.into.activities.mergeBatch({ mergerPath: run.into.mergerPath, expectedTip: tips.get(run.into.name), items, gates: [] }))));
        const last = done!.merges.at(-1);
        if (done!.merges.some((m) => m.status !== 'merged') || last?.status !== 'merged') throw new Error(`${run.into.name}: ${JSON.stringify(done)}`);
        tips.set(run.into.name, last.commit);
      }
    }
    // Making the merger of an objective with only git to do: a bare worktree, or the branch alone.
    const prepare = { worktree: [] as number[], alone: [] as number[] };
    for (let r = 0; r < Math.ceil(rounds / 2); r++) {
      const base = git(repo, 'rev-parse', 'main');
      const steps: Array<() => Promise<void>> = [
        async () => void prepare.worktree.push(await ms(() => plumbing.prepareMerger({ objectiveId: `w${r}`, repository: repo, baseCommit: base, bare: true }))),
        async () => void prepare.alone.push(await ms(() => plumbing.prepareObjective({ objectiveId: `a${r}`, repository: repo, baseBranch: 'main', deferMerger: true, withoutMerger: true }))),
      ];
      for (const step of r % 2 ? steps.reverse() : steps) await step();
    }
    const aloneBaseline = await (async () => {
      // prepareObjective's own part (base, claim) without the branch, to tell the branch's cost apart.
      const t: number[] = [];
      for (let r = 0; r < Math.ceil(rounds / 2); r++) t.push(await ms(() => plumbing.prepareObjective({ objectiveId: `d${r}`, repository: repo, baseBranch: 'main', deferMerger: true })));
      return median(t);
    })();
    const result = {
      files,
      rounds,
      mergeMs: Object.fromEntries(variants.map((v) => [v.name, Number(median(v.times).toFixed(1))])),
      batchOf8Ms: { 'plumbing, worktree follows once': Number(median(batch.plumbing).toFixed(1)), 'git merge in the worktree': Number(median(batch.porcelain).toFixed(1)) },
      prepareMs: {
        'prepareMerger (bare worktree)': Number(median(prepare.worktree).toFixed(1)),
        'prepareObjective withoutMerger': Number(median(prepare.alone).toFixed(1)),
        'prepareObjective deferMerger (no branch)': Number(aloneBaseline.toFixed(1)),
      },
    };
    if (json) console.log(JSON.stringify(result));
    else {
      console.log(`one merge into a repository of ${files} files, median of ${rounds} (ms):`);
      const porc = result.mergeMs['git merge in the worktree']!;
      for (const [name, v] of Object.entries(result.mergeMs)) console.log(`  ${name.padEnd(34)} ${String(v).padStart(8)}  (${(v / porc).toFixed(2)}x git merge)`);
      console.log(`a batch of 8 merges into a merger worktree, median of ${Math.ceil(rounds / 4)} (ms):`);
      for (const [name, v] of Object.entries(result.batchOf8Ms)) console.log(`  ${name.padEnd(34)} ${String(v).padStart(8)}`);
      console.log(`making the merger of an objective with only git to do, median of ${Math.ceil(rounds / 2)} (ms):`);
      for (const [name, v] of Object.entries(result.prepareMs)) console.log(`  ${name.padEnd(42)} ${String(v).padStart(8)}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
