/**
 * Carrying an agent session between agent homes (activities/agents/session-carry.ts): where each
 * provider keeps a session, and the attacks a hostile sandbox can make on the copy: a session
 * file that is a symlink to a host secret, a linked folder, an oversized session, a planted link
 * where the restore writes. The end-to-end proof (the real CLIs resume a restored session) is in
 * test/real-agents.e2e.test.ts.
 */
import { existsSync, mkdirSync, readFileSync, readdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { captureSession, restoreSession, SESSION_CARRY_LIMITS, SessionCarryError, sessionStoreDir } from '../activities/agents/session-carry';
import { agentProvider } from '../agents/registry';
import type { SessionLocation } from '../agents/provider';
import { tempDir } from './helpers/repo';

const ID = '5aedad75-f695-42ca-86c1-d07c788330b1';
const location = (provider: 'claude-code' | 'codex' | 'pi' | 'opencode' | 'copilot', home: string, env: Record<string, string> = {}): SessionLocation =>
  agentProvider(provider).sessionLocation!(ID, { env, home });
const put = (file: string, text: string) => {
  mkdirSync(path.dirname(file), { recursive: true });
  writeFileSync(file, text);
};
const files = (dir: string) => (existsSync(dir) ? (readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile()).map((e) => path.relative(dir, path.join(e.parentPath, e.name))).sort()) : []);

describe('where each CLI keeps a session, and where it goes for another cwd', () => {
  const cases = [
    { provider: 'claude-code', mine: [`-old-cwd/${ID}.jsonl`, `-old-cwd/${ID}/subagents/a.jsonl`], other: ['-old-cwd/other.jsonl', `${ID}.jsonl`], placed: `-workspace/${ID}.jsonl`, root: '.claude/projects' },
    { provider: 'codex', mine: [`2026/11/23/rollout-2026-11-23T15-43-44-${ID}.jsonl`], other: ['2026/11/23/rollout-2026-11-23T15-43-44-other.jsonl', `x/rollout-1-${ID}.jsonl`], placed: `2026/11/23/rollout-2026-11-23T15-43-44-${ID}.jsonl`, root: '.codex/sessions' },
    // OpenCode: one database for every session of its data dir; auth.json beside it never travels.
    { provider: 'opencode', mine: ['opencode.db', 'opencode.db-wal'], other: ['auth.json', 'opencode.db-shm', 'log/opencode.log', 'storage/opencode.db', 'snapshot/x/y'], placed: 'opencode.db', root: '.local/share/opencode' },
    { provider: 'pi', mine: [`--old-cwd--/2026-11-23T15-43-49-571Z_${ID}.jsonl`], other: ['--old-cwd--/2026_other.jsonl', `2026_${ID}.jsonl`], placed: `--workspace--/2026-11-23T15-43-49-571Z_${ID}.jsonl`, root: '.pi/agent/sessions' },
    // Its per-process locks (`inuse.<pid>.lock|hold`) are not the session: a restored one would look in use.
    { provider: 'copilot', mine: [`${ID}/events.jsonl`, `${ID}/workspace.yaml`, `${ID}/checkpoints/index.md`], other: [`${ID}/inuse.4790.lock`, `${ID}/inuse.4790.hold`, `${ID}x/events.jsonl`, 'session-store.db', `other/${ID}/events.jsonl`], placed: `${ID}/events.jsonl`, root: '.copilot/session-state' },
  ] as const;
  for (const c of cases) {
    it(`${c.provider}: ${c.root}`, () => {
      const loc = location(c.provider, '/h');
      expect(loc.root).toBe(`/h/${c.root}`);
      for (const rel of c.mine) expect(loc.belongs(rel), rel).toBe(true);
      for (const rel of c.other) expect(loc.belongs(rel), rel).toBe(false);
      expect(loc.place(c.mine[0], '/workspace')).toBe(c.placed);
      expect(loc.belongs(loc.place(c.mine[0], '/workspace'))).toBe(true);
    });
  }
  it('opencode: XDG_DATA_HOME moves its database; OPENCODE_DB elsewhere means nothing is carried', () => {
    expect(location('opencode', '/h', { XDG_DATA_HOME: '/d' }).root).toBe('/d/opencode');
    expect(location('opencode', '/h', { OPENCODE_DB: '/x/other.db' }).belongs('opencode.db')).toBe(false);
  });
  it('the store refuses ids that are not plain names (they come from agent output)', () => {
    expect(sessionStoreDir('/r', 'o', 's', 'pi', ID)).toBe(`/r/.slipway/agent-sessions/o/s/pi/${ID}`);
    for (const bad of ['../x', '.hidden', 'a/b', '']) expect(sessionStoreDir('/r', 'o', 's', 'pi', bad)).toBeUndefined();
  });
});

