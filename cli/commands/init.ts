/**
 * `slipway init [path]`: sets a repository up (.slipway/config.yaml and an example objective,
 * config/init.ts decides what), keeps Slipway's state out of git as `run` does, and ends with
 * `slipway doctor`'s findings. Non-interactive: every choice has a flag. Everything is checked
 * before the first file is written; an existing setup is kept unless --force.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { InitError, planInit } from '../../config/init';
import { fingerprintRepositoryConfig, trustRepository } from '../../config/trust';
import { ensureSlipwayExcluded, isGitRepository, repositoryRoot } from '../../lib/git';
import { writeFileAtomic } from '../../lib/atomic-write';
import { renderFindings, runDoctor } from '../doctor';
import { CliError, EXIT } from '../exit-codes';

export async function initCommand(dir: string | undefined, opts: { agent?: string[]; gate?: string[]; force?: boolean; yes?: boolean; doctor?: boolean }): Promise<number> {
  const target = path.resolve(dir ?? '.');
  if (!existsSync(target)) throw new CliError(`[path] ${target}: no such folder`);
  if (!(await isGitRepository(target))) throw new CliError(`[path] ${target} is not a git repository (run \`git init\` first)`);
  const repository = await repositoryRoot(target);
  let plan;
  try {
    plan = planInit(repository, { agents: opts.agent, gates: opts.gate });
  } catch (e) {
    if (e instanceof InitError) throw new CliError(e.message);
    throw e;
  }
  const existing = plan.files.filter((f) => existsSync(path.join(repository, f.path)));
  if (existing.length > 0 && !opts.force) {
    throw new CliError(`${repository} is already set up (${existing.map((f) => f.path).join(', ')} exist); --force overwrites them`);
  }
  for (const f of plan.files) await writeFileAtomic(path.join(repository, f.path), f.content, { mkdir: true });
  await ensureSlipwayExcluded(repository);
  // The config was just written by the user's own command, so it is trusted as written; but only
  // when it is all there is: blueprints or prompt files already in the repository could be anyone's.
  const fingerprint = await fingerprintRepositoryConfig(repository);
  const onlyOurs = fingerprint.files.length === 1 && fingerprint.files[0] === path.join(fingerprint.repository, plan.files[0].path);
  if (onlyOurs) await trustRepository(repository);
  const out = [
    `set up ${repository}:`,
    ...plan.files.map((f) => `  wrote ${f.path}`),
    `  package manager: ${plan.packageManager ?? 'none found (no package.json)'}`,
    `  gates: ${plan.gates.length > 0 ? plan.gates.map((g) => `${g.name} (${g.command})`).join(', ') : 'none (add them with --gate name=command)'}`,
    `  agents: builder ${plan.agents.builder}, reviewer ${plan.agents.reviewer}`,
    '  .git/info/exclude keeps Slipway\'s state under .slipway/ out of git',
    onlyOurs
      ? '  trusted .slipway/config.yaml as written (`slipway trust --revoke` undoes it)'
      : '  NOT trusted: .slipway/ holds blueprints or prompt files init did not write; read them, then run `slipway trust`',
    'next: edit the example objective, `slipway dev` in one terminal, then `slipway run .slipway/objectives/example.yaml`',
    '',
  ];
  process.stdout.write(out.join('\n'));
  if (opts.doctor !== false) {
    process.stdout.write('\nslipway doctor:\n');
    process.stdout.write(renderFindings(await runDoctor()));
  }
  return EXIT.ok;
}
