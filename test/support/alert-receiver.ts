/**
 * A webhook receiver for soft-budget alerts, started in Node by `origins-setup.ts` on a free
 * port. `POST /hooks/<name>?fail=<n>` answers 500 to the first n attempts of that name, then
 * 204 and keeps the delivery; `GET /hooks/<name>` answers what arrived: every attempt's
 * count and each accepted delivery's body and signature header.
 */
import { type IncomingHttpHeaders, type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";

/** What the receiver holds for one hook name. */
export interface HookRecord {
  attempts: number;
  deliveries: { body: string; signature: string | null; alertId: string | null }[];
}

/** Starts the receiver; `url` is its base (`http://127.0.0.1:<port>`). */
export async function startAlertReceiver(): Promise<{ server: Server; url: string }> {
  const hooks = new Map<string, HookRecord>();
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://receiver");
    const hookName = url.pathname.replace(/^\/hooks\//, "");
    const record = hooks.get(hookName) ?? { attempts: 0, deliveries: [] };
    hooks.set(hookName, record);
    if (req.method === "GET") {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(record));
      return;
    }
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      record.attempts += 1;
      if (record.attempts <= Number(url.searchParams.get("fail") ?? "0")) {
        res.writeHead(500).end();
        return;
      }
      record.deliveries.push({
        body: Buffer.concat(chunks).toString("utf8"),
        signature: headerOf(req.headers, "x-warmgate-signature"),
        alertId: headerOf(req.headers, "x-warmgate-alert-id"),
      });
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { server, url: `http://127.0.0.1:${port}` };
}

function headerOf(headers: IncomingHttpHeaders, name: string): string | null {
  const value = headers[name];
  return typeof value === "string" ? value : null;
}
