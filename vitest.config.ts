import { cloudflareTest } from "@cloudflare/vitest-plugin";
import { defineConfig } from "vitest/config";

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
        plugins: [cloudflareTest({ wrangler: { configPath: "./wrangler.toml" } })],
        test: {
          name: "workers",
          include: ["test/**/*.workers.test.ts"],
          testTimeout: 20_000,
        },
      },
    ],
  },
});