describe('capture and restore', () => {
  it('carries a Claude Code session to a fresh home and another cwd; a home that has it is left alone', async () => {
    const from = location('claude-code', tempDir('slipway-carry-a-'));
    put(path.join(from.root, '-old-cwd', `${ID}.jsonl`), '{"turn":1}\n');
    put(path.join(from.root, '-old-cwd', 'unrelated.jsonl'), 'other session\n');
    const store = path.join(tempDir('slipway-carry-store-'), ID);
    expect(await captureSession(from, store)).toBe(1);
    expect(files(store)).toEqual([`-old-cwd/${ID}.jsonl`]);

    const to = location('claude-code', tempDir('slipway-carry-b-'));
    expect(await restoreSession(to, store, async () => '/workspace')).toBe('restored');
    expect(readFileSync(path.join(to.root, '-workspace', `${ID}.jsonl`), 'utf8')).toBe('{"turn":1}\n');
    expect(await restoreSession(to, store, async () => '/workspace')).toBe('present');
    expect(await restoreSession(location('claude-code', tempDir('slipway-carry-c-')), path.join(store, 'missing'), async () => '/w')).toBe('none');
  });

  it('carries OpenCode\'s database (and its WAL) to a fresh home, never its auth.json, log or the database through a link', async () => {
    const from = location('opencode', tempDir('slipway-carry-a-'));
    put(path.join(from.root, 'opencode.db'), 'db');
    put(path.join(from.root, 'opencode.db-wal'), 'wal');
    put(path.join(from.root, 'opencode.db-shm'), 'shm');
    put(path.join(from.root, 'auth.json'), '{"fake":{"key":"secret"}}');
    put(path.join(from.root, 'log', 'opencode.log'), 'log');
    const store = path.join(tempDir('slipway-carry-store-'), ID);
    expect(await captureSession(from, store)).toBe(2);
    expect(files(store)).toEqual(['opencode.db', 'opencode.db-wal']);
    const to = location('opencode', tempDir('slipway-carry-b-'));
    expect(await restoreSession(to, store, async () => '/workspace')).toBe('restored');
    expect(files(to.root)).toEqual(['opencode.db', 'opencode.db-wal']);
    expect(readFileSync(path.join(to.root, 'opencode.db-wal'), 'utf8')).toBe('wal');

    // The database a link to a host file: not captured.
    const linked = location('opencode', tempDir('slipway-carry-c-'));
    const secret = path.join(tempDir('slipway-secret-'), 'host.db');
    writeFileSync(secret, 'host secret');
    mkdirSync(linked.root, { recursive: true });
    symlinkSync(secret, path.join(linked.root, 'opencode.db'));
    const store2 = path.join(tempDir('slipway-carry-store-'), ID);
    expect(await captureSession(linked, store2)).toBe(0);
    expect(existsSync(store2)).toBe(false);
  });

  it('a session file that is a symlink (to a host secret) or lies in a linked folder is not captured', async () => {
    const secret = path.join(tempDir('slipway-secret-'), 'shadow');
    writeFileSync(secret, 'host secret');
    const from = location('pi', tempDir('slipway-carry-a-'));
    mkdirSync(path.join(from.root, '--w--'), { recursive: true });
    symlinkSync(secret, path.join(from.root, '--w--', `1_${ID}.jsonl`));
    const linkedDir = tempDir('slipway-linked-');
    put(path.join(linkedDir, `2_${ID}.jsonl`), 'outside the home');
    symlinkSync(linkedDir, path.join(from.root, '--v--'));
    const store = path.join(tempDir('slipway-carry-store-'), ID);
    expect(await captureSession(from, store)).toBe(0);
    expect(existsSync(store)).toBe(false);
  });

  it(`a session over ${SESSION_CARRY_LIMITS.maxBytes / 1024 / 1024} MiB or ${SESSION_CARRY_LIMITS.maxFiles} files is refused, and an earlier capture kept`, async () => {
    const from = location('claude-code', tempDir('slipway-carry-a-'));
    const store = path.join(tempDir('slipway-carry-store-'), ID);
    put(path.join(from.root, '-w', `${ID}.jsonl`), 'small\n');
    expect(await captureSession(from, store)).toBe(1);
    writeFileSync(path.join(from.root, '-w', `${ID}.jsonl`), Buffer.alloc(SESSION_CARRY_LIMITS.maxBytes + 1));
    await expect(captureSession(from, store)).rejects.toThrow(SessionCarryError);
    writeFileSync(path.join(from.root, '-w', `${ID}.jsonl`), 'small\n');
    for (let i = 0; i < SESSION_CARRY_LIMITS.maxFiles; i++) put(path.join(from.root, '-w', ID, `f${i}.jsonl`), 'x');
    await expect(captureSession(from, store)).rejects.toThrow(/at most 64 are carried/);
    expect(readFileSync(path.join(store, '-w', `${ID}.jsonl`), 'utf8')).toBe('small\n');
  });

  it('restore never writes through a link planted in the home: the target folder or file being a symlink is refused', async () => {
    const store = path.join(tempDir('slipway-carry-store-'), ID);
    put(path.join(store, '-old', `${ID}.jsonl`), 'session');
    const elsewhere = tempDir('slipway-elsewhere-');
    const to = location('claude-code', tempDir('slipway-carry-b-'));
    mkdirSync(to.root, { recursive: true });
    symlinkSync(elsewhere, path.join(to.root, '-workspace'));
    await expect(restoreSession(to, store, async () => '/workspace')).rejects.toThrow(/is not a plain directory/);
    expect(readdirSync(elsewhere)).toEqual([]);

    // The projects folder itself a link.
    const to2 = location('claude-code', tempDir('slipway-carry-c-'));
    mkdirSync(path.dirname(to2.root), { recursive: true });
    symlinkSync(elsewhere, to2.root);
    await expect(restoreSession(to2, store, async () => '/workspace')).rejects.toThrow(/is not a plain directory/);
    expect(readdirSync(elsewhere)).toEqual([]);
  });

  it('a stored file the provider would place outside its session folder is refused', async () => {
    const store = path.join(tempDir('slipway-carry-store-'), ID);
    put(path.join(store, '-old', `${ID}.jsonl`), 'session');
    const to = location('claude-code', tempDir('slipway-carry-b-'));
    const escaping: SessionLocation = { ...to, place: () => `../../escape/${ID}.jsonl`, belongs: () => true };
    await expect(restoreSession(escaping, store, async () => '/w')).rejects.toThrow(SessionCarryError);
    expect(existsSync(path.join(to.root, '..', '..', 'escape'))).toBe(false);
  });
});
