import { cloudflareTest } from "@cloudflare/vitest-plugin";
import { defineConfig } from "vitest/config";
import { TEST_API_KEY } from "./test/support/provided-context.ts";

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
                WARMGATE_API_KEYS: TEST_API_KEY,
                ADMIN_TOKEN: "test-admin-token",
                TOKEN_SIGNING_SECRET: "test-token-signing-secret",
              },
            },
          })),
        ],
        test: {
          name: "workers",
          include: ["test/**/*.workers.test.ts"],
          globalSetup: ["test/support/origins-setup.ts"],
          testTimeout: 20_000,
        },
      },
    ],
  },
});
