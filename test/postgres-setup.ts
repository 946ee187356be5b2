/**
 * A real Postgres for the service tests. With DATABASE_URL set (CI with a service container,
 * a developer's server), tests use it and create one database per test file there. Otherwise
 * a throwaway cluster starts in a temp folder: initdb + pg_ctl from PATH or
 * /usr/lib/postgresql/<version>/bin, run as the `postgres` user when we are root (postgres
 * refuses to run as root), listening on 127.0.0.1 on a free port, fsync off.
 */
import { execFileSync } from 'node:child_process';
import { accessSync, chmodSync, chownSync, constants, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { testPort } from './helpers/ports';

declare module 'vitest' {
  export interface ProvidedContext {
    /** Admin connection URL of the test Postgres ('' when none could be started). */
    postgresUrl: string;
    postgresError: string;
  }
}

function findPgBin(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter).filter(Boolean)) {
    const candidate = path.join(dir, name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      /* next */
    }
  }
  const root = '/usr/lib/postgresql';
  let versions: string[] = [];
  try {
    versions = readdirSync(root).sort((a, b) => Number(b) - Number(a));
  } catch {
    return undefined;
  }
  for (const v of versions) {
    const candidate = path.join(root, v, 'bin', name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      /* next */
    }
  }
  return undefined;
}

const DIR_PREFIX = 'slipway-test-pg-';

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
};

/**
 * A test run killed before its teardown (Ctrl-C, a closed pipe) leaves its cluster running.
 * Each cluster's folder names the vitest process that owns it; clusters whose owner is gone
 * are stopped and removed here. Clusters of runs still going are left alone.
 */
function stopAbandonedClusters(pgCtl: string): void {
  for (const name of readdirSync(os.tmpdir())) {
    if (!name.startsWith(DIR_PREFIX)) continue;
    const dir = path.join(os.tmpdir(), name);
    let owner: number;
    try {
      owner = Number(readFileSync(path.join(dir, 'owner.pid'), 'utf8').trim());
    } catch {
      continue; // not ours to judge
    }
    if (!owner || alive(owner)) continue;
    try {
      const uid = statSync(dir).uid;
      const user = process.getuid?.() === 0 && uid !== 0 ? ['-u', userNameOf(uid), '--'] : [];
      execFileSync(user.length ? 'runuser' : pgCtl, user.length ? [...user, pgCtl, '-D', path.join(dir, 'data'), '-m', 'immediate', 'stop'] : ['-D', path.join(dir, 'data'), '-m', 'immediate', 'stop'], { stdio: 'ignore' });
    } catch {
      /* not running */
    }
    rmSync(dir, { recursive: true, force: true });
  }
}

function userNameOf(uid: number): string {
  return execFileSync('id', ['-nu', String(uid)], { encoding: 'utf8' }).trim();
}

let dataDir: string | undefined;
let pgCtl: string | undefined;
let asUser: string[] = [];

function run(cmd: string, args: string[]): string {
  return execFileSync(asUser.length ? 'runuser' : cmd, asUser.length ? [...asUser, cmd, ...args] : args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

export async function setup(project: { provide(key: 'postgresUrl' | 'postgresError', value: string): void }) {
  if (process.env.DATABASE_URL) {
    project.provide('postgresUrl', process.env.DATABASE_URL);
    project.provide('postgresError', '');
    return;
  }
  const initdb = findPgBin('initdb');
  pgCtl = findPgBin('pg_ctl');
  if (!initdb || !pgCtl) {
    project.provide('postgresUrl', '');
    project.provide('postgresError', 'no Postgres found (initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin): run scripts/setup.sh or set DATABASE_URL');
    return;
  }
  stopAbandonedClusters(pgCtl);
  const dir = mkdtempSync(path.join(os.tmpdir(), DIR_PREFIX));
  writeFileSync(path.join(dir, 'owner.pid'), `${process.pid}\n`);
  dataDir = path.join(dir, 'data');
  if (process.getuid?.() === 0) {
    // The Debian package creates `postgres`; any unprivileged user does.
    const user = ['postgres', 'nobody'].find((u) => {
      try {
        execFileSync('id', ['-u', u], { stdio: 'ignore' });
        return true;
      } catch {
        return false;
      }
    });
    if (!user) {
      project.provide('postgresUrl', '');
      project.provide('postgresError', 'running as root with no unprivileged user to run postgres as');
      return;
    }
    const uid = Number(execFileSync('id', ['-u', user], { encoding: 'utf8' }).trim());
    const gid = Number(execFileSync('id', ['-g', user], { encoding: 'utf8' }).trim());
    chownSync(dir, uid, gid);
    chmodSync(dir, 0o700);
    asUser = ['-u', user, '--'];
  }
  const port = await testPort();
  try {
    run(initdb, ['-D', dataDir, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8', '--locale=C']);
    const opts = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200`;
    run(pgCtl, ['-D', dataDir, '-o', opts, '-l', path.join(dir, 'postgres.log'), '-w', '-t', '60', 'start']);
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    project.provide('postgresUrl', '');
    project.provide('postgresError', `could not start the test Postgres: ${err.stderr || err.message}`);
    return;
  }
  project.provide('postgresUrl', `postgres://postgres@127.0.0.1:${port}/postgres`);
  project.provide('postgresError', '');
}

export async function teardown() {
  if (!dataDir || !pgCtl) return;
  try {
    run(pgCtl, ['-D', dataDir, '-m', 'immediate', 'stop']);
  } catch {
    /* already stopped */
  }
  rmSync(path.dirname(dataDir), { recursive: true, force: true });
}
