/**
 * GPU readings from `nvidia-smi`, cached for a couple of seconds and read without
 * blocking the event loop. Where there is no `nvidia-smi`, the snapshot says so
 * instead of inventing numbers.
 * See docs/configuration.md, "The origin".
 */
import { execFile } from "node:child_process";

/** The query the origin runs; column order matters to {@link parseNvidiaSmi}. */
export const NVIDIA_SMI_ARGS = [
  "--query-gpu=index,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw",
  "--format=csv,noheader,nounits",
] as const;

/** One GPU's readings; a field nvidia-smi could not read (`[N/A]`) is null. */
export interface GpuReading {
  index: number;
  name: string;
  utilization_percent: number | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  temperature_celsius: number | null;
  power_watts: number | null;
}

/** What the origin knows about its GPUs. */
export type GpuSnapshot =
  | { available: true; gpus: GpuReading[]; read_at: number }
  | { available: false; reason: string };

const MIB = 1024 * 1024;

function numberOrNull(field: string | undefined): number | null {
  if (field === undefined) return null;
  const trimmed = field.trim();
  if (trimmed === "" || trimmed.startsWith("[")) return null;
  const value = Number(trimmed);
  return Number.isFinite(value) ? value : null;
}

/** Parses nvidia-smi's csv (noheader, nounits) output; skips lines it cannot read. */
export function parseNvidiaSmi(csv: string): GpuReading[] {
  const gpus: GpuReading[] = [];
  for (const line of csv.split(/\r?\n/)) {
    if (line.trim() === "") continue;
    // GPU names do not contain commas, so a plain split is safe for this query.
    const fields = line.split(",");
    if (fields.length < 7) continue;
    const index = numberOrNull(fields[0]);
    if (index === null) continue;
    const used = numberOrNull(fields[3]);
    const total = numberOrNull(fields[4]);
    gpus.push({
      index,
      name: (fields[1] ?? "").trim(),
      utilization_percent: numberOrNull(fields[2]),
      memory_used_bytes: used === null ? null : used * MIB,
      memory_total_bytes: total === null ? null : total * MIB,
      temperature_celsius: numberOrNull(fields[5]),
      power_watts: numberOrNull(fields[6]),
    });
  }
  return gpus;
}

/** Runs a command and returns its stdout; the seam tests replace. */
export type CommandRunner = (command: string, args: readonly string[]) => Promise<string>;

/** Options of {@link createGpuMonitor}. */
export interface GpuMonitorOptions {
  /** Milliseconds a reading stays fresh (default 2000). */
  ttlMs?: number;
  /** Command to run (default `nvidia-smi`). */
  command?: string;
  run?: CommandRunner;
}

/** Cached GPU readings. */
export interface GpuMonitor {
  /** The latest snapshot; waits only when there has never been one. */
  snapshot(): Promise<GpuSnapshot>;
}

const runCommand: CommandRunner = (command, args) =>
  new Promise((resolve, reject) => {
    execFile(command, args, { timeout: 5000, windowsHide: true }, (error, stdout) => {
      if (error) reject(error);
      else resolve(stdout);
    });
  });

function describeFailure(command: string, error: unknown): string {
  if (error instanceof Error && "code" in error && error.code === "ENOENT") {
    return `${command} not found`;
  }
  const message = error instanceof Error ? error.message.split("\n")[0] : String(error);
  return `${command} failed: ${message}`;
}

/** Creates a monitor that refreshes at most every `ttlMs`, in the background once warm. */
export function createGpuMonitor(options: GpuMonitorOptions = {}): GpuMonitor {
  const ttlMs = options.ttlMs ?? 2000;
  const command = options.command ?? "nvidia-smi";
  const run = options.run ?? runCommand;
  let current: GpuSnapshot | null = null;
  let readAt = 0;
  let pending: Promise<GpuSnapshot> | null = null;

  async function read(): Promise<GpuSnapshot> {
    try {
      const gpus = parseNvidiaSmi(await run(command, NVIDIA_SMI_ARGS));
      return gpus.length > 0
        ? { available: true, gpus, read_at: Date.now() }
        : { available: false, reason: `${command} reported no GPUs` };
    } catch (error) {
      return { available: false, reason: describeFailure(command, error) };
    }
  }

  function refresh(): Promise<GpuSnapshot> {
    pending ??= read().then((snapshot) => {
      current = snapshot;
      readAt = Date.now();
      pending = null;
      return snapshot;
    });
    return pending;
  }

  return {
    async snapshot() {
      if (current === null) return refresh();
      if (Date.now() - readAt > ttlMs) void refresh();
      return current;
    },
  };
}
