// A JavaScript consumer of the golden vectors (specs/vectors/*.json, schema version 2), and the
// example a non-Python author copies: the policy-loss family (every preset of policy_loss.json:
// ppo, grpo, dr_grpo, dapo, bnpo, gspo, gspo_token, sapo, cispo, and the aggregation seq_mean_token_sum
// (dr_grpo+token_sum, gspo+token_sum), with dual clip and the k1 / k2 / k3 KL penalty), the KL
// estimators and GAE, written from the specs (policy_losses.md eqs. (1)-(12),
// kl.md eqs. (2)-(4), estimators.md eqs. (4)-(5)) in plain float64, checked against every
// policy_loss vector, every kl vector and every gae_advantages vector. Node.js >= 20, no packages.
//
//   node tools/consumers/js/check_vectors.mjs [VECTOR_DIR] [--only=SELECTOR,...] [--plant-bug[=NAME,...]]
//
// Exit 0 when every vector passes, 1 when one fails, 2 on a usage error, 3 when a vector file is
// invalid (validate: one line naming the file, the vector and the field; the other files are still
// checked). --plant-bug
// swaps in classic bugs (all of them, or those named; BUGS lists them), which the vectors must catch.
// An invalid vector passes only when the code throws RangeError (SCHEMA.md, "Rejecting an invalid
// vector"); --help prints the usage (HELP).

import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const SCHEMA = "rl-oracle-golden-vectors";
const SCHEMA_VERSION = 2;
// SCHEMA.md "Numbers and tolerance", float64: |got - want| <= rtol |want| + atol abs_scale + floor
const RTOL = 1e-10, ATOL = 1e-12, FLOOR = 2 ** -1068;

class SchemaError extends Error {}

// A vector file after checking it against SCHEMA.md (validate): a SchemaError of one line naming
// the file, the vector and the field otherwise (unreadable, truncated JSON, another version...).
export function load(path) {
  let doc;
  try {
    doc = JSON.parse(readFileSync(path, "utf8"));
  } catch (err) {
    throw new SchemaError(`${path}: ${err.code ? `cannot be read (${err.code})` : `not valid JSON (${err.message})`}`);
  }
  if (doc === null || typeof doc !== "object" || doc.schema !== SCHEMA) {
    throw new SchemaError(`${path}: not a golden-vector file`);
  }
  if (doc.schema_version !== SCHEMA_VERSION) {
    throw new SchemaError(`${path}: unsupported schema_version ${doc.schema_version} ` +
      `(this consumer reads version ${SCHEMA_VERSION}; see specs/vectors/SCHEMA.md)`);
  }
  const problems = validate(doc);
  if (problems.length) {
    const more = problems.length > 1 ? ` (and ${problems.length - 1} more problems)` : "";
    throw new SchemaError(`${path}: ${problems[0]}${more}`);
  }
  return doc;
}

// ----------------------------------------------------------------------------------------- schema

// What each vector of the kinds read here must hold (SCHEMA.md), so that a corrupted file is
// reported as such before any vector runs and never passes or fails the implementation.
const RESULTS = ["valid", "invalid", "acceptable"];
const POLICY_INPUTS = ["logp", "old_logp", "advantages", "ref_logp", "normalizer", "padding_value"];
const SCHEMAS = {
  policy_loss: { keys: ["variant"], inputs: () => POLICY_INPUTS, expected: (v) => ["loss", "grad_logp",
    ...(v.result === "acceptable" ? ["grad_logp_other_side"] : [])] },
  kl: { keys: ["estimator"], inputs: () => ["logp", "ref_logp"], expected: () => ["value", "d_value_d_logp"] },
  returns: { keys: ["estimator", "arguments"],
    inputs: () => ["rewards", "values", "next_values", "terminated", "truncated"],
    expected: (v) => ({ gae_advantages: ["advantages", "returns"], td_errors: ["td_errors"] }[v.estimator]
      ?? ["returns"]) },
};
const FLAG_INPUTS = new Set(["terminated", "truncated"]); // 0 / 1 (or true / false)
// how deep each field's lists nest (0: a number): a ragged [N][T_i] is 2, a token 0
const DEPTHS = {
  policy_loss: { logp: 2, old_logp: 2, ref_logp: 2, advantages: 1, normalizer: 0, padding_value: 0, loss: 0,
    grad_logp: 2, grad_logp_other_side: 2, abs_scale: 0 },
  kl: { logp: 0, ref_logp: 0, value: 0, d_value_d_logp: 0, abs_scale: 0 },
  returns: { rewards: 2, values: 2, next_values: 2, terminated: 2, truncated: 2, advantages: 2, returns: 2,
    td_errors: 2, abs_scale: 0 },
};

