// A JavaScript consumer of the golden vectors (specs/vectors/*.json, schema version 2), and the
// example a non-Python author copies: a small DAPO loss (with its KL penalty) and GAE written from
// the specs (policy_losses.md eqs. (6), (11)-(12), kl.md eqs. (2)-(4), estimators.md eqs. (4)-(5)),
// checked against every dapo policy-loss vector and every gae_advantages vector. Node.js >= 20, no
// packages.
//
//   node tools/consumers/js/check_vectors.mjs [VECTOR_DIR] [--plant-bug]
//
// Exit 0 when every vector passes, 1 when one fails, 2 on a usage or schema error. --plant-bug
// swaps in two classic bugs (DAPO's clip-higher forgotten: the upper bound 1 + eps_low; GAE treating
// a truncated step as terminal), which the vectors must catch.

import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const SCHEMA = "rl-oracle-golden-vectors";
const SCHEMA_VERSION = 2;
// SCHEMA.md "Numbers and tolerance", float64: |got - want| <= rtol |want| + atol abs_scale + floor
const RTOL = 1e-10, ATOL = 1e-12, FLOOR = 2 ** -1068;

class SchemaError extends Error {}

export function load(path) {
  const doc = JSON.parse(readFileSync(path, "utf8"));
  if (doc.schema !== SCHEMA) throw new SchemaError(`${path}: not a golden-vector file`);
  if (doc.schema_version !== SCHEMA_VERSION) {
    throw new SchemaError(`${path}: unsupported schema_version ${doc.schema_version} ` +
      `(this consumer reads version ${SCHEMA_VERSION}; see specs/vectors/SCHEMA.md)`);
  }
  return doc;
}

const num = (s) => Number(s); // decimal strings; "NaN", "Infinity", "-Infinity" parse too

function requireFinite(name, values) {
  for (const v of values) if (!Number.isFinite(v)) throw new RangeError(`${name} contains NaN or inf`);
}

// ------------------------------------------------------------------------------- DAPO policy loss

// logp, oldLogp, refLogp: [N][T] padded; mask: [N][T] booleans; advantages: [N].
// variant: eps_low, eps_high, kl_coef, kl_estimator (token-level ratio, hard clip, token mean).
// Returns [loss, grad] with grad [N][T] = d loss / d logp (0 at padded positions).
export function dapoLoss(logp, oldLogp, advantages, mask, variant, { refLogp = null, normalizer = null,
  plantBug = false } = {}) {
  const n = logp.length;
  if (advantages.length !== n) throw new RangeError(`advantages must have length ${n}`);
  requireFinite("advantages", advantages);
  const lower = 1 - variant.eps_low;
  const upper = 1 + (plantBug ? variant.eps_low : variant.eps_high);
  const beta = variant.kl_coef;
  let tokens = 0;
  for (let i = 0; i < n; i++) {
    for (let t = 0; t < mask[i].length; t++) {
      if (!mask[i][t]) continue; // padded positions never reach the arithmetic
      tokens += 1;
      requireFinite("logp / old_logp / ref_logp", [logp[i][t], oldLogp[i][t], refLogp ? refLogp[i][t] : 0]);
    }
  }
  if (normalizer !== null && !(normalizer > 0 && Number.isFinite(normalizer))) {
    throw new RangeError("normalizer must be finite and > 0");
  }
  const denominator = normalizer ?? Math.max(tokens, 1); // eq. (11): token mean
  let total = 0;
  const grad = logp.map((row) => row.map(() => 0));
  for (let i = 0; i < n; i++) {
    const a = advantages[i];
    for (let t = 0; t < mask[i].length; t++) {
      if (!mask[i][t]) continue;
      const ratio = Math.exp(logp[i][t] - oldLogp[i][t]);
      // eqs. (6)-(7): min(r A, clip(r) A) (and max(., c A) for A < 0 under dual clip), the
      // inclusive gate of seed 001 (116)
      const c = variant.dual_clip;
      const open = a > 0 ? ratio <= upper : ratio >= lower && (c === null || ratio <= c);
      const clipped = a > 0 ? upper * a : (c !== null && ratio > c ? c * a : lower * a);
      total -= open ? ratio * a : clipped;
      let g = open ? -ratio * a : 0;
      if (beta > 0) { // kl.md: log r = ref - logp
        const logR = refLogp[i][t] - logp[i][t];
        const k = { k1: -logR, k2: 0.5 * logR * logR, k3: Math.expm1(logR) - logR }[variant.kl_estimator];
        const dk = { k1: 1, k2: -logR, k3: -Math.expm1(logR) }[variant.kl_estimator];
        total += beta * k;
        g += beta * dk;
      }
      grad[i][t] = g / denominator;
    }
  }
  return [total / denominator, grad];
}

// --------------------------------------------------------------------------------------------- GAE

