/**
 * A minimal Chrome DevTools Protocol client for the edge's V8 inspector (workerd's
 * `--inspector-addr`): commands, events, and the Worker's target. Used by `bench:profile`
 * and `bench:soak` (docs/benchmarks.md).
 */

export interface Inspector {
  send<T>(method: string, params?: object): Promise<T>;
  on(method: string, listener: (params: unknown) => void): void;
  close(): void;
}

/** Connects to the isolate that runs the edge and its Durable Objects. */
export async function inspectWorker(inspectorPort: number): Promise<Inspector> {
  const targets = (await (await fetch(`http://127.0.0.1:${inspectorPort}/json`)).json()) as {
    id: string;
    webSocketDebuggerUrl: string;
  }[];
  const worker = targets.find((t) => t.id === "core:user:worker");
  if (worker === undefined)
    throw new Error(`no Worker among ${targets.map((t) => t.id).join(", ")}`);
  return inspect(worker.webSocketDebuggerUrl);
}

async function inspect(url: string): Promise<Inspector> {
  const socket = new WebSocket(url);
  await new Promise((resolve, reject) => {
    socket.addEventListener("open", resolve, { once: true });
    socket.addEventListener("error", reject, { once: true });
  });
  let next = 0;
  const waiting = new Map<number, (message: { result?: unknown; error?: unknown }) => void>();
  const listeners = new Map<string, ((params: unknown) => void)[]>();
  socket.addEventListener("message", (event) => {
    const message = JSON.parse(String(event.data)) as {
      id?: number;
      method?: string;
      params?: unknown;
      result?: unknown;
      error?: unknown;
    };
    if (message.id !== undefined) {
      waiting.get(message.id)?.(message);
      waiting.delete(message.id);
    } else if (message.method !== undefined) {
      for (const listener of listeners.get(message.method) ?? []) listener(message.params);
    }
  });
  return {
    async send<T>(method: string, params: object = {}): Promise<T> {
      const id = ++next;
      const answer = new Promise<{ result?: unknown; error?: unknown }>((r) => waiting.set(id, r));
      socket.send(JSON.stringify({ id, method, params }));
      const { result, error } = await answer;
      if (error !== undefined) throw new Error(`${method}: ${JSON.stringify(error)}`);
      return result as T;
    },
    on(method, listener) {
      listeners.set(method, [...(listeners.get(method) ?? []), listener]);
    },
    close: () => socket.close(),
  };
}
