/**
 * Git as the transport (activities/sandbox/git-transport.ts, ADR 0012): attack tests. Every
 * hostile bundle a sandbox could hand back is refused and leaves the repository byte-identical
 * (its refs and every file of its git directory). The producer is a plain host command here: the
 * transport trusts nothing about where the bytes come from. podman.test.ts runs the same
 * transport through real containers.
 */
import { createHash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BundleRefusedError, importBundle, parseBundleHeader } from '../../activities/sandbox/git-transport';
import { gitIn, makeRepo, sh, tempDir } from './helpers';

/** Every file under the repository's git directory, by path, with its content's hash. */
async function gitDirBytes(repo: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const walk = async (dir: string): Promise<void> => {
    for (const e of await fs.readdir(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) await walk(p);
      else out[path.relative(repo, p)] = createHash('sha256').update(await fs.readFile(p)).digest('hex');
    }
  };
  await walk(path.join(repo, '.git'));
  return out;
}

describe('git transport: bundles back from a sandbox', () => {
  let parent: string;
  let repo: string;
  let sandbox: string;
  let first: string;
  let second: string;
  const branch = 'slipway/obj/s1';
  const cat = (file: string) => ({ command: 'cat', args: [file], env: process.env, cwd: parent });

  beforeAll(() => {
    parent = tempDir('transport');
    ({ repo, first, second } = makeRepo(parent));
    gitIn(repo, 'branch', branch, second);
    // The sandbox: a clone of its own, as a container sandbox starts from the base bundle.
    sandbox = path.join(parent, 'sandbox');
    gitIn(parent, 'clone', '-q', '-b', branch, repo, sandbox);
  });

  afterAll(async () => {
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  /** A bundle made in the sandbox clone by `args`, written to a file. */
  const bundle = (name: string, ...args: string[]) => {
    const file = path.join(parent, `${name}.bundle`);
    gitIn(sandbox, 'bundle', 'create', '-q', file, ...args);
    return file;
  };
  const commit = (message: string, file = `${message}.txt`) => {
    sh(sandbox, `printf '%s\\n' '${message}' > '${file}'`);
    gitIn(sandbox, 'add', '-A');
    gitIn(sandbox, 'commit', '-q', '-m', message);
    return gitIn(sandbox, 'rev-parse', 'HEAD');
  };

  async function expectRefused(producer: ReturnType<typeof cat>, pattern: RegExp, opts: { maxBytes?: number } = {}) {
    const before = await gitDirBytes(repo);
    const refs = gitIn(repo, 'for-each-ref');
    const error = await importBundle(repo, producer, { branch, baseCommit: second, ...opts }).then(
      () => undefined,
      (e: Error) => e,
    );
    expect(error, 'the bundle was accepted').toBeInstanceOf(BundleRefusedError);
    expect(error!.message).toMatch(pattern);
    expect(gitIn(repo, 'for-each-ref')).toBe(refs);
    expect(await gitDirBytes(repo)).toEqual(before);
  }

  it('accepts the stream\'s commits and moves only its branch', async () => {
    const head = commit('work');
    const file = bundle('good', 'HEAD', `^${second}`);
    const header = parseBundleHeader(await fs.readFile(file));
    expect(header.prerequisites).toEqual([second]);
    const main = gitIn(repo, 'rev-parse', 'main');
    expect(await importBundle(repo, cat(file), { branch, baseCommit: second })).toEqual({ head });
    expect(gitIn(repo, 'rev-parse', `refs/heads/${branch}`)).toBe(head);
    expect(gitIn(repo, 'rev-parse', 'main')).toBe(main);
    expect(gitIn(repo, 'cat-file', '-p', `${head}:work.txt`)).toBe('work');
    // No quarantine left behind.
    expect((await fs.readdir(path.join(repo, '.git', 'objects'))).filter((n) => n.startsWith('slipway-incoming'))).toEqual([]);
    gitIn(repo, 'fsck', '--strict', '--no-dangling');
  });

  it('refuses a bundle that names another ref (main)', async () => {
    commit('wrong-ref');
    gitIn(sandbox, 'branch', '-f', 'main', 'HEAD');
    await expectRefused(cat(bundle('wrong-ref', 'main', `^${second}`)), /refs\/heads\/main" is neither HEAD/);
  });

  it('refuses a bundle of several refs', async () => {
    gitIn(sandbox, 'branch', '-f', 'extra', 'HEAD');
    await expectRefused(cat(bundle('two-refs', 'HEAD', 'extra', `^${second}`)), /exactly one ref, it carries 2/);
  });

  it('refuses a bundle over the size cap', async () => {
    sh(sandbox, 'head -c 300000 /dev/urandom > big.bin');
    commit('big', 'big.txt');
    await expectRefused(cat(bundle('huge', 'HEAD', `^${second}`)), /exceeds 100000 bytes/, { maxBytes: 100_000 });
  });

  it('refuses work that does not descend from the sandbox\'s base', async () => {
    gitIn(sandbox, 'checkout', '-q', '--orphan', 'unrelated');
    const orphan = commit('orphan');
    expect(orphan).toBeTruthy();
    await expectRefused(cat(bundle('orphan', 'HEAD')), /does not descend from the sandbox's base/);
    gitIn(sandbox, 'checkout', '-q', '-f', branch);
  });

  it('refuses a rewritten history (the base commit amended away)', async () => {
    gitIn(sandbox, 'checkout', '-q', '-B', 'rewritten', first);
    commit('rewrite');
    await expectRefused(cat(bundle('rewritten', 'HEAD', `^${first}`)), /does not descend/);
    gitIn(sandbox, 'checkout', '-q', '-f', branch);
  });

  it('refuses a bundle whose prerequisites the repository lacks', async () => {
    const local = commit('only-in-sandbox');
    commit('on-top');
    await expectRefused(cat(bundle('missing-prereq', 'HEAD', `^${local}`)), new RegExp(`needs commit ${local}`));
  });

  it('refuses bytes that are not a bundle, and a truncated pack', async () => {
    const junk = path.join(parent, 'junk');
    await fs.writeFile(junk, 'hello, I am a bundle\n\nPACK');
    await expectRefused(cat(junk), /not a git bundle/);
    const good = await fs.readFile(bundle('to-truncate', 'HEAD', `^${second}`));
    const cut = path.join(parent, 'cut.bundle');
    await fs.writeFile(cut, good.subarray(0, good.length - 30));
    await expectRefused(cat(cut), /index-pack refused/);
  });

  it('refuses a header that names a head its pack does not carry', async () => {
    const real = await fs.readFile(bundle('lying', 'HEAD', `^${second}`));
    const header = parseBundleHeader(real);
    const fake = Buffer.concat([Buffer.from(`# v2 git bundle\n-${second} x\n${'e'.repeat(40)} HEAD\n\n`), real.subarray(header.packOffset)]);
    const file = path.join(parent, 'lying-header.bundle');
    await fs.writeFile(file, fake);
    await expectRefused(cat(file), /is not a commit it carries/);
  });

  it('refuses a header with an unknown capability (a filtered, partial bundle)', async () => {
    const file = path.join(parent, 'filtered.bundle');
    await fs.writeFile(file, `# v3 git bundle\n@filter=blob:none\n${second} HEAD\n\n`);
    await expectRefused(cat(file), /unknown capability/);
  });

  it('fails when the producer fails, and leaves nothing', async () => {
    const before = await gitDirBytes(repo);
    const producer = { command: 'sh', args: ['-c', 'printf "# v2 git bundle\\n"; exit 3'], env: process.env, cwd: parent };
    await expect(importBundle(repo, producer, { branch, baseCommit: second })).rejects.toThrow(/exit 3/);
    expect(await gitDirBytes(repo)).toEqual(before);
  });
});
