/**
 * Every test file runs with a Slipway home of its own, never the developer's: without it, the
 * repository registry the janitor sweeps (every objective a test ran, in repositories long
 * deleted), worker ids, trust records and agent sessions piled up under ~/.local/share/slipway,
 * and each objective start rewrote an ever larger registry. A test that needs another home sets
 * SLIPWAY_HOME itself (after this, so its value wins); processes a test starts inherit this one.
 */
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

process.env.SLIPWAY_HOME = mkdtempSync(path.join(os.tmpdir(), 'slipway-test-home-'));