function depthProblem(x, depth, field) {
  if (depth === 0) return Array.isArray(x) ? `${field}: a list where a number belongs` : null;
  if (!Array.isArray(x)) return `${field}: ${JSON.stringify(x)} where a list belongs`;
  for (let i = 0; i < x.length; i++) {
    const problem = depthProblem(x[i], depth - 1, `${field}[${i}]`);
    if (problem) return problem;
  }
  return null;
}

const isNumber = (x, flag) => (typeof x === "number" && Number.isFinite(x)) || (flag && typeof x === "boolean") ||
  (typeof x === "string" && x.trim() !== "" && !Number.isNaN(Number(x))) || x === "NaN";

// The first leaf under x that is not a number, as "field[i][j]: problem"; null when all are.
function leafProblem(x, field, flag = false) {
  if (Array.isArray(x)) {
    for (let i = 0; i < x.length; i++) {
      const problem = leafProblem(x[i], `${field}[${i}]`, flag);
      if (problem) return problem;
    }
    return null;
  }
  if (x !== null && typeof x === "object") {
    for (const [key, item] of Object.entries(x)) {
      const problem = leafProblem(item, `${field}.${key}`, flag);
      if (problem) return problem;
    }
    return null;
  }
  return isNumber(x, flag) ? null : `${field}: ${JSON.stringify(x)} is not a number`;
}

function vectorProblem(kind, v) {
  if (v === null || typeof v !== "object" || Array.isArray(v)) return "is not an object";
  if (typeof v.id !== "string" || !v.id) return "id: missing or not a non-empty string";
  if (!Array.isArray(v.flags) || !v.flags.every((f) => typeof f === "string")) return "flags: missing or not a list of names";
  if (!RESULTS.includes(v.result)) return `result: ${JSON.stringify(v.result)} is not one of ${RESULTS.join(", ")}`;
  if (v.result !== "valid" && typeof v.reason !== "string") return `reason: a ${v.result} vector needs a reason (a string)`;
  const schema = SCHEMAS[kind];
  if (!schema) return null;
  for (const key of schema.keys) if (!(key in v)) return `${key}: missing`;
  if (v.inputs === null || typeof v.inputs !== "object" || Array.isArray(v.inputs)) return "inputs: missing or not an object";
  for (const key of schema.inputs(v)) {
    if (!(key in v.inputs)) return `inputs.${key}: missing`;
    if (v.inputs[key] !== null) {
      const problem = leafProblem(v.inputs[key], `inputs.${key}`, FLAG_INPUTS.has(key)) ||
        depthProblem(v.inputs[key], DEPTHS[kind][key], `inputs.${key}`);
      if (problem) return problem;
    }
  }
  if (kind === "returns") {
    for (const key of ["gamma", ...(v.estimator === "gae_advantages" ? ["lam"] : [])]) {
      if (typeof v.arguments?.[key] !== "number") return `arguments.${key}: missing or not a JSON number`;
    }
  }
  if (kind === "policy_loss" && (v.variant === null || typeof v.variant !== "object")) return "variant: not an object";
  if (v.result === "invalid") return null;
  const e = v.expected;
  if (e === null || typeof e !== "object" || Array.isArray(e)) return `expected: missing or not an object`;
  for (const key of [...schema.expected(v), "abs_scale"]) {
    if (!(key in e)) return `expected.${key}: missing`;
    const problem = depthProblem(e[key], DEPTHS[kind][key], `expected.${key}`);
    if (problem) return problem;
  }
  return leafProblem(e, "expected");
}

