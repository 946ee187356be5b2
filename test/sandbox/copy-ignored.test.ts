/**
 * What a cold create copies of the checkout's ignored files: never nested git repositories or
 * worktrees (other tools' worktrees, vendored clones), never the default exclusions, and the
 * rest of a folder that holds one of those still arrives.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { DEFAULT_COPY_EXCLUDES, listIgnoredToCopy } from '../../activities/sandbox/copy-ignored';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { slipway } from '../helpers/cli';
import { exists, gitIn, makeRepo, sandboxRequest, sh, tempDir } from './helpers';

async function write(file: string, content = 'x\n') {
  await fs.mkdir(path.dirname(file), { recursive: true });
  await fs.writeFile(file, content);
}

/** A checkout with dependencies, another tool's worktrees and a vendored clone, all ignored. */
async function crowdedCheckout(): Promise<string> {
  const { repo } = makeRepo(tempDir('copy-nested'));
  await fs.writeFile(path.join(repo, '.gitignore'), 'node_modules/\n.sandcastle/\nvendor/\n.claude/\ntools/\n');
  gitIn(repo, 'add', '.gitignore');
  gitIn(repo, 'commit', '-q', '-m', 'ignore');
  await write(path.join(repo, 'node_modules/pkg/index.js'));
  // Another tool's real git worktree, nested in an ignored folder, with its logs beside it.
  await fs.mkdir(path.join(repo, '.sandcastle'), { recursive: true });
  gitIn(repo, 'worktree', 'add', '-q', '--detach', path.join(repo, '.sandcastle/worktrees/other'), 'HEAD');
  await write(path.join(repo, '.sandcastle/logs/run.log'));
  // A vendored clone (a repository of its own) in an ignored folder that also holds plain files.
  await write(path.join(repo, 'vendor/keep.txt'));
  await write(path.join(repo, 'vendor/lib/src/code.js'));
  sh(path.join(repo, 'vendor/lib'), 'git init -q');
  // A default exclusion without any .git, beside settings that are copied.
  await write(path.join(repo, '.claude/settings.json'), '{}\n');
  await write(path.join(repo, '.claude/worktrees/old/file.txt'));
  // A repository nested deep in an ignored folder.
  await write(path.join(repo, 'tools/a/b/deep/README'));
  sh(path.join(repo, 'tools/a/b/deep'), 'git init -q');
  await write(path.join(repo, 'tools/a/b/sibling.txt'));
  return repo;
}

describe('copying ignored files around nested repositories', () => {
  it('lists the ignored files without nested repositories, worktrees or default exclusions', async () => {
    const repo = await crowdedCheckout();
    const listing = await listIgnoredToCopy(repo);
    expect(listing.paths.sort()).toEqual(['.claude/settings.json', 'node_modules/', 'tools/a/b/sibling.txt', 'vendor/keep.txt']);
    expect(listing.excluded?.sort()).toEqual(['.claude/worktrees/', '.sandcastle/', 'tools/a/b/deep/', 'vendor/lib/']);
    expect(DEFAULT_COPY_EXCLUDES).toContain('.sandcastle/');
  });

  it('a cold create copies exactly that', async () => {
    const repo = await crowdedCheckout();
    const provider = new LocalSandboxProvider({ backgroundFill: false });
    const box = await provider.create(sandboxRequest(repo, 'nested', { copyIgnored: true }));
    try {
      for (const present of ['node_modules/pkg/index.js', 'vendor/keep.txt', '.claude/settings.json', 'tools/a/b/sibling.txt']) {
        expect(await exists(path.join(box.root, present)), present).toBe(true);
      }
      for (const absent of ['.sandcastle', 'vendor/lib', '.claude/worktrees', 'tools/a/b/deep']) {
        expect(await exists(path.join(box.root, absent)), absent).toBe(false);
      }
    } finally {
      await provider.destroy({ repository: repo, root: box.root });
    }
  });

  it('`slipway template check` (and its old name `snapshot check`) shows what would be copied, how big, and what is left out', async () => {
    const repo = await crowdedCheckout();
    await write(path.join(repo, 'node_modules/pkg/big.bin'), 'y'.repeat(5000));
    const env = { SLIPWAY_HOME: tempDir('copy-home'), TEMPORAL_ADDRESS: '', SLIPWAY_TEMPORAL_PORT: '1' };
    const json = await slipway(['template', 'check', '--json'], env, repo);
    expect(json.code, json.stderr).toBe(1); // no template yet
    const report = JSON.parse(json.stdout);
    expect(report.state).toBe('missing');
    expect(report.copy.paths).toContainEqual({ path: 'node_modules/', bytes: 2 + 5000 });
    expect(report.copy.paths).toContainEqual({ path: 'vendor/keep.txt', bytes: 2 });
    expect(report.copy.totalBytes).toBe(5002 + 2 + 3 + 2);
    expect(report.copy.excluded.sort()).toEqual(['.claude/worktrees/', '.sandcastle/', 'tools/a/b/deep/', 'vendor/lib/']);
    const text = await slipway(['snapshot', 'check'], env, repo);
    expect(text.stdout).toMatch(/ignored files a cold create copies: 4\.9 KiB in 4 paths/);
    expect(text.stdout).toMatch(/4\.9 KiB +node_modules\//);
    expect(text.stdout).toMatch(/left out[^\n]*\n +\.claude\/worktrees\//);
  });
});
