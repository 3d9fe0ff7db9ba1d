/**
 * The processes behind a running Worker on Linux: which workerd runs it, its CPU time and
 * its memory, for the benchmarks' tables (docs/benchmarks.md).
 */
import { readFile } from "node:fs/promises";
/**
 * The workerd process that runs a Worker and its Durable Objects, among the processes under
 * `rootPid`: the only one under `scripts/workerd.ts`; of the two under `wrangler dev`, the one
 * with an inspector (the other only proxies). Look it up per measurement: wrangler restarts
 * it when its sources change. Linux only; null when unknown.
 */
export async function workerdPid(rootPid: number | undefined): Promise<number | null> {
  if (rootPid === undefined) return null;
  const workerds: { pid: number; inspector: boolean }[] = [];
  for (const pid of await processTree(rootPid)) {
    try {
      const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8");
      if (cmdline.includes("workerd\0serve")) {
        workerds.push({ pid, inspector: cmdline.includes("--inspector-addr") });
      }
    } catch {
      // Gone meanwhile.
    }
  }
  if (workerds.length === 1) return workerds[0]?.pid ?? null;
  return workerds.find((w) => w.inspector)?.pid ?? null;
}

/** CPU time (user plus system, ms) a process has used (Linux /proc), or null when unknown. */
export async function cpuTimeMs(pid: number | null): Promise<number | null> {
  if (pid === null) return null;
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // utime and stime, in clock ticks of 10 ms (USER_HZ is 100 on Linux).
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return null;
  }
}

/** Resident set size of a process in bytes (Linux /proc), or null when unknown. */
export async function rssBytes(pid: number): Promise<number | null> {
  try {
    const status = await readFile(`/proc/${pid}/status`, "utf8");
    const match = /VmRSS:\s+(\d+)\s+kB/.exec(status);
    return match?.[1] ? Number(match[1]) * 1024 : null;
  } catch {
    return null;
  }
}

/**
 * A process's resident memory in bytes (Linux /proc): in all, anonymous (heaps: the
 * allocator's and V8's) and file-backed (the binary and libraries); null when unknown.
 */
export async function residentBytes(
  pid: number,
): Promise<{ rss: number; anon: number; file: number } | null> {
  try {
    const status = await readFile(`/proc/${pid}/status`, "utf8");
    const kb = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+)\\s+kB`).exec(status)?.[1]);
    const [rss, anon, file] = [kb("VmRSS"), kb("RssAnon"), kb("RssFile")];
    if (![rss, anon, file].every(Number.isFinite)) return null;
    return { rss: rss * 1024, anon: anon * 1024, file: file * 1024 };
  } catch {
    return null;
  }
}

/** Pids of a process and all its descendants (Linux /proc). */
export async function processTree(pid: number): Promise<number[]> {
  const { readdir } = await import("node:fs/promises");
  const parents = new Map<number, number[]>();
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = await readFile(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const list = parents.get(ppid) ?? [];
      list.push(Number(entry));
      parents.set(ppid, list);
    } catch {
      // Process ended while listing.
    }
  }
  const out: number[] = [];
  const stack = [pid];
  while (stack.length) {
    const p = stack.pop() as number;
    out.push(p);
    stack.push(...(parents.get(p) ?? []));
  }
  return out;
}

/** RSS of the workerd process(es) under a `wrangler dev` child, in bytes. */
export async function workerdRss(wranglerPid: number): Promise<number | null> {
  let total = 0;
  let found = false;
  for (const pid of await processTree(wranglerPid)) {
    try {
      const cmd = await readFile(`/proc/${pid}/cmdline`, "utf8");
      if (!cmd.includes("workerd")) continue;
    } catch {
      continue;
    }
    const rss = await rssBytes(pid);
    if (rss !== null) {
      total += rss;
      found = true;
    }
  }
  return found ? total : null;
}
