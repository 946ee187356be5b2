/**
 * The suite never writes into the developer's Slipway home (test/setup-home.ts): an objective's
 * start records it in the registry under SLIPWAY_HOME, which must be this file's own folder.
 */
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { registerObjective, registryPath } from '../activities/sandbox/registry';
import { slipwayHome } from '../lib/settings';

describe('the test run', () => {
  it('keeps Slipway state in a temporary home of its own, not under the user home', async () => {
    const home = slipwayHome();
    // What the default would be: SLIPWAY_HOME unset (the user home, or XDG_DATA_HOME).
    const real = slipwayHome({ XDG_DATA_HOME: process.env.XDG_DATA_HOME });
    expect(home).not.toBe(real);
    expect(path.relative(os.tmpdir(), home).startsWith('..')).toBe(false);
    // What an objective start writes goes there.
    await registerObjective('/tmp/nowhere-repo', 'home-check', 'abc');
    expect(registryPath()).toBe(path.join(home, 'repositories.json'));
    expect(JSON.parse(readFileSync(registryPath(), 'utf8')).repositories['/tmp/nowhere-repo'].objectives['home-check']).toBeDefined();
    expect(existsSync(path.join(home, 'repositories.json'))).toBe(true);
  });
});
