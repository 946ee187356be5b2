/**
 * Local sandbox benchmark, on this machine. Builds a repository of realistic size (about 10,000
 * tracked files, and a ~200 MB git-ignored `node_modules` of many small files), then measures,
 * side by side in rounds (each round runs every variant once, so drift hits all alike):
 *
 *   floor        `git worktree add`                                   (the least any worktree costs)
 *   plain copy   `git worktree add` + `cp -R node_modules`            (what simpler tools do)
 *   cold         Slipway create: worktree + ignored files + setup     (goal: within 1.5x plain copy)
 *   warm pool    Slipway create claiming a warm-pool entry            (goal: under 100 ms)
 *   podman       container sandbox create to ready: base bundle, container start, clone inside
 *                (no ignored files, no setup: a container runs project_setup itself; ADR 0012)
 *   podman pool  the same, claiming a running container from the container warm pool (ADR 0025)
 *
 * Then the exec round trip (`true`), local worktree against podman container, interleaved.
 * `--no-podman` leaves the container cases out (they need `npm run setup`'s podman and image).
 *
 * Pool refills happen between measurements and cleanup after each round, untimed; every
 * measurement starts after a `sync`, and each round starts with another variant.
 *
 * Usage: npx tsx bench/sandbox.ts [--quick] [--json] [--rounds N] [--dir PATH] [--keep]
 *   --quick   ~2,000 tracked files, ~40 MB of dependencies (well under a minute)
 *   --rounds  rounds to take the median of (default 3)
 *   --dir     where the fixture lives (default the OS temp folder; its filesystem is what is measured)
 */
import { execFile, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { checkPodman, ContainerSandboxProvider, CONTAINERS_DIR } from '../activities/sandbox/container';
import { drainContainerPool } from '../activities/sandbox/container-pool';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import type { ProjectSetup } from '../activities/sandbox/provider';

const execFileAsync = promisify(execFile);
const argv = process.argv.slice(2);
const quick = argv.includes('--quick');
const asJson = argv.includes('--json');
const keep = argv.includes('--keep');
const withPodman = !argv.includes('--no-podman');
const EXEC_ROUNDS = 15;
const roundsArg = argv.indexOf('--rounds');
const ROUNDS = roundsArg >= 0 ? Number(argv[roundsArg + 1]) : 3;
const dirArg = argv.indexOf('--dir');
const BASE_DIR = dirArg >= 0 ? path.resolve(argv[dirArg + 1]) : os.tmpdir();
const SIZE = quick
  ? { trackedDirs: 40, filesPerDir: 50, packages: 400, filesPerPackage: 10, fileBytes: 10_000 }
  : { trackedDirs: 100, filesPerDir: 100, packages: 2_000, filesPerPackage: 10, fileBytes: 11_000 };
const SETUP: ProjectSetup = { commands: ['echo ready > .setup-done'], verify: ['test -f .setup-done', 'test -d node_modules/pkg-0'] };
const POOL = 2;

const log = (line: string) => {
  if (!asJson) process.stderr.write(`${line}\n`);
};
const git = (cwd: string, ...args: string[]) => execFileSync('git', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
const sync = () => execFileSync('sync');
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

function buildFixture(parent: string): { repo: string; tracked: number; ignoredFiles: number; ignoredBytes: number } {
  const repo = path.join(parent, 'repo');
  mkdirSync(repo);
  git(repo, 'init', '-q', '-b', 'main');
  let tracked = 0;
  for (let d = 0; d < SIZE.trackedDirs; d++) {
    const dir = path.join(repo, 'src', `module-${d}`);
    mkdirSync(dir, { recursive: true });
    for (let f = 0; f < SIZE.filesPerDir; f++) {
      writeFileSync(path.join(dir, `file-${f}.ts`), `// module ${d} file ${f}\nexport const value${f} = ${JSON.stringify(randomBytes(600).toString('base64'))};\n`);
      tracked++;
    }
  }
  writeFileSync(path.join(repo, 'package.json'), '{ "name": "bench", "private": true }\n');
  writeFileSync(path.join(repo, 'package-lock.json'), '{ "lockfileVersion": 3 }\n');
  writeFileSync(path.join(repo, '.gitignore'), 'node_modules/\n.setup-done\n.env\n');
  tracked += 3;
  execFileSync('git', ['add', '-A'], { cwd: repo });
  execFileSync('git', ['-c', 'user.name=bench', '-c', 'user.email=bench@localhost', 'commit', '-q', '-m', 'fixture'], { cwd: repo });
  // The dependency folder: many small files, as in node_modules.
  let ignoredFiles = 0;
  let ignoredBytes = 0;
  const blob = randomBytes(SIZE.fileBytes);
  for (let p = 0; p < SIZE.packages; p++) {
    const dir = path.join(repo, 'node_modules', `pkg-${p}`, 'lib');
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(repo, 'node_modules', `pkg-${p}`, 'package.json'), `{ "name": "pkg-${p}" }\n`);
    for (let f = 1; f < SIZE.filesPerPackage; f++) {
      // Distinct content per file (a flipped byte), like real packages.
      blob[f % blob.length] = (p + f) & 0xff;
      writeFileSync(path.join(dir, `f${f}.js`), blob);
      ignoredBytes += blob.length;
    }
    ignoredFiles += SIZE.filesPerPackage;
  }
  writeFileSync(path.join(repo, '.env'), 'TOKEN=bench\n');
  return { repo, tracked, ignoredFiles, ignoredBytes };
}

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t = process.hrtime.bigint();
  await fn();
  return Number(process.hrtime.bigint() - t) / 1e6;
}