// rewards, values, nextValues: [N][T]; terminated, truncated: [N][T] 0/1. Returns [advantages, returns].
export function gae(rewards, values, nextValues, terminated, truncated, gamma, lam, { plantBug = false } = {}) {
  if (!(gamma >= 0 && gamma <= 1)) throw new RangeError(`gamma must lie in [0, 1], got ${gamma}`);
  if (!(lam >= 0 && lam <= 1)) throw new RangeError(`lam must lie in [0, 1], got ${lam}`);
  const adv = [], ret = [];
  for (let i = 0; i < rewards.length; i++) {
    const T = rewards[i].length;
    for (const [name, rows] of [["values", values], ["next_values", nextValues], ["terminated", terminated],
      ["truncated", truncated]]) {
      if (rows[i].length !== T) throw new RangeError(`${name} must have the shape of rewards`);
    }
    requireFinite("rewards / values / next_values", [...rewards[i], ...values[i], ...nextValues[i]]);
    const a = new Array(T).fill(0);
    let next = 0;
    for (let t = T - 1; t >= 0; t--) {
      let term = terminated[i][t] === 1, trunc = truncated[i][t] === 1;
      if (term && trunc) throw new RangeError("a step cannot be both terminated and truncated");
      if (plantBug && trunc) [term, trunc] = [true, false];
      // eq. (4): delta = r + gamma [not terminated] V' - V; eq. (5): the trace stops at a segment end
      const delta = rewards[i][t] + (term ? 0 : gamma * nextValues[i][t]) - values[i][t];
      const end = term || trunc || t === T - 1;
      a[t] = delta + (end ? 0 : gamma * lam * next);
      next = a[t];
    }
    adv.push(a);
    ret.push(a.map((x, t) => x + values[i][t]));
  }
  return [adv, ret];
}

// ------------------------------------------------------------------------------------------- checks

const close = (got, want, scale) => Math.abs(got - want) <= RTOL * Math.abs(want) + ATOL * scale + FLOOR;

function padded(rows, fill) {
  const width = Math.max(1, ...rows.map((r) => r.length));
  const x = rows.map((r) => Array.from({ length: width }, (_, t) => (t < r.length ? num(r[t]) : fill)));
  const mask = rows.map((r) => Array.from({ length: width }, (_, t) => t < r.length));
  return [x, mask];
}

function checkPolicy(v, plantBug) {
  const inp = v.inputs;
  const fill = inp.padding_value === null ? -5.5 : num(inp.padding_value);
  const [logp, mask] = padded(inp.logp, fill);
  const [old] = padded(inp.old_logp, fill);
  const ref = inp.ref_logp === null ? null : padded(inp.ref_logp, fill)[0];
  const normalizer = inp.normalizer === null ? null : num(inp.normalizer);
  const [loss, grad] = dapoLoss(logp, old, inp.advantages.map(num), mask, v.variant,
    { refLogp: ref, normalizer, plantBug });
  const e = v.expected, scale = num(e.abs_scale);
  if (!close(loss, num(e.loss), scale)) return `loss: got ${loss}, expected ${e.loss}`;
  const other = e.grad_logp_other_side ?? e.grad_logp; // acceptable: either side of a clip bound
  for (let i = 0; i < e.grad_logp.length; i++) {
    for (let t = 0; t < e.grad_logp[i].length; t++) {
      const g = grad[i][t];
      if (!close(g, num(e.grad_logp[i][t]), scale) && !close(g, num(other[i][t]), scale)) {
        return `grad_logp[${i}][${t}]: got ${g}, expected ${e.grad_logp[i][t]}`;
      }
    }
  }
  return null;
}

function checkGae(v, plantBug) {
  const inp = v.inputs, grid = (rows) => rows.map((r) => r.map(num));
  const [adv, ret] = gae(grid(inp.rewards), grid(inp.values), grid(inp.next_values), inp.terminated,
    inp.truncated, v.arguments.gamma, v.arguments.lam, { plantBug });
  const e = v.expected, scale = num(e.abs_scale);
  for (const [name, got, want] of [["advantages", adv, e.advantages], ["returns", ret, e.returns]]) {
    for (let i = 0; i < want.length; i++) {
      for (let t = 0; t < want[i].length; t++) {
        if (!close(got[i][t], num(want[i][t]), scale)) return `${name}[${i}][${t}]: got ${got[i][t]}, expected ${want[i][t]}`;
      }
    }
  }
  return null;
}

// one vector: a message when it fails, null when it passes (invalid input must throw)
function checkVector(v, check, plantBug) {
  if (v.result === "invalid") {
    try {
      check(v, plantBug);
    } catch {
      return null;
    }
    return `accepted invalid input (${v.reason})`;
  }
  try {
    return check(v, plantBug);
  } catch (err) {
    return `threw ${err.message}`;
  }
}

export function run(vectorDir, { plantBug = false } = {}) {
  const policy = load(join(vectorDir, "policy_loss.json"));
  const returns = load(join(vectorDir, "returns.json"));
  const jobs = [
    ...policy.vectors.filter((v) => v.preset === "dapo").map((v) => [v, checkPolicy]),
    ...returns.vectors.filter((v) => v.estimator === "gae_advantages").map((v) => [v, checkGae]),
  ];
  const failures = [];
  for (const [v, check] of jobs) {
    const message = checkVector(v, check, plantBug);
    if (message) failures.push(`${v.id} [${v.flags.join(", ")}]: ${message}`);
  }
  return { checked: jobs.length, failures };
}

function main(argv) {
  const here = dirname(fileURLToPath(import.meta.url));
  const args = argv.filter((a) => !a.startsWith("--"));
  const plantBug = argv.includes("--plant-bug");
  const vectorDir = resolve(args[0] ?? join(here, "..", "..", "..", "specs", "vectors"));
  let result;
  try {
    result = run(vectorDir, { plantBug });
  } catch (err) {
    if (err instanceof SchemaError || err.code === "ENOENT") {
      console.error(`error: ${err.message}`);
      return 2;
    }
    throw err;
  }
  const { checked, failures } = result;
  console.log(`${failures.length ? "FAIL" : "PASS"}: ${checked} vectors checked (dapo policy loss, GAE), ` +
    `${failures.length} failed${plantBug ? " (planted bugs)" : ""}`);
  for (const line of failures.slice(0, 20)) console.log(`  ${line}`);
  if (failures.length > 20) console.log(`  ... and ${failures.length - 20} more`);
  return failures.length ? 1 : 0;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = main(process.argv.slice(2));
}
