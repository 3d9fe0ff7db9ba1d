/**
 * A test origin that speaks the batch protocol (origin/PROTOCOL.md) but garbles one frame
 * of each item, as the item's body asks in its `user` field: `bad-head` (a HEAD that is
 * not JSON), `bad-end` (an END without its outcome) or `bad-load` (a LOAD that is an
 * array); `mute` takes the call and answers it only once its item is cancelled by id
 * (`GET /muted` counts calls taken, and those stopped: closed by the edge unanswered, or
 * their item cancelled); `hang` does the same but answers the call's headers at once and
 * reports its engine idle every 50 ms meanwhile, as an origin that lost the item does;
 * `freeze` answers a raw batch's HEAD and first bytes, then nothing more, nor any lookup of
 * its outcome, as an origin that froze mid-stream (`GET /muted` counts those too); any other
 * item is answered well. Started by `origins-setup.ts`.
 */
import { type Server, createServer } from "node:http";
import { type AddressInfo } from "node:net";
import { BatchRequestSchema, IDLE_LOAD, type LoadReport } from "../../contracts/protocol/schema.ts";
import { decodeEnvelope } from "../../contracts/protocol/envelope.ts";
import {
  BATCH_CONTENT_TYPE,
  BATCH_ITEM,
  FrameType,
  RAW_BATCH_CONTENT_TYPE,
  concatBytes,
  encodeFrame,
  encodeJsonFrame,
} from "../../contracts/protocol/framing.ts";

const encoder = new TextEncoder();

/** Longest a held END waits for `POST /release`. */
const HOLD_MS = 5_000;

function load(originId: string): LoadReport {
  return {
    origin: originId,
    t: Date.now(),
    ...IDLE_LOAD,
    kv_free_blocks: 1024,
    kv_total_blocks: 1024,
    block_size: 16,
    max_num_seqs: 64,
  };
}

/** The frame an item's body asks to garble, and whether it asks for a stream. */
function requestOf(body: string): { garble: string | null; stream: boolean } {
  try {
    const { user, stream } = JSON.parse(body) as { user?: unknown; stream?: unknown };
    return { garble: typeof user === "string" ? user : null, stream: stream === true };
  } catch {
    return { garble: null, stream: false };
  }
}

/**
 * The frames of one batch answer, each item garbled as it asks: before the END and the
 * final LOAD, and after the rest, comes a pause until `release` (so that a `bad-end` item's
 * HEAD reaches the edge first).
 */
function answer(originId: string, envelope: unknown): { first: Uint8Array; last: Uint8Array } {
  const batch = BatchRequestSchema.parse(envelope);
  const requests = batch.items.map((item) => requestOf(item.body));
  const garbles = requests.map((request) => request.garble);
  const first: Uint8Array[] = [];
  const last: Uint8Array[] = [];
  const report = load(originId);
  first.push(
    encodeJsonFrame(FrameType.LOAD, BATCH_ITEM, garbles.includes("bad-load") ? [report] : report),
  );
  const usage = { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4, cached_tokens: 0 };
  batch.items.forEach((item, index) => {
    const stream = requests[index]?.stream ?? false;
    const type = stream ? "text/event-stream" : "application/json";
    const head = { id: item.id, status: 200, headers: { "content-type": type } };
    first.push(
      garbles[index] === "bad-head"
        ? encodeFrame(FrameType.HEAD, index, encoder.encode('{"id":'))
        : encodeJsonFrame(FrameType.HEAD, index, head),
    );
    const chunk = stream
      ? 'data: {"object":"chat.completion.chunk"}\n\n'
      : '{"object":"chat.completion"}';
    first.push(encodeFrame(FrameType.DATA, index, encoder.encode(chunk)));
    const trailer =
      garbles[index] === "bad-end" ? { id: item.id, usage } : { id: item.id, outcome: "ok", usage };
    last.push(encodeJsonFrame(FrameType.END, index, trailer));
  });
  last.push(encodeJsonFrame(FrameType.LOAD, BATCH_ITEM, report));
  return { first: concatBytes(first), last: concatBytes(last) };
}

