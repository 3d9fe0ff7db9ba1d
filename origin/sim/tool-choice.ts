/**
 * What the simulated engine answers with (docs/configuration.md, "The simulated engine"):
 * text, JSON, or a call of one of the offered tools, from `tool_choice` and the format.
 * With `auto`, it calls the first tool that the last user message mentions: the tool's
 * name, or a word of four letters or more from it, as a whole word in any case.
 */
import type { ChatMessage, ToolDefinition } from "./chat-template.ts";
import type { OutputMode } from "./generate.ts";
import { InvalidRequest, invalidType, isRecord } from "./request-fields.ts";

/** The words of a tool's name that count as mentioning it: `get_weather` → `weather`. */
export function nameWords(name: string): string[] {
  const words = name
    .replace(/([a-z0-9])([A-Z])/g, "$1 $2")
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter((w) => w.length >= 4);
  return [name.toLowerCase(), ...words];
}

function messageText(message: ChatMessage): string {
  const { content } = message;
  if (content === null) return "";
  if (typeof content === "string") return content;
  return content.map((part) => (part.type === "text" ? part.text : "")).join(" ");
}

/** The tool `auto` calls: the first one the last message mentions, if that is a user's. */
export function mentionedTool(
  tools: readonly ToolDefinition[],
  messages: readonly ChatMessage[],
): ToolDefinition | null {
  const last = messages.at(-1);
  if (last === undefined || last.role !== "user") return null;
  const text = ` ${messageText(last)
    .toLowerCase()
    .replace(/[^a-z0-9_-]+/g, " ")} `;
  return tools.find((tool) => nameWords(tool.name).some((w) => text.includes(` ${w} `))) ?? null;
}

function call(tool: ToolDefinition): OutputMode {
  return { kind: "tool", name: tool.name, parameters: tool.parameters ?? null };
}

function named(tools: readonly ToolDefinition[], name: unknown, param: string): ToolDefinition {
  const tool = tools.find((t) => t.name === name);
  if (tool === undefined) {
    throw new InvalidRequest(
      `Invalid '${param}': no tool named ${JSON.stringify(name ?? null)} among the provided tools.`,
      param,
      "invalid_value",
    );
  }
  return tool;
}

/**
 * The tool call `tool_choice` asks for, or null for an answer in text or JSON.
 * `flat` reads the Responses API's shapes (`{type: "function", name}`).
 */
export function toolMode(
  choice: unknown,
  tools: readonly ToolDefinition[],
  messages: readonly ChatMessage[],
  flat = false,
): OutputMode | null {
  if (choice !== undefined && choice !== null && tools.length === 0) {
    throw new InvalidRequest(
      "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
      "tool_choice",
      null,
    );
  }
  if (choice === undefined || choice === null || choice === "auto") {
    const tool = mentionedTool(tools, messages);
    return tool === null ? null : call(tool);
  }
  if (choice === "none") return null;
  const first = tools[0];
  if (choice === "required" && first !== undefined) {
    return call(mentionedTool(tools, messages) ?? first);
  }
  if (!isRecord(choice)) {
    throw new InvalidRequest(
      `Invalid value: ${JSON.stringify(choice)}. Supported values are: 'none', 'auto', and 'required'.`,
      "tool_choice",
      "invalid_value",
    );
  }
  switch (choice["type"]) {
    case "function": {
      const fn = flat ? choice : choice["function"];
      const param = flat ? "tool_choice.name" : "tool_choice.function.name";
      return call(named(tools, isRecord(fn) ? fn["name"] : undefined, param));
    }
    case "allowed_tools": {
      const spec = flat ? choice : choice["allowed_tools"];
      if (!isRecord(spec)) throw invalidType("tool_choice.allowed_tools", "an object", spec);
      const list = spec["tools"];
      if (!Array.isArray(list) || list.length === 0) {
        throw invalidType("tool_choice.allowed_tools.tools", "a non-empty array", list);
      }
      const allowed = list.map((t: unknown, i) => {
        const at = `tool_choice.allowed_tools.tools[${i}]`;
        if (!isRecord(t)) throw invalidType(at, "an object", t);
        const fn = isRecord(t["function"]) ? t["function"] : t;
        return named(tools, fn["name"], `${at}.name`);
      });
      const mode = spec["mode"] ?? "auto";
      if (mode !== "auto" && mode !== "required") {
        throw new InvalidRequest(
          `Invalid value: ${JSON.stringify(mode)}. Supported values are: 'auto' and 'required'.`,
          "tool_choice.allowed_tools.mode",
          "invalid_value",
        );
      }
      return toolMode(mode, allowed, messages, flat);
    }
    case "custom":
      throw new InvalidRequest(
        "The simulated engine supports function tools only; tool_choice of type 'custom' names a custom tool.",
        "tool_choice",
        "unsupported_value",
      );
    default:
      throw new InvalidRequest(
        `Invalid value: ${JSON.stringify(choice["type"] ?? null)}. Supported values are: 'function', 'allowed_tools' and 'custom'.`,
        "tool_choice.type",
        "invalid_value",
      );
  }
}

/** Chat's `response_format` as an output mode. */
export function formatMode(format: unknown, param = "response_format"): OutputMode {
  if (format === undefined || format === null) return { kind: "text" };
  if (!isRecord(format)) throw invalidType(param, "an object", format);
  switch (format["type"]) {
    case "text":
      return { kind: "text" };
    case "json_object":
      return { kind: "json", schema: null };
    case "json_schema": {
      // Chat nests the schema under `json_schema`; the Responses API's `text.format` does not.
      const spec = isRecord(format["json_schema"]) ? format["json_schema"] : format;
      return { kind: "json", schema: spec["schema"] ?? null };
    }
    default:
      throw new InvalidRequest(
        `Invalid value: '${String(format["type"])}'. Supported values are: 'text', 'json_object', and 'json_schema'.`,
        `${param}.type`,
        "invalid_value",
      );
  }
}

/** The output mode of a chat request: a tool call, or the response format. */
export function parseMode(
  body: Record<string, unknown>,
  tools: readonly ToolDefinition[],
  messages: readonly ChatMessage[],
): OutputMode {
  return toolMode(body["tool_choice"], tools, messages) ?? formatMode(body["response_format"]);
}
