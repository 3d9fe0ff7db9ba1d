import { readFileSync } from "node:fs";
import { cloudflareTest } from "@cloudflare/vitest-plugin";
import { defineConfig } from "vitest/config";
import LaneSequencer from "./test/support/sequencer.ts";
import {
  TEST_ADMIN_TOKEN,
  TEST_ALERT_SECRET,
  TEST_SIGNING_SECRET,
} from "./test/support/provided-context.ts";

// Two projects: `unit` runs pure cores, the origin and scripts in Node;
// `workers` runs the edge and its Durable Objects inside workerd.
// WARMGATE_CONFIG_FILE=my-config.json also checks a deployment's own configuration there
// (test/functions/user-config.workers.test.ts; docs/deploy.md).
const userConfigFile = process.env["WARMGATE_CONFIG_FILE"];
const userConfig = userConfigFile === undefined ? "" : readFileSync(userConfigFile, "utf8");
export default defineConfig({
  test: {
    // `npm test` splits the files into lanes with `--shard` (docs/edge.md, "Running the checks").
    sequence: { sequencer: LaneSequencer },
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
                WARMGATE_USER_CONFIG: userConfig,
                ADMIN_TOKEN: TEST_ADMIN_TOKEN,
                TOKEN_SIGNING_SECRET: TEST_SIGNING_SECRET,
                ALERT_SIGNING_SECRET: TEST_ALERT_SECRET,
              },
            },
          })),
        ],
        test: {
          name: "workers",
          include: ["test/**/*.workers.test.ts"],
          // One file at a time: files share the global setup's origins, their injected
          // faults and their counts. `npm test` runs lanes with origins of their own.
          maxWorkers: 1,
          globalSetup: ["test/support/origins-setup.ts"],
          // Creates the shared test key's account before each file's tests.
          setupFiles: ["test/support/test-key.workers.ts"],
          testTimeout: 20_000,
        },
      },
    ],
  },
});
