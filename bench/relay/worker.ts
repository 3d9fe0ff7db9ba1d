/**
 * Three ways for a Durable Object to stream bytes to another Worker's client, as the Batcher
 * streams each caller's tokens (`npm run bench:relay`, docs/benchmarks.md): `/read`, the
 * Worker reads a stream returned over RPC into its response; `/handoff`, the object writes
 * to the response body's writable side it was handed; `/pass`, the stream returned over RPC
 * is the response body as it is (what the edge does). The object writes `n` SSE-sized
 * chunks, each once the last one was taken.
 */
import { DurableObject } from "cloudflare:workers";

interface RelayEnv {
  SOURCE: DurableObjectNamespace<Source>;
}

const encoder = new TextEncoder();
const token = (i: number) =>
  encoder.encode(
    `data: {"choices":[{"index":0,"delta":{"content":"token ${i}"},"finish_reason":null}]}\n\n`,
  );

async function writeTokens(writable: WritableStream<Uint8Array>, n: number): Promise<void> {
  const writer = writable.getWriter();
  try {
    for (let i = 0; i < n; i++) await writer.write(token(i));
    await writer.close();
  } catch {
    // The client went away.
  }
}

export class Source extends DurableObject<RelayEnv> {
  read(n: number): ReadableStream<Uint8Array> {
    const { readable, writable } = new IdentityTransformStream();
    this.ctx.waitUntil(writeTokens(writable, n));
    return readable;
  }

  handoff(n: number, body: WritableStream<Uint8Array>): void {
    this.ctx.waitUntil(writeTokens(body, n));
  }
}

const SSE = { "content-type": "text/event-stream" };

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const n = Number(url.searchParams.get("n") ?? "16");
    const source = env.SOURCE.getByName("source");
    if (url.pathname === "/read") {
      const reader = (await source.read(n)).getReader();
      const body = new ReadableStream<Uint8Array>(
        {
          async pull(controller) {
            const { done, value } = await reader.read();
            if (done) controller.close();
            else controller.enqueue(value);
          },
        },
        { highWaterMark: 0 },
      );
      return new Response(body, { headers: SSE });
    }
    if (url.pathname === "/pass") {
      return new Response(await source.read(n), { headers: SSE });
    }
    if (url.pathname === "/handoff") {
      const { readable, writable } = new IdentityTransformStream();
      await source.handoff(n, writable);
      return new Response(readable, { headers: SSE });
    }
    return new Response("ok");
  },
} satisfies ExportedHandler<RelayEnv>;
