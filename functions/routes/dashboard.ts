/**
 * The dashboard's page and files (`GET /`, `/app.js`, `/style.css`, `/vendor/…`), served
 * from strings bundled into the Worker (functions/dashboard/assets.ts), with a content
 * security policy that allows only its own scripts, styles and API. No secret is needed
 * to load it: the page asks for the admin token and keeps it out of every URL.
 * See docs/metrics.md, "Dashboard".
 */
import { Hono } from "hono";
import { DASHBOARD_ASSETS } from "../dashboard/assets.ts";

const SECURITY_HEADERS = {
  "content-security-policy":
    "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-cache",
};

/** The dashboard route group, mounted at `/`. */
export const dashboard = new Hono();
for (const [path, asset] of Object.entries(DASHBOARD_ASSETS)) {
  dashboard.get(path, (c) =>
    c.body(asset.body, 200, { "content-type": asset.type, ...SECURITY_HEADERS }),
  );
}
