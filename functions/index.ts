import { Hono } from "hono";

/** The warmgate edge Worker. */
const app = new Hono<{ Bindings: Env }>();

app.get("/health", (c) => c.json({ status: "ok" }));

export default app satisfies ExportedHandler<Env>;
export { KeyAccount } from "../durable-objects/key-account.ts";
export { KeyDirectory } from "../durable-objects/key-directory.ts";
