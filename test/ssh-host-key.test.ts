import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Server, utils } from 'ssh2';
import { describe, expect, it } from 'vitest';
import { hostKeyProblem, loadSshHostKey, makeSshHostKey, SSH_HOST_KEY_FILE } from '../api/ssh-server';

const raw = () => Buffer.from(utils.generateKeyPairSync('ed25519').private);

/** A key from ssh2's own generator that ssh2 cannot read back (about 1 in 256 are). */
function brokenKey(): Buffer {
  for (let i = 0; i < 20_000; i++) {
    const k = raw();
    if (hostKeyProblem(k)) return k;
  }
  throw new Error('ssh2 made 20,000 ed25519 keys it can all read: its generator was fixed (mscdex/ssh2#1390); makeSshHostKey may stop retrying');
}

describe('SSH host key', () => {
  it("ssh2's generator makes keys its Server refuses; makeSshHostKey throws such a key away and makes another", () => {
    const bad = brokenKey();
    expect(() => new Server({ hostKeys: [bad] })).toThrow(/Cannot parse privateKey/);
    const made: Buffer[] = [];
    const key = makeSshHostKey(() => {
      const k = made.length === 0 ? bad : raw();
      made.push(k);
      return k;
    });
    expect(made.length).toBeGreaterThanOrEqual(2);
    expect(key.equals(bad)).toBe(false);
    expect(hostKeyProblem(key)).toBeUndefined();
    expect(() => new Server({ hostKeys: [key] })).not.toThrow();
  });

  it('a generator that only makes unusable keys is an error naming why, not an endless loop', () => {
    expect(() => makeSshHostKey(() => Buffer.from('not a key'))).toThrow(/could not make an SSH host key ssh2 can use: not a private key ssh2 can read/);
  });

  it('every key made serves: 500 in a row all parse, sign and verify', () => {
    for (let i = 0; i < 500; i++) expect(hostKeyProblem(makeSshHostKey())).toBeUndefined();
  });

  it('an unreadable key file under $SLIPWAY_HOME is an error naming the file; it is not replaced', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-hostkey-'));
    const file = path.join(dir, SSH_HOST_KEY_FILE);
    writeFileSync(file, 'garbage', { mode: 0o600 });
    await expect(loadSshHostKey(dir)).rejects.toThrow(new RegExp(`${file}: not a private key ssh2 can read.*delete it`));
  });
});
