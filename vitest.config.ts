import { cloudflareTest } from "@cloudflare/vitest-plugin";
import { defineConfig } from "vitest/config";
import { TEST_ADMIN_TOKEN, TEST_SIGNING_SECRET } from "./test/support/provided-context.ts";

// Two projects: `unit` runs pure cores, the origin and scripts in Node;
// `workers` runs the edge and its Durable Objects inside workerd.
export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: "unit",
          include: ["test/**/*.test.ts"],
          exclude: ["test/**/*.workers.test.ts"],
          environment: "node",
          testTimeout: 20_000,
        },
      },
      {
        plugins: [
          // Origins run in Node (global setup); their URLs reach the Worker as its config.
          cloudflareTest(({ inject }) => ({
            wrangler: { configPath: "./wrangler.toml" },
            miniflare: {
              bindings: {
                WARMGATE_CONFIG: inject("warmgateConfig"),
                WARMGATE_ENV: "local",
                ADMIN_TOKEN: TEST_ADMIN_TOKEN,
                TOKEN_SIGNING_SECRET: TEST_SIGNING_SECRET,
              },
            },
          })),
        ],
        test: {
          name: "workers",
          include: ["test/**/*.workers.test.ts"],
          globalSetup: ["test/support/origins-setup.ts"],
          // Creates the shared test key's account before each file's tests.
          setupFiles: ["test/support/test-key.workers.ts"],
          testTimeout: 20_000,
        },
      },
    ],
  },
});