/** A running garbling origin. */
export interface GarbledOrigin {
  url: string;
  server: Server;
}

/**
 * Starts the garbling origin on a free loopback port. A batch with a `bad-end` item holds
 * its END until `POST /release` (at most {@link HOLD_MS}); other batches answer at once.
 */
export async function startGarbledOrigin(originId: string): Promise<GarbledOrigin> {
  let held: (() => void)[] = [];
  const muted = { taken: 0, stopped: 0, frozen: 0, thawed: 0 };
  // Requests frozen mid-stream: their outcome lookups go unanswered too.
  const frozen = new Set<string>();
  // A muted call's item id, and what answers it once the item is cancelled.
  const mutedCalls = new Map<string, () => void>();
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      const silent = text.includes("mute") || text.includes("hang");
      const envelope = () => decodeEnvelope(req.headers["content-type"] ?? "", text);
      if (req.method === "POST" && req.url === "/v1/batch" && text.includes("freeze")) {
        const [item] = BatchRequestSchema.parse(envelope()).items;
        const id = item?.id ?? "";
        muted.frozen++;
        frozen.add(id);
        res.writeHead(200, { "content-type": RAW_BATCH_CONTENT_TYPE });
        const head = { id, status: 200, headers: { "content-type": "text/event-stream" } };
        res.write(
          concatBytes([
            encodeJsonFrame(FrameType.LOAD, BATCH_ITEM, load(originId)),
            encodeJsonFrame(FrameType.HEAD, 0, head),
            encoder.encode('data: {"object":"chat.completion.chunk"}\n\n'),
          ]),
        );
        res.on("close", () => {
          if (frozen.delete(id)) muted.thawed++;
        });
      } else if (
        req.method === "POST" &&
        req.url === "/v1/batch/outcomes" &&
        [...frozen].some((id) => text.includes(id))
      ) {
        // Frozen: never answered; the edge gives up on it.
      } else if (req.method === "POST" && req.url === "/v1/batch" && silent) {
        muted.taken++;
        const [item] = BatchRequestSchema.parse(envelope()).items;
        const id = item?.id ?? "";
        let reports: ReturnType<typeof setInterval> | undefined;
        if (text.includes("hang")) {
          res.writeHead(200, { "content-type": BATCH_CONTENT_TYPE });
          const report = () =>
            res.write(encodeJsonFrame(FrameType.LOAD, BATCH_ITEM, load(originId)));
          report();
          reports = setInterval(report, 50);
        }
        const stop = () => {
          clearInterval(reports);
          if (mutedCalls.delete(id)) muted.stopped++;
        };
        mutedCalls.set(id, () => {
          stop();
          if (!res.headersSent) res.writeHead(200, { "content-type": BATCH_CONTENT_TYPE });
          res.end(encodeJsonFrame(FrameType.END, 0, { id, outcome: "cancelled", usage: null }));
        });
        res.on("close", stop);
      } else if (req.method === "GET" && req.url === "/muted") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(muted));
      } else if (req.method === "POST" && req.url === "/v1/batch") {
        const { first, last } = answer(originId, envelope());
        res.writeHead(200, { "content-type": BATCH_CONTENT_TYPE });
        if (!text.includes("bad-end")) {
          res.end(concatBytes([first, last]));
          return;
        }
        res.write(first);
        const release = () => {
          if (!res.writableEnded) res.end(last);
        };
        held.push(release);
        setTimeout(release, HOLD_MS).unref();
      } else if (req.method === "POST" && req.url === "/release") {
        const releasing = held;
        held = [];
        for (const release of releasing) release();
        res.writeHead(204).end();
      } else if (req.method === "POST" && req.url === "/v1/batch/cancel") {
        const { ids = [] } = JSON.parse(text) as { ids?: string[] };
        for (const id of ids) mutedCalls.get(id)?.();
        res.writeHead(200, { "content-type": "application/json" });
        res.end('{"cancelled":[]}');
      } else if (req.method === "POST" && req.url === "/v1/batch/outcomes") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end('{"items":[]}');
      } else {
        res.writeHead(404).end();
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, server };
}