async function main() {
  const parent = realpathSync(mkdtempSync(path.join(BASE_DIR, 'slipway-bench-sandbox-')));
  const started = Date.now();
  log(`building the fixture in ${parent} ...`);
  const fixture = buildFixture(parent);
  const { repo } = fixture;
  sync();
  log(`fixture: ${fixture.tracked} tracked files, node_modules ${fixture.ignoredFiles} files / ${(fixture.ignoredBytes / 1e6).toFixed(0)} MB (${((Date.now() - started) / 1000).toFixed(1)} s)`);

  const provider = new LocalSandboxProvider({ log: (l) => log(l) });
  const podmanCheck = withPodman ? await checkPodman() : undefined;
  if (podmanCheck && !podmanCheck.ok) throw new Error(`podman cannot run here (${podmanCheck.detail}); run \`npm run setup\` or pass --no-podman`);
  const podman = withPodman ? new ContainerSandboxProvider({ engine: 'podman' }) : undefined;
  const scratch = path.join(parent, 'scratch');
  mkdirSync(scratch);
  const results: Record<'floor' | 'plainCopy' | 'cold' | 'warm' | 'podman' | 'podmanPool', number[]> = { floor: [], plainCopy: [], cold: [], warm: [], podman: [], podmanPool: [] };
  const origins: string[] = [];
  let n = 0;

  const removeWorktree = async (root: string) => {
    await execFileAsync('git', ['-C', repo, 'worktree', 'remove', '--force', '--force', root]).catch(() => undefined);
    rmSync(root, { recursive: true, force: true });
  };
  const request = (label: string) => {
    const name = `${label}-${++n}`;
    return { sandboxId: `bench.${name}`, repository: repo, group: 'bench', name, branch: `slipway/bench/${name}`, base: 'main', setup: SETUP };
  };

  // Warm the pool once before the first round (untimed), and the template-free cold path's caches alike.
  await provider.fillWarmPool({ repository: repo, base: 'main', setup: SETUP, size: POOL });
  if (podman) await podman.fillWarmPool({ repository: repo, base: 'main', size: POOL });
  const podmanOrigins: string[] = [];

  type Variant = keyof typeof results;
  const variants: Partial<Record<Variant, (round: number) => Promise<{ ms: number; cleanup: () => Promise<void> }>>> = {
    floor: async (round) => {
      const root = path.join(scratch, `floor-${round}`);
      const ms = await timed(() => execFileAsync('git', ['-C', repo, 'worktree', 'add', '-q', '-b', `bench/floor-${round}`, root, 'main']));
      return { ms, cleanup: () => removeWorktree(root) };
    },
    plainCopy: async (round) => {
      const root = path.join(scratch, `copy-${round}`);
      const ms = await timed(async () => {
        await execFileAsync('git', ['-C', repo, 'worktree', 'add', '-q', '-b', `bench/copy-${round}`, root, 'main']);
        await execFileAsync('cp', ['-R', path.join(repo, 'node_modules'), path.join(root, 'node_modules')]);
      });
      return { ms, cleanup: () => removeWorktree(root) };
    },
    cold: async () => {
      const req = request('cold');
      let origin = '';
      const ms = await timed(async () => {
        origin = (await provider.create(req)).origin ?? '';
      });
      if (origin !== 'cold') throw new Error(`expected a cold create, got ${origin}`);
      return { ms, cleanup: () => provider.destroy({ repository: repo, root: path.join(repo, '.slipway/worktrees/bench', req.name) }) };
    },
    warm: async () => {
      const req = { ...request('warm'), warmPool: POOL };
      let origin = '';
      const ms = await timed(async () => {
        origin = (await provider.create(req)).origin ?? '';
      });
      origins.push(origin);
      return { ms, cleanup: () => provider.destroy({ repository: repo, root: path.join(repo, '.slipway/worktrees/bench', req.name) }) };
    },
    ...(podman
      ? {
          podman: async () => {
            const { setup: _none, ...req } = request('podman');
            let root = '';
            const ms = await timed(async () => {
              root = (await podman.create({ ...req, provider: 'podman' })).root;
            });
            return { ms, cleanup: () => podman.destroy({ repository: repo, root }) };
          },
          podmanPool: async () => {
            const { setup: _none, ...req } = request('podman-pool');
            let root = '';
            let origin = '';
            const ms = await timed(async () => {
              const h = await podman.create({ ...req, provider: 'podman', warmPool: POOL });
              root = h.root;
              origin = h.origin ?? '';
            });
            podmanOrigins.push(origin);
            return { ms, cleanup: () => podman.destroy({ repository: repo, root }) };
          },
        }
      : {}),
  };
  const order = Object.keys(variants) as Variant[];
  for (let round = 1; round <= ROUNDS; round++) {
    // Each round starts with another variant, so writeback of the previous one's files (this
    // disk's main noise) does not always land on the same variant.
    const rotated = [...order.slice((round - 1) % order.length), ...order.slice(0, (round - 1) % order.length)];
    const cleanups: Array<() => Promise<void>> = [];
    for (const name of rotated) {
      // The pool refills in the background after a claim; let it finish, untimed, before measuring anything.
      await provider.whenPoolIdle();
      await podman?.whenPoolIdle();
      sync();
      const { ms, cleanup } = await variants[name]!(round);
      results[name].push(ms);
      cleanups.push(cleanup);
    }
    await provider.whenPoolIdle();
    await podman?.whenPoolIdle();
    for (const cleanup of cleanups) await cleanup();
    log(
      `round ${round}/${ROUNDS} (${rotated.join(', ')}): floor ${results.floor.at(-1)!.toFixed(0)} ms, plain copy ${results.plainCopy.at(-1)!.toFixed(0)} ms, ` +
        `cold ${results.cold.at(-1)!.toFixed(0)} ms, warm ${results.warm.at(-1)!.toFixed(1)} ms (${origins.at(-1)})` +
        (podman ? `, podman ${results.podman.at(-1)!.toFixed(0)} ms, podman pool ${results.podmanPool.at(-1)!.toFixed(0)} ms (${podmanOrigins.at(-1)})` : ''),
    );
  }

  // Exec round trip of `true`: local worktree and podman container, interleaved.
  const exec: { local: number[]; podman: number[] } = { local: [], podman: [] };
  if (podman) {
    const { setup: _none, ...plain } = request('exec');
    const local = await provider.create({ ...plain, copyIgnored: false });
    const boxed = await podman.create({ ...request('exec-podman'), setup: undefined, provider: 'podman' });
    await podman.exec(boxed, { command: 'true' }); // the first exec sweeps a dead worker's leftovers: untimed
    for (let i = 0; i < EXEC_ROUNDS; i++) {
      exec.local.push(await timed(() => provider.exec(local, { command: 'true' })));
      exec.podman.push(await timed(() => podman.exec(boxed, { command: 'true' })));
    }
    await provider.destroy({ repository: repo, root: local.root });
    await podman.destroy({ repository: repo, root: boxed.root });
    log(`exec round trip (median of ${EXEC_ROUNDS}): local ${median(exec.local).toFixed(1)} ms, podman ${median(exec.podman).toFixed(1)} ms`);
  }
  if (origins.some((o) => o !== 'pool')) throw new Error(`a warm create did not come from the pool: ${origins.join(', ')}`);
  if (podmanOrigins.some((o) => o !== 'pool')) throw new Error(`a pooled podman create did not come from the pool: ${podmanOrigins.join(', ')}`);

  const m = Object.fromEntries(Object.entries(results).map(([k, v]) => [k, v.length ? median(v) : NaN])) as Record<keyof typeof results, number>;
  const execMedians = podman ? { local: median(exec.local), podman: median(exec.podman) } : undefined;
  const ratios = {
    coldVsPlainCopy: m.cold / m.plainCopy,
    coldVsFloor: m.cold / m.floor,
    warmVsFloor: m.warm / m.floor,
    plainCopyVsFloor: m.plainCopy / m.floor,
    ...(podman ? { podmanVsCold: m.podman / m.cold, podmanPoolVsPodman: m.podmanPool / m.podman, podmanExecVsLocalExec: execMedians!.podman / execMedians!.local } : {}),
  };
  const goals = { warmUnder100ms: m.warm < 100, coldWithin1_5xPlainCopy: ratios.coldVsPlainCopy <= 1.5 };
  const cpVersion = execFileSync('cp', ['--version'], { encoding: 'utf8' }).split('\n')[0];
  const fsType = (() => {
    try {
      return execFileSync('findmnt', ['-n', '-o', 'FSTYPE', '-T', parent], { encoding: 'utf8' }).trim().split('\n')[0];
    } catch {
      return 'unknown';
    }
  })();
  const report = {
    machine: `${os.cpus().length} cpu ${os.cpus()[0]?.model ?? ''}`.trim(),
    node: process.version,
    filesystem: fsType,
    cp: cpVersion,
    quick,
    rounds: ROUNDS,
    fixture: { trackedFiles: fixture.tracked, ignoredFiles: fixture.ignoredFiles, ignoredMB: Math.round(fixture.ignoredBytes / 1e6) },
    mediansMs: m,
    samplesMs: results,
    ...(execMedians ? { execMediansMs: execMedians, execSamplesMs: exec } : {}),
    ratios,
    goals,
    durationS: Math.round((Date.now() - started) / 1000),
  };
  if (!keep) {
    await provider.whenPoolIdle();
    if (podman) {
      await podman.whenPoolIdle();
      await drainContainerPool(path.join(repo, CONTAINERS_DIR));
    }
    rmSync(parent, { recursive: true, force: true });
  }
  if (asJson) {
    process.stdout.write(`${JSON.stringify(report)}\n`);
    return;
  }
  const row = (label: string, ms: number, note = '') => `  ${label.padEnd(44)} ${ms.toFixed(ms < 100 ? 1 : 0).padStart(8)} ms${note}`;
  process.stdout.write(
    [
      `Slipway local sandbox benchmark (${report.machine}, node ${report.node}, ${fsType}, ${cpVersion}${quick ? ', --quick' : ''})`,
      `fixture: ${fixture.tracked} tracked files, node_modules ${fixture.ignoredFiles} files / ${report.fixture.ignoredMB} MB; median of ${ROUNDS} rounds`,
      row('git worktree add (floor)', m.floor),
      row('git worktree add + cp -R node_modules', m.plainCopy, `   ${ratios.plainCopyVsFloor.toFixed(1)}x floor`),
      row('Slipway cold create (worktree+ignored+setup)', m.cold, `   ${ratios.coldVsPlainCopy.toFixed(2)}x plain copy  (goal <= 1.5x: ${goals.coldWithin1_5xPlainCopy ? 'met' : 'MISSED'})`),
      row('Slipway create from the warm pool', m.warm, `   ${ratios.warmVsFloor.toFixed(2)}x floor  (goal < 100 ms: ${goals.warmUnder100ms ? 'met' : 'MISSED'})`),
      ...(execMedians
        ? [
            row('podman create to ready (bundle, container, clone)', m.podman, `   ${ratios.podmanVsCold!.toFixed(2)}x local cold`),
            row('podman create from the container warm pool', m.podmanPool, `   ${ratios.podmanPoolVsPodman!.toFixed(2)}x podman cold`),
            row('exec round trip, local worktree', execMedians.local),
            row('exec round trip, podman container', execMedians.podman, `   ${ratios.podmanExecVsLocalExec!.toFixed(1)}x local`),
          ]
        : []),
      `total ${report.durationS} s`,
      '',
    ].join('\n'),
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
