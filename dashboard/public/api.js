// The admin API as the dashboard calls it (docs/metrics.md, "Dashboard"): the admin token
// lives in this tab's session storage and travels only in the Authorization header, never
// in a URL; the name typed at sign-in travels in `x-warmgate-actor` for the audit log.
// Being a header, not a cookie, it is never sent by another site's page (no CSRF).

const TOKEN_KEY = "warmgate-admin-token";
const ACTOR_KEY = "warmgate-admin-actor";

let onRefused = () => {};

/** An answer other than 2xx, with the OpenAI error's message and code when it had one. */
export class ApiFailure extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Keeps the admin token (and the caller's name) for this tab. */
export function signIn(token, actor) {
  sessionStorage.setItem(TOKEN_KEY, token);
  if (actor) sessionStorage.setItem(ACTOR_KEY, actor);
  else sessionStorage.removeItem(ACTOR_KEY);
}

/** Forgets them. */
export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(ACTOR_KEY);
}

/** Whether this tab holds a token. */
export function hasToken() {
  return sessionStorage.getItem(TOKEN_KEY) !== null;
}

/** Called when the API refuses the token (401): the page signs out. */
export function whenRefused(handler) {
  onRefused = handler;
}

function headers(extra = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token === null) throw new ApiFailure(401, "Not signed in.", "invalid_admin_token");
  const actor = sessionStorage.getItem(ACTOR_KEY);
  return {
    authorization: `Bearer ${token}`,
    ...(actor ? { "x-warmgate-actor": actor } : {}),
    ...extra,
  };
}

async function send(method, path, body) {
  const init = {
    method,
    headers: headers(body === undefined ? {} : { "content-type": "application/json" }),
  };
  if (body !== undefined) init.body = JSON.stringify(body);
  const res = await fetch(path, init);
  if (res.ok) return res;
  let message = `${method} ${path.split("?")[0]} answered ${res.status}`;
  let code = null;
  try {
    const error = (await res.json()).error;
    if (error?.message) message = error.message;
    code = error?.code ?? null;
  } catch {
    // Not JSON: keep the status line.
  }
  if (res.status === 401) {
    signOut();
    onRefused("That admin token was refused.");
  }
  throw new ApiFailure(res.status, message, code);
}

/** Calls the admin API and answers its JSON. */
export async function api(method, path, body) {
  return (await send(method, path, body)).json();
}

/** Fetches a file with the token in its header and hands it to the browser as a download. */
export async function download(path, filename) {
  const blob = await (await send("GET", path)).blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = filename;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
}

/** A path with query parameters, leaving out the empty ones. */
export function withQuery(path, params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") query.set(name, String(value));
  }
  const text = query.toString();
  return text === "" ? path : `${path}?${text}`;
}
