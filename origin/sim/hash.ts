/**
 * Stable non-cryptographic hashing and a seeded PRNG for the simulated engine.
 *
 * Everything the simulator derives from a request (token ids, block hashes, completion
 * ids, generated text) goes through these, so equal inputs give equal bytes on any host.
 * See docs/configuration.md, "The simulated engine".
 */

const TWO_32 = 4294967296;

/**
 * Incremental 53-bit hash (cyrb53 mixing over 32-bit words) for strings and integers.
 * 53 bits keep values exact as JS numbers, so they can key maps without BigInt.
 */
export class Hasher {
  #h1: number;
  #h2: number;

  constructor(seed = 0) {
    this.#h1 = 0xdeadbeef ^ seed;
    this.#h2 = 0x41c6ce57 ^ seed;
  }

  #word(k: number): void {
    this.#h1 = Math.imul(this.#h1 ^ k, 2654435761);
    this.#h2 = Math.imul(this.#h2 ^ k, 1597334677);
  }

  /** Mixes a string, length-prefixed so adjacent fields cannot run together. */
  str(text: string): this {
    this.#word(text.length);
    for (let i = 0; i < text.length; i++) this.#word(text.charCodeAt(i));
    return this;
  }

  /** Mixes a non-negative integer below 2^53 (token ids, parent hashes, counters). */
  int(value: number): this {
    this.#word(value >>> 0);
    this.#word(Math.floor(value / TWO_32) >>> 0);
    return this;
  }

  /** Mixes a run of 32-bit integers. */
  ints(values: ArrayLike<number>, start = 0, end = values.length): this {
    this.#word(end - start);
    for (let i = start; i < end; i++) this.#word((values[i] ?? 0) >>> 0);
    return this;
  }

  /** The 53-bit digest; the hasher can keep absorbing afterwards. */
  digest(): number {
    let h1 = this.#h1;
    let h2 = this.#h2;
    h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507) ^ Math.imul(h2 ^ (h2 >>> 13), 3266489909);
    h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507) ^ Math.imul(h1 ^ (h1 >>> 13), 3266489909);
    return TWO_32 * (2097151 & h2) + (h1 >>> 0);
  }
}

/** 53-bit hash of one string. */
export function hashString(text: string, seed = 0): number {
  return new Hasher(seed).str(text).digest();
}

/** Lower-case hex of `chars` characters derived from a 53-bit hash (for ids). */
export function hashHex(hash: number, chars: number): string {
  let out = "";
  let lane = 0;
  while (out.length < chars) {
    const word = new Hasher(lane++).int(hash).digest();
    out += word.toString(16).padStart(14, "0");
  }
  return out.slice(0, chars);
}

/** xoshiro128** seeded through splitmix32: fast, small state, good enough for sampling text. */
export class Rng {
  #s0: number;
  #s1: number;
  #s2: number;
  #s3: number;

  constructor(seed: number) {
    let x = (seed >>> 0) ^ Math.floor(seed / TWO_32);
    const next = (): number => {
      x = (x + 0x9e3779b9) | 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.#s0 = next();
    this.#s1 = next();
    this.#s2 = next();
    this.#s3 = next();
  }

  /** Next unsigned 32-bit value. */
  next(): number {
    const result = Math.imul(rotl(Math.imul(this.#s1, 5), 7), 9) >>> 0;
    const t = this.#s1 << 9;
    this.#s2 ^= this.#s0;
    this.#s3 ^= this.#s1;
    this.#s1 ^= this.#s2;
    this.#s0 ^= this.#s3;
    this.#s2 ^= t;
    this.#s3 = rotl(this.#s3, 11);
    return result;
  }

  /** Uniform float in [0, 1). */
  float(): number {
    return this.next() / TWO_32;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.float() * n);
  }

  /** One element of a non-empty array. */
  pick<T>(items: readonly T[]): T {
    const item = items[this.int(items.length)];
    if (item === undefined) throw new RangeError("pick from an empty array");
    return item;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}
