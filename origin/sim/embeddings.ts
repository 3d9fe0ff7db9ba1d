/**
 * Embeddings of the simulated engine (docs/configuration.md, "The simulated engine"):
 * each token stands for a fixed pseudo-random direction and a text's vector is their
 * normalised sum, so texts that share words are close; `dimensions` shortens a vector and
 * normalises it again, as OpenAI's text-embedding-3 models do; `base64` is little-endian
 * float32.
 */
import { Hasher, Rng } from "./hash.ts";
import { InvalidRequest, arrayTooLong, invalidType, isRecord } from "./request-fields.ts";
import { tokenize } from "./tokenizer.ts";

/** Vector size of an embedding model without `dimensions` of its own. */
export const DEFAULT_EMBEDDING_DIMENSIONS = 768;
/** Most inputs in one request (OpenAI's limit). */
export const MAX_EMBEDDING_INPUTS = 2048;

/** What an embeddings request asks for. */
export interface EmbeddingFields {
  /** Tokens of each input. */
  inputs: number[][];
  dimensions: number;
  encoding: "float" | "base64";
}

function isTokens(value: unknown): value is number[] {
  return Array.isArray(value) && value.every((t) => Number.isInteger(t) && (t as number) >= 0);
}

function inputTokens(input: unknown): number[][] {
  if (typeof input === "string") return [tokenize(input)];
  if (isTokens(input) && input.length > 0) return [input];
  if (Array.isArray(input) && input.length > 0) {
    if (input.length > MAX_EMBEDDING_INPUTS) {
      throw arrayTooLong("input", MAX_EMBEDDING_INPUTS, input.length);
    }
    if (input.every((i) => typeof i === "string")) return input.map((i: string) => tokenize(i));
    if (input.every(isTokens)) return input.map((i: number[]) => [...i]);
  }
  throw invalidType("input", "a string, an array of strings or an array of token arrays", input);
}

/** Reads `input`, `dimensions` and `encoding_format` for a model of `size` dimensions. */
export function parseEmbeddingFields(body: Record<string, unknown>, size: number): EmbeddingFields {
  const inputs = inputTokens(body["input"]);
  inputs.forEach((tokens, i) => {
    if (tokens.length === 0) {
      throw new InvalidRequest(
        `Invalid 'input[${i}]': an input must not be empty.`,
        "input",
        "invalid_value",
      );
    }
  });
  const raw = body["dimensions"];
  let dimensions = size;
  if (raw !== undefined && raw !== null) {
    if (!Number.isInteger(raw) || (raw as number) < 1 || (raw as number) > size) {
      throw new InvalidRequest(
        `Invalid 'dimensions': expected an integer from 1 to ${size}, but got ${JSON.stringify(raw)} instead.`,
        "dimensions",
        "invalid_value",
      );
    }
    dimensions = raw as number;
  }
  const format = body["encoding_format"] ?? "float";
  if (format !== "float" && format !== "base64") {
    throw new InvalidRequest(
      `Invalid value: ${JSON.stringify(format)}. Supported values are: 'float' and 'base64'.`,
      "encoding_format",
      "invalid_value",
    );
  }
  if (body["user"] !== undefined && typeof body["user"] !== "string" && !isRecord(body["user"])) {
    throw invalidType("user", "a string", body["user"]);
  }
  return { inputs, dimensions, encoding: format };
}

const directions = new Map<number, Float64Array>();
const MAX_CACHED_DIRECTIONS = 16_384;

function direction(token: number, size: number, seed: number): Float64Array {
  const key = token * 31 + seed;
  let v = directions.get(key);
  if (v === undefined || v.length !== size) {
    const rng = new Rng(new Hasher(0x656d62).int(seed).int(token).digest());
    v = new Float64Array(size);
    for (let i = 0; i < size; i++) v[i] = rng.float() * 2 - 1;
    if (directions.size >= MAX_CACHED_DIRECTIONS) directions.clear();
    directions.set(key, v);
  }
  return v;
}

/** The unit vector of one input's tokens, `dimensions` long. */
export function embed(tokens: readonly number[], size: number, dimensions: number, seed: number) {
  const sum = new Float64Array(size);
  for (const token of tokens) {
    const d = direction(token, size, seed);
    for (let i = 0; i < size; i++) sum[i] = (sum[i] ?? 0) + (d[i] ?? 0);
  }
  let norm = 0;
  for (let i = 0; i < dimensions; i++) norm += (sum[i] ?? 0) ** 2;
  const scale = norm === 0 ? 0 : 1 / Math.sqrt(norm);
  const out = new Float32Array(dimensions);
  for (let i = 0; i < dimensions; i++) out[i] = (sum[i] ?? 0) * scale;
  return out;
}

/** The `POST /v1/embeddings` answer. */
export function embeddingsJson(
  model: string,
  fields: EmbeddingFields,
  size: number,
  seed: number,
): unknown {
  const prompt = fields.inputs.reduce((sum, tokens) => sum + tokens.length, 0);
  return {
    object: "list",
    data: fields.inputs.map((tokens, index) => {
      const vector = embed(tokens, size, fields.dimensions, seed);
      return {
        object: "embedding",
        index,
        embedding:
          fields.encoding === "float"
            ? Array.from(vector, (x) => Math.round(x * 1e7) / 1e7)
            : Buffer.from(vector.buffer, vector.byteOffset, vector.byteLength).toString("base64"),
      };
    }),
    model,
    usage: { prompt_tokens: prompt, total_tokens: prompt },
  };
}
