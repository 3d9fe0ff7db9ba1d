import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { envName, parseOriginCli } from "../../origin/cli.ts";
import type { CliResult } from "../../origin/cli.ts";

function config(result: CliResult) {
  if (result.kind !== "config") throw new Error(`expected a config, got ${JSON.stringify(result)}`);
  return result.config;
}

function error(result: CliResult): string {
  if (result.kind !== "error") throw new Error(`expected an error, got ${JSON.stringify(result)}`);
  return result.message;
}

describe("parseOriginCli", () => {
  it("defaults to the sim engine on a free port on loopback", () => {
    expect(config(parseOriginCli([]))).toEqual({
      engine: "sim",
      port: 0,
      host: "127.0.0.1",
      faults: {},
    });
  });

  it("reads every simulated-engine and fault flag", () => {
    const c = config(
      parseOriginCli([
        "--engine=sim",
        "--port",
        "8100",
        "--origin-id",
        "eu-1",
        "--region",
        "eu",
        "--models",
        "llama-3-8b:8192,qwen:32768",
        "--kv-blocks",
        "2048",
        "--max-num-seqs",
        "64",
        "--max-batched-tokens",
        "4096",
        "--time-scale",
        "0.5",
        "--seed",
        "7",
        "--admin-token",
        "secret",
        "--fault-error-rate",
        "0.1",
        "--fault-statuses",
        "429,503",
        "--fault-latency-ms",
        "20",
        "--fault-hang-rate",
        "0.01",
        "--fault-drop-after",
        "5",
      ]),
    );
    expect(c).toMatchObject({
      port: 8100,
      originId: "eu-1",
      region: "eu",
      models: [
        { id: "llama-3-8b", max_model_len: 8192 },
        { id: "qwen", max_model_len: 32768 },
      ],
      kvBlocks: 2048,
      maxNumSeqs: 64,
      maxBatchedTokens: 4096,
      timeScale: 0.5,
      seed: 7,
      adminToken: "secret",
      faults: {
        errorRate: 0.1,
        errorStatuses: [429, 503],
        latencyMs: 20,
        hangRate: 0.01,
        dropAfterTokens: 5,
      },
    });
  });

  it("takes options from the environment, with flags winning", () => {
    const env = {
      [envName("port")]: "9000",
      [envName("engine")]: "openai",
      [envName("engine-url")]: "http://127.0.0.1:8000/v1/",
      WARMGATE_ORIGIN_ID: "from-env",
    };
    const c = config(parseOriginCli(["--port", "9001"], env));
    expect(c).toMatchObject({
      engine: "openai",
      engineUrl: "http://127.0.0.1:8000",
      port: 9001,
      originId: "from-env",
    });
  });

  it("rejects an unknown flag", () => {
    expect(error(parseOriginCli(["--bogus"]))).toMatch(/bogus/);
  });

  it("rejects a stray positional argument", () => {
    expect(error(parseOriginCli(["sim"]))).toMatch(/sim/);
  });

  it("requires --engine-url for the openai engine", () => {
    expect(error(parseOriginCli(["--engine", "openai"]))).toMatch(/--engine-url/);
  });

  it("rejects an engine it does not know", () => {
    expect(error(parseOriginCli(["--engine", "tgi"]))).toMatch(/sim or openai/);
  });

  it.each([["-1"], ["65536"], ["80a"], [""]])("rejects the port %j", (port) => {
    expect(error(parseOriginCli(["--port", port]))).toMatch(/--port/);
  });

  it("rejects rates outside 0..1 and statuses it cannot inject", () => {
    expect(error(parseOriginCli(["--fault-error-rate", "1.5"]))).toMatch(/--fault-error-rate/);
    expect(error(parseOriginCli(["--fault-statuses", "429,404"]))).toMatch(/404/);
    expect(error(parseOriginCli(["--time-scale", "fast"]))).toMatch(/--time-scale/);
  });

  it("rejects malformed model lists and engine URLs", () => {
    expect(error(parseOriginCli(["--models", "llama"]))).toMatch(/--models/);
    expect(error(parseOriginCli(["--models", "llama:big"]))).toMatch(/--models/);
    expect(error(parseOriginCli(["--engine-url", "localhost:8000"]))).toMatch(/--engine-url/);
  });

  it("reads the connection limits, from flags or the environment", () => {
    const c = config(
      parseOriginCli(
        [
          "--max-connections",
          "256",
          "--headers-timeout-ms",
          "5000",
          "--request-timeout-ms",
          "30000",
        ],
        { [envName("keep-alive-timeout-ms")]: "75000" },
      ),
    );
    expect(c).toMatchObject({
      maxConnections: 256,
      headersTimeoutMs: 5000,
      requestTimeoutMs: 30000,
      keepAliveTimeoutMs: 75000,
    });
  });

  it("refuses a request timeout shorter than the headers timeout, and zero limits", () => {
    expect(error(parseOriginCli(["--request-timeout-ms", "5000"]))).toMatch(
      /--request-timeout-ms.*5000 ms.*10000 ms/,
    );
    expect(error(parseOriginCli(["--headers-timeout-ms", "0"]))).toMatch(/--headers-timeout-ms/);
    expect(error(parseOriginCli(["--max-connections", "0"]))).toMatch(/--max-connections/);
  });

  it("answers --help with the usage text", () => {
    const result = parseOriginCli(["--help"]);
    expect(result.kind).toBe("help");
    expect(result.kind === "help" && result.text).toMatch(/--engine sim\|openai/);
  });
});

describe("npm run origin", () => {
  it("exits 2 at once with a one-line message on a bad flag", () => {
    const run = spawnSync(process.execPath, ["origin/main.ts", "--port", "http"], {
      encoding: "utf8",
      timeout: 15_000,
    });
    expect(run.status).toBe(2);
    expect(run.stderr.trim().split("\n")).toHaveLength(1);
    expect(run.stderr).toMatch(/--port must be a whole number.*--help/);
  });
});

describe("an origin beyond loopback", () => {
  it("refuses --host 0.0.0.0 without an access token, naming the flag to add", () => {
    expect(error(parseOriginCli(["--host", "0.0.0.0"]))).toMatch(/--access-token/);
    expect(error(parseOriginCli(["--host", "10.0.0.5", "--admin-token", "a"]))).toMatch(
      /beyond loopback/,
    );
  });

  it("starts on any address with an access token, and on loopback without one", () => {
    expect(config(parseOriginCli(["--host", "0.0.0.0", "--access-token", "t"])).host).toBe(
      "0.0.0.0",
    );
    for (const host of ["127.0.0.1", "127.1.2.3", "::1", "localhost"]) {
      expect(config(parseOriginCli(["--host", host])).host).toBe(host);
    }
  });

  it("refuses from the environment as from flags", () => {
    expect(error(parseOriginCli([], { WARMGATE_ORIGIN_HOST: "0.0.0.0" }))).toMatch(
      /--access-token/,
    );
  });
});
