/**
 * A request's own tags, from `x-warmgate-tags` (comma-separated): each a tag as a key's
 * tags are (`TAG_PATTERN`), at most `MAX_REQUEST_TAGS`, repeats dropped; recorded on the
 * request's ledger row beside its key's tags. See docs/api.md, "Tags".
 */
import { invalidRequest } from "../../contracts/errors.ts";
import { MAX_REQUEST_TAGS, TAG_PATTERN } from "../../contracts/tags.ts";

/** The header a request names its tags in. */
export const TAGS_HEADER = "x-warmgate-tags";

/** The request's tags (none without the header); 400 `invalid_value` for a bad one. */
export function requestTags(header: string | undefined): string[] {
  if (header === undefined || header.trim() === "") return [];
  const tags = [...new Set(header.split(",").map((tag) => tag.trim()))];
  const bad = tags.find((tag) => !TAG_PATTERN.test(tag));
  if (bad !== undefined) {
    throw invalidRequest(
      `${TAGS_HEADER} holds '${bad.slice(0, 64)}', which is not a tag: 1 to 64 letters, digits or _ . : = / @ + -, comma-separated.`,
      TAGS_HEADER,
      "invalid_value",
    );
  }
  if (tags.length > MAX_REQUEST_TAGS) {
    throw invalidRequest(
      `${TAGS_HEADER} names ${tags.length} tags; at most ${MAX_REQUEST_TAGS} are allowed.`,
      TAGS_HEADER,
      "invalid_value",
    );
  }
  return tags;
}
