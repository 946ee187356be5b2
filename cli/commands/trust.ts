/**
 * `slipway trust [path]`: lets Slipway use a repository's own `.slipway/config.yaml`, the prompt
 * files it names and `.slipway/blueprints/`, exactly as they are now (config/trust.ts). Any later
 * change needs `slipway trust` again. `--check` only reports; `--revoke` forgets the record.
 */
import path from 'node:path';
import type { Command } from 'commander';
import { isGitRepository, repositoryRoot } from '../../lib/git';
import { checkRepositoryTrust, trustFile, trustRepository, untrustRepository } from '../../config/trust';
import { CliError, EXIT } from '../exit-codes';
import { GROUP_DESCRIPTIONS } from '../verbs';

async function resolveRepository(dir: string): Promise<string> {
  const abs = path.resolve(dir);
  if (!(await isGitRepository(abs))) throw new CliError(`${abs} is not a git repository`);
  const top = await repositoryRoot(abs).catch(() => '');
  if (!top) throw new CliError(`${abs} has no working tree (a bare repository?)`);
  return top;
}

export async function trustCommand(dir: string | undefined, opts: { check?: boolean; revoke?: boolean; json?: boolean }): Promise<number> {
  if (opts.check && opts.revoke) throw new CliError('--check and --revoke exclude each other');
  const repository = await resolveRepository(dir ?? process.cwd());
  const out = (text: string, json: unknown) => process.stdout.write(opts.json ? `${JSON.stringify(json)}\n` : `${text}\n`);

  if (opts.revoke) {
    const removed = await untrustRepository(repository);
    out(removed ? `${repository}: no longer trusted` : `${repository}: was not trusted`, { repository, revoked: removed });
    return EXIT.ok;
  }
  const status = await checkRepositoryTrust(repository);
  const { fingerprint } = status;
  const files = fingerprint.files.map((f) => path.relative(fingerprint.repository, f));
  if (opts.check) {
    const text =
      status.state === 'no-config'
        ? `${fingerprint.repository}: no repository config (nothing to trust)`
        : `${fingerprint.repository}: ${status.state === 'changed' ? 'changed since it was trusted' : status.state} (${files.join(', ')})`;
    out(text, { repository: fingerprint.repository, state: status.state, files, hash: fingerprint.hash });
    return status.state === 'trusted' || status.state === 'no-config' ? EXIT.ok : EXIT.runFailed;
  }
  if (status.state === 'no-config') {
    out(`${fingerprint.repository}: no .slipway/config.yaml or .slipway/blueprints/; nothing to trust`, { repository: fingerprint.repository, state: 'no-config', files: [] });
    return EXIT.ok;
  }
  const recorded = await trustRepository(repository);
  const names = recorded.files.map((f) => path.relative(recorded.repository, f));
  out(
    [`trusted ${recorded.repository} (sha256 ${recorded.hash.slice(0, 16)}…), recorded in ${trustFile()}:`, ...names.map((n) => `  ${n}`), 'Any change to these files needs `slipway trust` again.'].join('\n'),
    { repository: recorded.repository, state: 'trusted', files: names, hash: recorded.hash },
  );
  return EXIT.ok;
}

export function registerTrustCommand(program: Command, setExit: (code: number) => void): void {
  program
    .command('trust')
    .description(GROUP_DESCRIPTIONS.trust)
    .argument('[path]', 'the repository (default: the current directory)')
    .option('--check', 'only report whether the config is trusted (exit 1 when it is not)')
    .option('--revoke', 'forget the trust record')
    .option('--json', 'print JSON')
    .action(async (dir: string | undefined, opts) => setExit(await trustCommand(dir, opts)));
}
