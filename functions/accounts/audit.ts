/**
 * Who made an admin call, and the audit entry of what it did (docs/key-account.md, "The
 * audit log"): entries travel with the KeyDirectory write the action makes anyway.
 */
import type { Context } from "hono";
import type { AuditActor, AuditEntry } from "../../durable-objects/key-directory/types.ts";
import { sha256Hex } from "../../contracts/hashing.ts";
import { bearerToken } from "./keys.ts";

/** Every action the audit log records (`GET /admin/audit?action=` takes one of these). */
export const AUDIT_ACTIONS = [
  "key.create",
  "key.update",
  "key.rotate",
  "key.revoke",
  "key.block",
  "key.unblock",
  "team.create",
  "team.update",
  "team.delete",
  "breaker.force",
  "canary.promote",
  "canary.pause",
  "canary.resume",
  "canary.rollback",
] as const;

/** One action the audit log records. */
export type AuditAction = (typeof AUDIT_ACTIONS)[number];

/** Longest name an admin caller may declare in `x-warmgate-actor`; longer ones are cut. */
export const MAX_ACTOR_NAME = 200;

/** The caller of an admin route (behind adminAuth, so its bearer token is the admin token). */
export async function adminActor(c: Context): Promise<AuditActor> {
  const token = bearerToken(c.req.header("authorization")) ?? "";
  const name = c.req.header("x-warmgate-actor")?.trim().slice(0, MAX_ACTOR_NAME) ?? "";
  return {
    credential: `admin:${(await sha256Hex(token)).slice(0, 8)}`,
    name: name === "" ? null : name,
    address: c.req.header("cf-connecting-ip") ?? null,
  };
}

/** The audit entry of an admin action on one object, now. */
export async function auditEntry(
  c: Context,
  action: AuditAction,
  target: { type: string; id: string | null },
  detail: object = {},
): Promise<AuditEntry> {
  return {
    at: Date.now(),
    actor: await adminActor(c),
    action,
    targetType: target.type,
    targetId: target.id,
    detail: JSON.stringify(detail),
  };
}
