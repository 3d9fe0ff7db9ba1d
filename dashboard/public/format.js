// The dashboard's small helpers for text, tables and numbers (docs/metrics.md, "Dashboard").

/** The element with this id. */
export const $ = (id) => document.getElementById(id);

/** Sets a node's text (never HTML: every value shown may come from a client). */
export function text(node, value) {
  node.textContent = value;
}

/** A new element with text or children, and attributes. */
export function el(tag, content = "", attributes = {}) {
  const node = document.createElement(tag);
  if (Array.isArray(content)) content.forEach((child) => node.append(child));
  else if (content instanceof Node) node.append(content);
  else node.textContent = content;
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

/**
 * Replaces a table body's rows; a cell is `[value, className]`, or an element (a button).
 */
export function fill(tbody, rows) {
  tbody.replaceChildren(
    ...rows.map((values) => {
      const tr = document.createElement("tr");
      for (const value of values) {
        const td = document.createElement("td");
        if (value instanceof Node) td.append(value);
        else {
          td.textContent = value[0];
          if (value[1]) td.className = value[1];
        }
        tr.append(td);
      }
      return tr;
    }),
  );
}

// USD with six decimal places, more where an amount needs them (billing is exact to the
// pico-dollar: docs/edge.md, "Pricing").
export function usd(x) {
  return x === null || x === undefined ? "–" : x.toFixed(12).replace(/0{1,6}$/, "");
}

/** A ratio as a percentage. */
export function percent(x) {
  return x === null || x === undefined ? "–" : `${(x * 100).toFixed(1)}%`;
}

/** Unix seconds as the browser's local date and time. */
export function when(seconds) {
  return seconds === null || seconds === undefined
    ? "–"
    : new Date(seconds * 1000).toLocaleString();
}

/** A button whose accessible name says what it does to what. */
export function actionButton(label, name, onClick, disabled = false) {
  const button = el("button", label, { type: "button", "aria-label": `${label} ${name}` });
  button.disabled = disabled;
  button.addEventListener("click", onClick);
  return button;
}

/** A key's or a team's budgets in words: `1d $5.000000 · credit $20.000000`, or `none`. */
export function budgets(record) {
  const parts = [
    ...(record.budgets ?? []).map((b) => [b.period, b.max_usd]),
    ["credit", record.limits.credit_usd],
  ].filter(([, amount]) => amount !== null && amount !== undefined);
  return parts.length === 0 ? "none" : parts.map(([n, a]) => `${n} ${usd(a)}`).join(" · ");
}

/** Budgets from a text box, one a line: `period max_usd [soft_usd]` (`1d 5`, `7d 20 15`). */
export function budgetList(id) {
  return $(id)
    .value.split("\n")
    .map((line) => line.trim().split(/\s+/))
    .filter((parts) => parts[0] !== "")
    .map(([period, max, soft]) => ({
      period,
      max_usd: Number(max),
      soft_usd: soft === undefined ? null : Number(soft),
    }));
}

/** Budgets as a text box shows them, one a line (see {@link budgetList}). */
export function budgetText(list) {
  return (list ?? [])
    .map((b) => [b.period, b.max_usd, ...(b.soft_usd === null ? [] : [b.soft_usd])].join(" "))
    .join("\n");
}
