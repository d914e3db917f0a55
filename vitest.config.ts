import { defineConfig } from "vitest/config"

/**
 * Files that measure a latency while they load the gateway run alone, after everything else, so that another
 * test file's work on the same cores does not count as the gateway's.
 */
const alone = [
  "test/edge/hostile-routes.test.ts",
  // Measures the dashboard's time to interactive (docs/dashboard.md).
  "test/dashboard/dashboard.browser.test.ts"
]

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 120_000,
    pool: "forks",
    maxWorkers: 2,
    globalSetup: ["test/support/globalSetup.ts"],
    projects: [
      {
        extends: true,
        test: { name: "main", include: ["test/**/*.test.ts"], exclude: alone, sequence: { groupOrder: 0 } }
      },
      {
        extends: true,
        test: { name: "alone", include: alone, maxWorkers: 1, sequence: { groupOrder: 1 } }
      }
    ]
  }
})