// Every way a parsed file breaks the schema, one line each ("vector ID: field: problem"); a file
// with no vector is invalid (it could only pass by checking nothing), and so is a repeated id.
export function validate(doc) {
  if (typeof doc.kind !== "string") return ["kind: missing or not a string"];
  if (!Array.isArray(doc.vectors) || doc.vectors.length === 0) {
    return [`vectors: ${Array.isArray(doc.vectors) ? "an empty list" : "missing or not a list"} ` +
      "(a file must hold at least one vector)"];
  }
  const problems = [], seen = new Set();
  doc.vectors.forEach((v, index) => {
    const id = v && typeof v.id === "string" && v.id ? v.id : null;
    let problem = vectorProblem(doc.kind, v);
    if (!problem && seen.has(id)) problem = "id: repeated (ids are unique within a file)";
    if (problem) problems.push(`${id ? `vector ${id}` : `vector #${index} (no id)`}: ${problem}`);
    seen.add(id);
  });
  return problems;
}

const num = (s) => Number(s); // decimal strings; "NaN", "Infinity", "-Infinity" parse too

function requireFinite(name, values) {
  for (const v of values) if (!Number.isFinite(v)) throw new RangeError(`${name} contains NaN or inf`);
}

// ------------------------------------------------------------------------------------------ bugs

// The planted bugs (--plant-bug=NAME): each is a classic slip the vectors must catch.
export const BUGS = {
  clip_higher: "the upper clip bound 1 + eps_low: DAPO's clip-higher forgotten (eps_high := eps_low)",
  empty_rows: "sequence means divide by every row, empty ones included",
  sapo_one_tau: "SAPO's temperature tau_pos for negative advantages too",
  no_dual_clip: "the dual-clip bound c ignored",
  naive_k3: "k3 as exp(x) - 1 - x (cancels for tiny |log r|)",
  gae_truncation: "GAE treats a truncated step as terminal (no bootstrap)",
};

// ---------------------------------------------------------------------------------------- KL (kl.md)

// log r = ref - logp. Returns [value, d value / d logp] (eqs. (2)-(4)); k3 without cancellation:
// its Taylor series for |log r| < 1e-2, else expm1(log r) - log r.
export function kl(estimator, logp, refLogp, { bugs = new Set() } = {}) {
  requireFinite("logp / ref_logp", [logp, refLogp]);
  const x = refLogp - logp;
  if (estimator === "k1") return [-x, 1];
  if (estimator === "k2") return [0.5 * x * x, -x];
  if (estimator !== "k3") throw new RangeError(`unknown KL estimator ${estimator}`);
  if (bugs.has("naive_k3")) return [Math.exp(x) - 1 - x, 1 - Math.exp(x)];
  if (Math.abs(x) < 1e-2) {
    const series = x * x * (1 / 2 + x * (1 / 6 + x * (1 / 24 + x * (1 / 120 + x * (1 / 720 + x / 5040)))));
    return [series, -Math.expm1(x)];
  }
  return [Math.expm1(x) - x, -Math.expm1(x)];
}

// ------------------------------------------------------------------------------ policy loss family

const sigmoidTerms = (z) => { // [sigmoid(z), sigmoid(z) (1 - sigmoid(z))] without overflow
  const e = Math.exp(-Math.abs(z));
  const s = z >= 0 ? 1 / (1 + e) : e / (1 + e);
  return [s, e / ((1 + e) * (1 + e))];
};

// The gate of one unit (eqs. (6)-(9)): [f, df/dr, df/d(unit log-prob)] for ratio r, advantage a.
function gate(variant, r, a, unitLogp, bugs) {
  const epsHigh = bugs.has("clip_higher") ? variant.eps_low : variant.eps_high;
  const upper = epsHigh === null ? null : 1 + epsHigh;
  const lower = variant.eps_low === null ? null : 1 - variant.eps_low;
  if (variant.gate === "clip") { // the inclusive gate of eqs. (6)-(7); the dual clip for A < 0
    const c = bugs.has("no_dual_clip") ? null : variant.dual_clip;
    if (a > 0) return upper === null || r <= upper ? [r * a, a, 0] : [upper * a, 0, 0];
    if (lower !== null && r < lower) return [lower * a, 0, 0];
    if (c !== null && r > c) return [c * a, 0, 0];
    return [r * a, a, 0];
  }
  if (variant.gate === "sapo") { // (4 / tau) sigmoid(tau (r - 1)) a
    const tau = a > 0 || bugs.has("sapo_one_tau") ? variant.tau_pos : variant.tau_neg;
    const [s, ds] = sigmoidTerms(tau * (r - 1));
    return [(4 / tau) * s * a, 4 * ds * a, 0];
  }
  if (variant.gate === "cispo") { // sg(clip(r)) a logp_unit: no gradient through the ratio
    let w = r;
    if (lower !== null) w = Math.max(w, lower);
    if (upper !== null) w = Math.min(w, upper);
    return [w * a * unitLogp, 0, w * a];
  }
  if (variant.gate === "none") return [r * a, a, 0];
  throw new RangeError(`unsupported gate ${variant.gate}`);
}

function checkVariant(variant) {
  const supported = variant.kl_scale === "token" && variant.entropy_coef === 0 &&
    variant.behavior_correction === "none" && variant.aggregation !== "seq_sqrt_token_mean";
  if (!supported) throw new RangeError("unsupported variant (kl_scale, entropy, behaviour correction)");
}

// logp, oldLogp, refLogp: [N][T] padded; mask: [N][T] booleans; advantages: [N] per sequence.
// variant: the vector's variant (ratio, gate, eps_low / eps_high (null: no bound), dual_clip,
// tau_pos / tau_neg, aggregation, max_length, kl_coef, kl_estimator). Returns [loss, grad] with
// grad [N][T] = d loss / d logp (0 at padded positions). Eq. (12): loss = (1/D) sum_i c_i.
export function policyLoss(logp, oldLogp, advantages, mask, variant, { refLogp = null, normalizer = null,
  bugs = new Set() } = {}) {
  checkVariant(variant);
  const n = logp.length;
  if (advantages.length !== n) throw new RangeError(`advantages must have length ${n}`);
  requireFinite("advantages", advantages);
  const beta = variant.kl_coef;
  if (beta > 0 && refLogp === null) throw new RangeError("ref_logp is required when kl_coef > 0");
  const lengths = mask.map((row) => row.filter(Boolean).length);
  for (let i = 0; i < n; i++) {
    for (let t = 0; t < mask[i].length; t++) {
      if (!mask[i][t]) continue; // padded positions never reach the arithmetic
      requireFinite("logp / old_logp / ref_logp", [logp[i][t], oldLogp[i][t], beta > 0 ? refLogp[i][t] : 0]);
    }
  }
  if (normalizer !== null && !(normalizer > 0 && Number.isFinite(normalizer))) {
    throw new RangeError("normalizer must be finite and > 0");
  }
  const agg = variant.aggregation;
  if (agg === "seq_sum" && !(Math.max(0, ...lengths) <= variant.max_length)) { // L_max bounds every length
    throw new RangeError(`max_length (L_max = ${variant.max_length}) must be >= every sequence's length`);
  }
  const rows = bugs.has("empty_rows") ? n : lengths.filter((T) => T > 0).length;
  const local = { token_mean: lengths.reduce((x, y) => x + y, 0), seq_mean_token_mean: rows, seq_mean: rows,
    seq_mean_token_sum: rows, seq_sum: rows * variant.max_length }[agg]; // eq. (11)
  if (local === undefined || Number.isNaN(local)) throw new RangeError(`unsupported aggregation ${agg}`);
  const D = normalizer ?? Math.max(local, 1);
  let total = 0;
  const grad = logp.map((row) => row.map(() => 0));
  for (let i = 0; i < n; i++) {
    const T = lengths[i];
    if (T === 0) continue;
    const a = advantages[i];
    const cols = [];
    for (let t = 0; t < mask[i].length; t++) if (mask[i][t]) cols.push(t);
    const l = cols.map((t) => logp[i][t] - oldLogp[i][t]); // eq. (1)
    const tokenWeight = agg === "seq_mean_token_mean" ? 1 / T : 1; // eq. (10), per-token quantities
    let c = 0;
    const g = cols.map(() => 0); // d c_i / d logp
    if (variant.ratio === "token" || variant.ratio === "gspo_token") { // eqs. (2), (5): a unit per token
      const logS = l.reduce((x, y) => x + y, 0) / T;
      cols.forEach((t, k) => {
        const r = Math.exp(variant.ratio === "token" ? l[k] : logS);
        const [f, dfdr, dfdlp] = gate(variant, r, a, logp[i][t], bugs);
        c -= tokenWeight * f;
        g[k] -= tokenWeight * (dfdr * r + dfdlp); // d ratio / d logp = ratio (own token only)
      });
    } else { // eqs. (3), (4): one unit per sequence
      const mean = variant.ratio === "sequence_mean";
      if (!mean && variant.ratio !== "sequence_product") throw new RangeError(`unsupported ratio ${variant.ratio}`);
      const scale = mean ? 1 / T : 1;
      const r = Math.exp(l.reduce((x, y) => x + y, 0) * scale);
      const unitLogp = cols.reduce((x, t) => x + logp[i][t], 0) * scale;
      const [f, dfdr, dfdlp] = gate(variant, r, a, unitLogp, bugs);
      const times = ["token_mean", "seq_sum", "seq_mean_token_sum"].includes(agg) ? T : 1; // per token
      c -= times * f;
      cols.forEach((_, k) => { g[k] -= times * (dfdr * r + dfdlp) * scale; });
    }
    if (beta > 0) {
      cols.forEach((t, k) => {
        const [value, slope] = kl(variant.kl_estimator, logp[i][t], refLogp[i][t], { bugs });
        c += tokenWeight * beta * value;
        g[k] += tokenWeight * beta * slope;
      });
    }
    total += c;
    cols.forEach((t, k) => { grad[i][t] = g[k] / D; });
  }
  return [total / D, grad];
}

// --------------------------------------------------------------------------------------------- GAE

// rewards, values, nextValues: [N][T]; terminated, truncated: [N][T] 0/1. Returns [advantages, returns].
export function gae(rewards, values, nextValues, terminated, truncated, gamma, lam, { bugs = new Set() } = {}) {
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
      if (bugs.has("gae_truncation") && trunc) [term, trunc] = [true, false];
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

function checkPolicy(v, bugs) {
  const inp = v.inputs;
  const fill = inp.padding_value === null ? -5.5 : num(inp.padding_value);
  const [logp, mask] = padded(inp.logp, fill);
  const [old] = padded(inp.old_logp, fill);
  const ref = inp.ref_logp === null ? null : padded(inp.ref_logp, fill)[0];
  const normalizer = inp.normalizer === null ? null : num(inp.normalizer);
  const [loss, grad] = policyLoss(logp, old, inp.advantages.map(num), mask, v.variant,
    { refLogp: ref, normalizer, bugs });
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

function checkKl(v, bugs) {
  const [value, slope] = kl(v.estimator, num(v.inputs.logp), num(v.inputs.ref_logp), { bugs });
  const e = v.expected, scale = num(e.abs_scale); // 0: relative, even for tiny log-ratios
  if (!close(value, num(e.value), scale)) return `value: got ${value}, expected ${e.value}`;
  if (!close(slope, num(e.d_value_d_logp), scale)) return `d_value_d_logp: got ${slope}, expected ${e.d_value_d_logp}`;
  return null;
}

function checkGae(v, bugs) {
  const inp = v.inputs, grid = (rows) => rows.map((r) => r.map(num));
  const [adv, ret] = gae(grid(inp.rewards), grid(inp.values), grid(inp.next_values), inp.terminated,
    inp.truncated, v.arguments.gamma, v.arguments.lam, { bugs });
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

// One vector: a message when it fails, null when it passes. Invalid input must throw RangeError,
// this file's error for a bad argument: any other error (a TypeError from reading a missing field,
// an Error("not implemented")) is a failure, not a rejection (SCHEMA.md).
export function checkVector(v, check, bugs) {
  if (v.result === "invalid") {
    try {
      check(v, bugs);
    } catch (err) {
      if (err instanceof RangeError) return null;
      return `threw ${err.name}: ${err.message}, not RangeError (${v.reason})`;
    }
    return `accepted invalid input (${v.reason})`;
  }
  try {
    return check(v, bugs);
  } catch (err) {
    return `threw ${err.name}: ${err.message}`;
  }
}

export const FAMILIES = "policy loss, KL, GAE";

// --only SELECTOR: a word names a file kind (policy_loss, kl, returns), a preset (dapo), an
// estimator (k3, gae_advantages) or a case class (extreme_log_ratio); a selector with a "/" is a
// vector id or an id prefix ending at a "/" (policy_loss/dapo, kl/k3/11); one with "*" or "?"
// matches ids as a shell pattern (policy_loss/*/mixed/*), "*" also across "/".
export function selects(selector, kind, v) {
  if (/[*?]/.test(selector)) {
    const pattern = selector.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
    return new RegExp(`^${pattern}$`).test(v.id);
  }
  if (selector.includes("/")) return v.id === selector || v.id.startsWith(selector.replace(/\/+$/, "") + "/");
  return [kind, v.preset, v.estimator, v.case_class].includes(selector);
}

// Every file is loaded and validated before any vector runs; an invalid file is one line of
// invalidFiles and none of its vectors run, the other files are still checked.
export function run(vectorDir, { bugs = new Set(), only = null } = {}) {
  if (!existsSync(vectorDir)) throw new UsageError(`no vector directory ${vectorDir}`);
  const invalidFiles = [];
  const read = (name) => {
    try {
      return load(join(vectorDir, name));
    } catch (err) {
      if (!(err instanceof SchemaError)) throw err;
      invalidFiles.push(err.message);
      return { vectors: [] };
    }
  };
  const policy = read("policy_loss.json"), kls = read("kl.json"), returns = read("returns.json");
  let jobs = [
    ...policy.vectors.map((v) => [v, checkPolicy, "policy_loss"]),
    ...kls.vectors.map((v) => [v, checkKl, "kl"]),
    ...returns.vectors.filter((v) => v.estimator === "gae_advantages").map((v) => [v, checkGae, "returns"]),
  ];
  if (only !== null) {
    const unmatched = only.filter((s) => !jobs.some(([v, , kind]) => selects(s, kind, v)));
    if (unmatched.length && !invalidFiles.length) {
      throw new UsageError(`--only ${unmatched[0]} selects no vector (see --help)`);
    }
    jobs = jobs.filter(([v, , kind]) => only.some((s) => selects(s, kind, v)));
  }
  const failures = [];
  for (const [v, check] of jobs) {
    const message = checkVector(v, check, bugs);
    if (message) failures.push(`${v.id} [${v.flags.join(", ")}]: ${message}`);
  }
  return { checked: jobs.length, failures, invalidFiles };
}

function plantedBugs(argv) {
  const option = argv.find((a) => a === "--plant-bug" || a.startsWith("--plant-bug="));
  if (option === undefined) return new Set();
  const names = option === "--plant-bug" ? Object.keys(BUGS) : option.slice("--plant-bug=".length).split(",");
  for (const name of names) {
    if (!(name in BUGS)) throw new UsageError(`unknown bug ${name}; bugs: ${Object.keys(BUGS).join(", ")}`);
  }
  return new Set(names);
}

class UsageError extends Error {}

export const HELP = `usage: node check_vectors.mjs [VECTOR_DIR] [--only=SELECTOR,...] [--plant-bug[=NAME,...]]

Checks this file's own JavaScript implementation of the policy-loss family (every preset, dual
clip, the k1 / k2 / k3 KL penalty), the KL estimators and GAE against every vector of
policy_loss.json, kl.json and the gae_advantages vectors of returns.json (schema version 2).
Valid vectors must match within SCHEMA.md's float64 tolerance; an invalid vector passes only when
the code throws RangeError (any other error is a failure). To check your own code, replace the
functions policyLoss, kl and gae (their comments give the signatures) or copy the reading loop.

arguments:
  VECTOR_DIR             the vector directory (default: specs/vectors of this checkout)
  --only=SELECTOR,...    check only the vectors a selector selects (repeatable; --only SELECTOR too):
                           a word      a file kind (policy_loss, kl, returns), a preset (dapo), an
                                       estimator (k3, gae_advantages) or a case class (mixed)
                           a/b         a vector id, or every id under that prefix (policy_loss/dapo)
                           a/*/b       ids matching a shell pattern (policy_loss/*/mixed/*)
  --plant-bug[=NAME,...] swap in classic bugs (all, or those named) that the vectors must catch:
${Object.entries(BUGS).map(([name, what]) => `                           ${name}: ${what}`).join("\n")}
  -h, --help             show this help

Every file is checked against the schema (SCHEMA.md) before any vector runs: an invalid file (not
JSON, truncated, another schema version, a vector without id, result, inputs, flags or expected
value, a non-numeric number, no vectors) is one line naming the file, the vector and the field;
none of its vectors run and the other files are still checked.

exit status: 0 every checked vector passes, 1 one fails, 2 a usage error, 3 a vector file is
invalid (before 1).
Node.js >= 20, no packages. tools/consumers/README.md has more.`;

function onlyOption(argv) {
  const only = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--only") {
      if (i + 1 >= argv.length) throw new UsageError("--only needs a SELECTOR");
      only.push(...argv[++i].split(","));
    } else if (argv[i].startsWith("--only=")) only.push(...argv[i].slice("--only=".length).split(","));
  }
  return only.length ? only.filter(Boolean) : null;
}

function main(argv) {
  if (argv.includes("--help") || argv.includes("-h")) {
    console.log(HELP);
    return 0;
  }
  const here = dirname(fileURLToPath(import.meta.url));
  const args = argv.filter((a, i) => !a.startsWith("-") && argv[i - 1] !== "--only");
  const known = (a) => a === "--plant-bug" || a.startsWith("--plant-bug=") || a === "--only" || a.startsWith("--only=");
  const unknown = argv.filter((a) => a.startsWith("-") && !known(a));
  const vectorDir = resolve(args[0] ?? join(here, "..", "..", "..", "specs", "vectors"));
  let result, bugs;
  try {
    if (unknown.length) throw new UsageError(`unknown option ${unknown[0]} (--help lists the options)`);
    if (args.length > 1) throw new UsageError(`one VECTOR_DIR expected, got ${args.length} (--help)`);
    bugs = plantedBugs(argv);
    result = run(vectorDir, { bugs, only: onlyOption(argv) });
  } catch (err) {
    if (err instanceof SchemaError || err instanceof UsageError || err.code === "ENOENT") {
      console.error(`error: ${err.message}`);
      return 2;
    }
    throw err;
  }
  const { checked, failures, invalidFiles } = result;
  const invalid = invalidFiles.length ? `, ${invalidFiles.length} vector file${invalidFiles.length > 1 ? "s" : ""} invalid` : "";
  console.log(`${failures.length || invalidFiles.length ? "FAIL" : "PASS"}: ${checked} vectors checked (${FAMILIES}), ` +
    `${failures.length} failed${invalid}${bugs.size ? ` (planted bugs: ${[...bugs].join(", ")})` : ""}`);
  for (const line of invalidFiles) console.log(`  invalid vector file: ${line}`);
  for (const line of failures.slice(0, 20)) console.log(`  ${line}`);
  if (failures.length > 20) console.log(`  ... and ${failures.length - 20} more`);
  if (invalidFiles.length) {
    console.error(`error: ${invalidFiles.length} invalid vector file(s), listed above: none of their vectors ran`);
    return 3;
  }
  return failures.length ? 1 : 0;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = main(process.argv.slice(2));
}
