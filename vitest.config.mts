import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    pool: 'forks',
    // 2 cores: at most two test files at once; each integration test uses its own task queue.
    maxWorkers: 2,
    globalSetup: ['test/global-setup.ts', 'test/postgres-setup.ts'],
    // A Slipway home of its own for each test file (test/setup-home.ts).
    setupFiles: ['test/setup-home.ts'],
    testTimeout: 120_000,
    hookTimeout: 180_000,
    include: ['test/**/*.test.ts'],
  },
});
