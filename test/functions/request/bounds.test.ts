import { describe, expect, it } from "vitest";
import {
  MAX_BODY_DEPTH,
  MAX_SCHEMA_DEPTH,
  SCHEMA_PATHS,
  findDeepNesting,
  nestingTooDeep,
} from "../../../functions/request/bounds.ts";

/** JSON text of an object nested `depth` levels deep: `{"a":{"a":…{}}}`. */
const nested = (depth: number) => `${'{"a":'.repeat(depth - 1)}{}${"}".repeat(depth - 1)}`;

const tool = (depth: number) =>
  `{"type":"function","function":{"name":"f","parameters":${nested(depth)}}}`;

const chat = (fields: string) => findDeepNesting(`{"model":"m",${fields}}`, SCHEMA_PATHS.chat);

describe("findDeepNesting", () => {
  it("names a too-deep schema with its full depth", () => {
    expect(
      chat(`"response_format":{"type":"json_schema","json_schema":{"schema":${nested(100_000)}}}`),
    ).toEqual({
      path: ["response_format", "json_schema", "schema"],
      depth: 100_000,
      limit: MAX_SCHEMA_DEPTH,
    });
  });

  it("allows a schema exactly as deep as the limit", () => {
    expect(chat(`"tools":[${tool(3)},${tool(MAX_SCHEMA_DEPTH)}]`)).toBeUndefined();
    expect(chat(`"tools":[${tool(3)},${tool(MAX_SCHEMA_DEPTH + 1)}]`)).toEqual({
      path: ["tools", 1, "function", "parameters"],
      depth: MAX_SCHEMA_DEPTH + 1,
      limit: MAX_SCHEMA_DEPTH,
    });
  });

  it("gives other fields the body's depth, less the body's own level", () => {
    expect(chat(`"guided_json":${nested(MAX_BODY_DEPTH - 1)}`)).toBeUndefined();
    expect(chat(`"guided_json":${nested(MAX_BODY_DEPTH)}`)).toMatchObject({
      path: ["guided_json"],
      limit: MAX_BODY_DEPTH - 1,
    });
    const array = `${"[".repeat(MAX_BODY_DEPTH + 1)}${"]".repeat(MAX_BODY_DEPTH + 1)}`;
    expect(findDeepNesting(array, [])).toEqual({
      path: [],
      depth: MAX_BODY_DEPTH + 1,
      limit: MAX_BODY_DEPTH,
    });
  });

  it("ignores brackets, commas and quotes inside strings", () => {
    const text = JSON.stringify('[{,"'.repeat(10_000));
    expect(chat(`"messages":[{"role":"user","content":${text}}]`)).toBeUndefined();
    const schema = `{"description":${JSON.stringify('",[{')},"properties":${nested(MAX_SCHEMA_DEPTH)}}`;
    expect(chat(`"functions":[{"name":"f","parameters":${schema}}]`)).toMatchObject({
      path: ["functions", 0, "parameters"],
      depth: MAX_SCHEMA_DEPTH + 1,
    });
  });

  it("reads escaped keys as the parser will", () => {
    const body = `"response_format":{"json_schema":{"sch\\u0065ma":${nested(MAX_SCHEMA_DEPTH + 1)}}}`;
    expect(chat(body)?.path).toEqual(["response_format", "json_schema", "schema"]);
  });

  it("uses each endpoint's own schema paths", () => {
    const body = `{"text":{"format":{"schema":${nested(MAX_SCHEMA_DEPTH + 1)}}}}`;
    expect(findDeepNesting(body, SCHEMA_PATHS.responses)?.path).toEqual([
      "text",
      "format",
      "schema",
    ]);
    expect(findDeepNesting(body, SCHEMA_PATHS.chat)).toBeUndefined();
  });
});

describe("nestingTooDeep", () => {
  it("is OpenAI's 400 naming the field and the limit", () => {
    const error = nestingTooDeep({
      path: ["tools", 0, "function", "parameters"],
      depth: 70,
      limit: 64,
    });
    expect({ status: error.status, ...error.toBody().error }).toEqual({
      status: 400,
      message: "'tools[0].function.parameters' is nested 70 levels deep; at most 64 are allowed.",
      type: "invalid_request_error",
      param: "tools[0].function.parameters",
      code: "json_above_max_depth",
    });
    expect(nestingTooDeep({ path: [], depth: 200, limit: 128 }).toBody().error).toMatchObject({
      message: "The request body is nested 200 levels deep; at most 128 are allowed.",
      param: null,
    });
  });
});
