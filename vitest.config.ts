import { defineConfig } from 'vitest/config';

// Tests open real sockets, spawn real processes and start real databases, so they get generous
// timeouts; files run in forked workers (native addons and process-wide TLS state stay isolated).
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/helpers/pg-cluster.ts'],
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 20_000,
    reporters: ['default'],
  },
});
