import { describe, expect, it } from "vitest";
import { createGpuMonitor, parseNvidiaSmi } from "../../origin/gpu.ts";

describe("parseNvidiaSmi", () => {
  it("reads each GPU line and converts MiB to bytes", () => {
    const csv =
      "0, NVIDIA H200, 87, 120000, 143771, 61, 512.34\n1, NVIDIA H200, 3, 1024, 143771, 35, 80.10\n";
    expect(parseNvidiaSmi(csv)).toEqual([
      {
        index: 0,
        name: "NVIDIA H200",
        utilization_percent: 87,
        memory_used_bytes: 120000 * 1024 * 1024,
        memory_total_bytes: 143771 * 1024 * 1024,
        temperature_celsius: 61,
        power_watts: 512.34,
      },
      expect.objectContaining({ index: 1, utilization_percent: 3, power_watts: 80.1 }),
    ]);
  });

  it("reports fields nvidia-smi cannot read as null and skips garbage lines", () => {
    const csv = "0, Tesla T4, [N/A], 10, 15360, 40, [Not Supported]\nNo devices were found\n";
    expect(parseNvidiaSmi(csv)).toEqual([
      expect.objectContaining({ index: 0, utilization_percent: null, power_watts: null }),
    ]);
  });
});

describe("createGpuMonitor", () => {
  it("says nvidia-smi is not found rather than inventing numbers", async () => {
    const monitor = createGpuMonitor({ command: "warmgate-no-such-nvidia-smi" });
    expect(await monitor.snapshot()).toEqual({
      available: false,
      reason: "warmgate-no-such-nvidia-smi not found",
    });
  });

  it("runs the command once while the reading is fresh", async () => {
    let runs = 0;
    const monitor = createGpuMonitor({
      ttlMs: 60_000,
      run: () => {
        runs++;
        return Promise.resolve("0, NVIDIA L4, 50, 100, 23034, 50, 30\n");
      },
    });
    const first = await monitor.snapshot();
    await monitor.snapshot();
    expect(runs).toBe(1);
    expect(first.available && first.gpus[0]?.name).toBe("NVIDIA L4");
  });
});
