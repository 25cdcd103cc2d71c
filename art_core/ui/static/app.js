// art-core ui: draws each page from the JSON routes under {root}/api. Every value from a
// record is inserted as text (never as HTML): a rollout may hold anything a model wrote.
"use strict";

const ROOT = document.querySelector('meta[name="art-root"]').content;
const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const live = document.getElementById("live");
let pollTimer = null;

// ------------------------------------------------------------------ helpers
function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) { continue; }
    if (k.startsWith("on")) { node.addEventListener(k.slice(2), v); }
    else if (k === "dataset") { Object.assign(node.dataset, v); }
    // Through the CSSOM: the page's CSP forbids style attributes, not scripted styles.
    else if (k === "style") { node.style.cssText = v; }
    else { node.setAttribute(k, v === true ? "" : v); }
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) { continue; }
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const enc = encodeURIComponent;
const fmt = v => (v === null || v === undefined) ? "" : (typeof v === "number" ? artFormat(v) : String(v));
const page = path => ROOT + "/" + path;
const modelPath = (p, n) => `${enc(p)}/${enc(n)}`;

async function api(path) {
  const response = await fetch(ROOT + "/api/" + path, {headers: {accept: "application/json"}});
  if (response.status === 204) { return null; }
  let body;
  try { body = await response.json(); } catch (e) { body = {error: `${response.status} ${response.statusText}`}; }
  if (!response.ok) {
    const error = body && body.error;  // {"error": {"message": ...}}, the server's one shape
    const message = error && typeof error === "object" ? error.message : error;
    throw new Error(typeof message === "string" && message ? message : `${response.status} ${response.statusText}`);
  }
  return body;
}

function show(...nodes) {
  main.replaceChildren(...nodes.flat(Infinity).filter(n => n !== null && n !== undefined && n !== false));
}
function problems(list) { return (list || []).map(p => h("div", {class: "problem"}, p)); }
function setCrumbs(...items) {
  crumbs.replaceChildren(...items.map(([label, href]) => href ? h("a", {href}, label) : h("span", {}, label)));
}
function failed(error) {
  show(h("div", {class: "error", id: "page-error"}, error.message || String(error)));
}

// ------------------------------------------------------------------ router
function route() {
  clearInterval(pollTimer);
  live.hidden = true;
  const rel = decodeURI(location.pathname.slice(ROOT.length)).replace(/^\/+/, "");
  const parts = location.pathname.slice(ROOT.length).replace(/^\/+/, "").split("/").map(decodeURIComponent);
  const view = parts[0];
  let done;
  if (rel === "" ) { done = runsPage(); }
  else if (view === "run" && parts.length === 3) { done = runPage(parts[1], parts[2]); }
  else if (view === "step" && parts.length === 5) { done = stepPage(...parts.slice(1)); }
  else if (view === "rollout" && parts.length === 6) { done = rolloutPage(...parts.slice(1)); }
  else if (view === "compare") { done = comparePage(new URLSearchParams(location.search)); }
  else { done = Promise.reject(new Error(`no page at ${location.pathname}`)); }
  done.catch(failed);
}

document.addEventListener("click", event => {
  const link = event.target.closest("a");
  // A link with its own handler (it prevented the default) or an in-page anchor is left alone.
  if (!link || event.defaultPrevented || (link.getAttribute("href") || "").startsWith("#") ||
      link.hasAttribute("download") || link.target || event.ctrlKey || event.metaKey) { return; }
  const url = new URL(link.href, location.href);
  if (url.origin === location.origin && url.pathname.startsWith(ROOT + "/") &&
      !url.pathname.startsWith(ROOT + "/api/") && !url.pathname.startsWith(ROOT + "/static/")) {
    event.preventDefault();
    history.pushState(null, "", url.pathname + url.search);
    route();
  }
});
window.addEventListener("popstate", route);

// ------------------------------------------------------------------ runs
async function runsPage() {
  setCrumbs(["runs", null]);
  const data = await api("runs");
  const rows = data.runs.map(r => h("tr", {dataset: {run: `${r.project}/${r.name}`}},
    h("td", {}, r.project),
    h("td", {}, h("a", {href: page(`run/${modelPath(r.project, r.name)}`)}, r.name)),
    h("td", {}, r.base_model || ""),
    h("td", {class: "num"}, fmt(r.latest_step)),
    h("td", {class: "num"}, fmt(r.checkpoint_step)),
    h("td", {class: "num"}, fmt(r.train_reward)),
    h("td", {class: "num"}, fmt(r.val_reward)),
    h("td", {}, r.training_now ? h("span", {class: "badge on"}, "training now")
                               : h("span", {class: "badge"}, r.last_activity ? `idle since ${new Date(r.last_activity * 1000).toLocaleString()}` : "idle")),
    h("td", {}, (r.problems || []).join("; "))));
  show(h("h1", {}, "Runs"), h("p", {class: "muted"}, data.path), ...problems(data.problems),
    rows.length ? h("table", {id: "runs"},
      h("thead", {}, h("tr", {}, ["project", "model", "base model", "step", "checkpoint",
        "train reward", "val reward", "state", "problems"].map(t => h("th", {}, t)))),
      h("tbody", {}, rows)) : null);
}

// ------------------------------------------------------------------ run
function chartBox(curve, csvHref) {
  const legend = h("div", {class: "legend"}, curve.series.map((s, i) =>
    h("span", {}, h("i", {style: `background:${ART_COLORS[i % ART_COLORS.length]}`}), s.label)));
  return h("div", {class: "chart", dataset: {curve: curve.id}},
    h("h3", {}, h("span", {}, curve.title), h("a", {href: csvHref, download: ""}, "CSV")),
    artLineChart(curve.series), legend);
}

async function runPage(project, name) {
  const base = `runs/${modelPath(project, name)}`;
  setCrumbs(["runs", page("")], [`${project}/${name}`, null]);
  let data = await api(base);
  const charts = h("div", {class: "charts", id: "charts"});
  const extra = h("div", {class: "charts", id: "extra-chart"});
  const steps = h("div", {id: "steps"});
  const findings = h("div", {id: "findings"});
  const header = h("div", {});
  const picker = h("select", {id: "metric-picker"});
  async function drawExtra() {
    extra.replaceChildren();
    if (!picker.value) { return; }
    const metric = picker.value;
    const curve = await api(`${base}/curve.json?metric=${enc(metric)}`);
    if (picker.value === metric) {
      extra.replaceChildren(chartBox(curve, ROOT + `/api/${base}/curve.csv?metric=${enc(metric)}`));
    }
  }
  picker.addEventListener("change", () => { drawExtra().catch(failed); });
  function render() {
    const s = data.summary;
    header.replaceChildren(
      h("h1", {}, `${s.project}/${s.name}`),
      h("p", {}, `base model ${s.base_model || "unknown"} · latest step ${fmt(s.latest_step)} · checkpoint ${fmt(s.checkpoint_step)} · `,
        s.training_now ? h("span", {class: "badge on", id: "state"}, "training now") : h("span", {class: "badge", id: "state"}, "idle")),
      ...problems(s.problems));
    charts.replaceChildren(...data.curves.map(c => chartBox(c, ROOT + `/api/${base}/curve.csv?id=${enc(c.id)}`)));
    if (!data.curves.length) { charts.appendChild(h("p", {class: "muted"}, "No step recorded yet: curves appear after the first training step.")); }
    const current = picker.value;
    picker.replaceChildren(h("option", {value: ""}, "plot another recorded metric…"),
      ...data.metrics.map(m => h("option", {value: m}, m)));
    picker.value = current;
    const stepLinks = Object.entries(data.steps).map(([split, list]) =>
      h("p", {dataset: {split}}, h("b", {}, `${split}: `),
        list.map(n => [h("a", {href: page(`step/${modelPath(project, name)}/${enc(split)}/${n}`), class: "step-link"}, n), " "])));
    findings.replaceChildren(h("h2", {}, "Evaluations"), evalsView(data.evals || []),
      h("h2", {}, "Why it learned little"), diagnosesView(data.diagnoses || []));
    const compare = compareForm(project, name, data.steps);
    steps.replaceChildren(...(stepLinks.length ? stepLinks : [h("p", {class: "muted"}, "No rollouts saved yet.")]), compare);
  }
  show(header, charts, h("div", {class: "toolbar"}, picker), extra, findings, h("h2", {}, "Steps"), steps);
  render();
  live.hidden = false;
  pollTimer = setInterval(async () => {
    try {
      const update = await api(`${base}?known=${data.history_size}`);
      if (update) { data = update; render(); if (picker.value) { drawExtra(); } }
    } catch (e) { /* the folder may be mid-write: try again next tick */ }
  }, 2000);
}

// "0.412 [0.301, 0.530]": a number with its 95% interval, when it has one.
function withInterval(m) {
  return m.low === null || m.high === null ? fmt(m.value) : `${fmt(m.value)} [${fmt(m.low)}, ${fmt(m.high)}]`;
}

function evalsView(evals) {
  if (!evals.length) { return h("p", {class: "muted"}, "No evaluation yet: art-core eval writes one here."); }
  const names = [...new Set(evals.flatMap(e => e.metrics.map(m => m.name)))];
  return h("table", {id: "evals"},
    h("thead", {}, h("tr", {}, ["step", "chosen as", "split", "tasks", "runs", ...names.map(n => n.replace("_", " ")), "tokens/run", "tool errors/run"].map(c => h("th", {}, c)))),
    h("tbody", {}, evals.map(e => h("tr", {},
      h("td", {}, fmt(e.step)), h("td", {}, fmt(e.label)), h("td", {}, fmt(e.split)),
      h("td", {}, fmt(e.tasks)), h("td", {}, fmt(e.runs)),
      names.map(n => { const m = e.metrics.find(x => x.name === n); return h("td", {}, m ? withInterval(m) : ""); }),
      h("td", {}, fmt(e.tokens_per_run)), h("td", {}, fmt(e.tool_errors_per_run))))));
}

// "(75% of rollouts; fires at 25%)": a share of runs, groups or tool calls as a percentage; any
// other measure (a reward spread) as the number it is.
function shareText(d) {
  const shares = ["rollouts", "groups", "tool calls"].includes(d.unit);
  const show = v => v === null ? "?" : shares ? `${Math.round(v * 100)}%` : fmt(v);
  return shares ? `(${show(d.share)} of ${d.unit}; fires at ${show(d.threshold)})`
    : `(${d.unit} ${show(d.share)}; fires within ${show(d.threshold)})`;
}

function diagnosesView(steps) {
  if (!steps.length) { return h("p", {class: "muted"}, "No diagnosis fired: no step showed a known reason for learning little."); }
  return h("div", {id: "diagnoses"}, steps.slice().reverse().map(s =>
    h("div", {class: "diagnosis-step", dataset: {step: s.step}}, h("b", {}, `step ${s.step}`),
      h("ul", {}, s.diagnoses.map(d => h("li", {dataset: {code: d.code}},
        h("code", {}, d.code), ` ${d.finding} `,
        h("span", {class: "muted"}, shareText(d)),
        h("div", {}, `→ ${d.setting}`)))))));
}

function compareForm(project, name, steps) {
  const split = Object.keys(steps).includes("train") ? "train" : Object.keys(steps)[0];
  const list = steps[split] || [];
  if (list.length < 2) { return h("span", {}); }
  const a = h("select", {id: "compare-a"}, list.map(n => h("option", {value: n}, n)));
  const b = h("select", {id: "compare-b"}, list.map(n => h("option", {value: n}, n)));
  a.value = list[0]; b.value = list[list.length - 1];
  const go = h("a", {id: "compare-go", href: "#"}, "compare");
  const update = () => {
    go.href = page(`compare?a=${enc(`${project}/${name}/${split}/${a.value}`)}&b=${enc(`${project}/${name}/${split}/${b.value}`)}`);
  };
  a.addEventListener("change", update); b.addEventListener("change", update); update();
  return h("p", {class: "toolbar"}, `Compare ${split} step `, a, " with step ", b, " ", go);
}

// ------------------------------------------------------------------ step
const STEP_COLUMNS = [
  ["group", "group", true], ["index", "#", true], ["reward", "reward", true],
  ["advantage", "advantage", true], ["ruler_score", "RULER", true], ["turns", "turns", true],
  ["tool_calls", "tool calls", true], ["prompt_tokens", "prompt tok", true],
  ["completion_tokens", "completion tok", true], ["finish_reasons", "finish", false],
  ["replicas", "replica", false], ["adapter_steps", "adapter step", false], ["apis", "API", false],
  ["task", "task", false], ["ruler_explanation", "RULER explanation", false],
];

const PAGE_ROWS = 100;

async function stepPage(project, name, split, step) {
  const model = modelPath(project, name);
  const base = `runs/${model}/steps/${enc(split)}/${enc(step)}`;
  setCrumbs(["runs", page("")], [`${project}/${name}`, page(`run/${model}`)], [`${split} step ${step}`, null]);
  // The server filters, sorts and pages the rows: a step may hold thousands of rollouts.
  const state = {sort: "group", desc: false, q: "", group: "", offset: 0};
  const query = () => `${base}?sort=${enc(state.sort)}&desc=${state.desc ? 1 : 0}&q=${enc(state.q)}` +
    `&group=${enc(state.group)}&offset=${state.offset}&limit=${PAGE_ROWS}`;
  let data = await api(query());
  const tbody = h("tbody", {});
  const pager = h("div", {class: "toolbar", id: "pager"});
  const head = h("tr", {}, STEP_COLUMNS.map(([key, label, num]) =>
    h("th", {class: num ? "num" : null, dataset: {key}}, label)));
  let pending = 0;
  async function reload() {
    const ticket = ++pending;
    const fresh = await api(query());
    if (ticket === pending) { data = fresh; draw(); }
  }
  head.addEventListener("click", event => {
    const th = event.target.closest("th");
    if (!th) { return; }
    state.desc = state.sort === th.dataset.key && !state.desc;
    state.sort = th.dataset.key;
    state.offset = 0;
    reload().catch(failed);
  });
  function value(row, key) {
    const v = row[key];
    return Array.isArray(v) ? v.join(",") : v;
  }
  function draw() {
    for (const th of head.children) { th.dataset.sort = th.dataset.key === state.sort ? (state.desc ? "desc" : "asc") : ""; }
    tbody.replaceChildren(...data.rows.map(r => h("tr", {dataset: {id: r.id}, class: r.exception ? "exception" : null},
      STEP_COLUMNS.map(([key, , num]) => {
        const cell = h("td", {class: num ? "num" : null, dataset: {key}});
        if (key === "index") {
          cell.appendChild(h("a", {href: page(`rollout/${model}/${enc(split)}/${enc(step)}/${enc(r.id)}`)}, r.index));
        } else { cell.textContent = fmt(value(r, key)); }
        return cell;
      }))));
    const last = Math.min(data.offset + data.rows.length, data.total);
    const move = delta => h("a", {href: "#", onclick: e => { e.preventDefault(); state.offset = Math.max(0, state.offset + delta); reload().catch(failed); }},
      delta < 0 ? "‹ previous rows" : "next rows ›");
    pager.replaceChildren(h("span", {id: "row-count"}, data.total ? `rows ${data.offset + 1}–${last} of ${data.total}` : "no rollout matches"),
      data.offset > 0 ? move(-PAGE_ROWS) : null, last < data.total ? move(PAGE_ROWS) : null);
  }
  let typing = null;
  const search = h("input", {id: "filter", type: "search", placeholder: "filter (any text of a row)",
    oninput: () => { clearTimeout(typing); typing = setTimeout(() => { state.q = search.value; state.offset = 0; reload().catch(failed); }, 150); }});
  const groups = h("select", {id: "group-filter", onchange: () => { state.group = groups.value; state.offset = 0; reload().catch(failed); }},
    h("option", {value: ""}, "all groups"), data.groups.map(g => h("option", {value: g.group}, `group ${g.group}`)));
  const nav = h("span", {}, data.steps.includes(Number(step) - 1) ? h("a", {href: page(`step/${model}/${enc(split)}/${Number(step) - 1}`)}, "‹ previous step") : null,
    " ", data.steps.includes(Number(step) + 1) ? h("a", {href: page(`step/${model}/${enc(split)}/${Number(step) + 1}`)}, "next step ›") : null);
  const sideBySide = h("div", {id: "side-by-side"});
  const groupCards = h("table", {id: "groups"},
    h("thead", {}, h("tr", {}, ["group", "task", "rollouts", "rewards", "mean", "signal", ""].map(t => h("th", {}, t)))),
    h("tbody", {}, data.groups.map(g => h("tr", {},
      h("td", {class: "num"}, g.group), h("td", {}, g.task), h("td", {class: "num"}, g.rollouts),
      h("td", {}, g.rewards.map(fmt).join(", ")), h("td", {class: "num"}, fmt(g.mean_reward)),
      h("td", {}, g.all_equal ? "all equal: nothing learned" : (g.rewards.length > 1 ? "yes" : "")),
      h("td", {}, h("a", {href: "#", class: "show-group", onclick: e => { e.preventDefault(); showGroup(g).catch(failed); }}, "side by side"))))));
  async function showGroup(group) {
    sideBySide.replaceChildren(h("h2", {}, `Group ${group.group}, side by side`), h("p", {class: "muted"}, "Loading…"));
    const rollouts = await Promise.all(group.ids.map(id => api(`${base}/rollouts/${enc(id)}`)));
    sideBySide.replaceChildren(h("h2", {}, `Group ${group.group}, side by side`),
      h("div", {class: "side"}, rollouts.map(r => h("div", {},
        h("p", {}, h("a", {href: page(`rollout/${model}/${enc(split)}/${enc(step)}/${enc(r.summary.id)}`)}, `rollout ${r.summary.index}`),
          ` reward ${fmt(r.summary.reward)}`),
        messagesView(r.messages)))));
    sideBySide.scrollIntoView();
  }
  show(h("h1", {}, `${project}/${name} · ${split} step ${step}`), nav,
    h("p", {class: "muted"}, `${data.rollouts} rollouts in ${data.groups.length} groups, ${data.exceptions.length} failed` +
      (data.signal_recorded ? "" : (split === "train" ? " · no training signal recorded for this step" : ""))),
    ...problems(data.problems),
    h("div", {class: "toolbar"}, search, groups),
    h("div", {class: "scroll"}, h("table", {id: "rollouts"}, h("thead", {}, head), tbody)), pager,
    data.exceptions.length ? [h("h2", {}, "Failed rollouts"), ...data.exceptions.map(e =>
      h("details", {class: "exception"}, h("summary", {}, `group ${e.group}: ${e.type}: ${e.message}`), h("pre", {class: "block"}, e.traceback)))] : null,
    h("h2", {}, "Groups"), groupCards, sideBySide);
  draw();
}

// ------------------------------------------------------------------ rollout
function messagesView(messages) {
  return h("div", {class: "msgs"}, messages.map(m => h("div", {class: `msg ${m.role}`, dataset: {role: m.role, kind: m.kind}},
    h("div", {class: "role"}, m.role, m.name ? ` (${m.name})` : "", m.tool_call_id ? ` · result of ${m.tool_call_id}` : "",
      m.call !== null && m.call !== undefined ? ` · call ${m.call}` : "", m.kind === "branch" ? " · new branch" : "",
      m.finish_reason ? ` · ${m.finish_reason}` : "",
      Object.entries(m.framework || {}).map(([k, v]) => h("span", {class: "badge framework", dataset: {key: k}}, `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`))),
    m.reasoning_content ? h("details", {}, h("summary", {}, "reasoning"), h("pre", {}, m.reasoning_content)) : null,
    m.content ? h("pre", {}, m.content) : null,
    (m.tool_calls || []).map(c => h("div", {class: "toolcall", dataset: {tool: c.name || ""}},
      h("b", {}, c.name), h("pre", {class: "args"}, c.arguments || ""), c.id ? h("span", {class: "muted"}, c.id) : null)))));
}

function tokenColor(advantage, scale) {
  if (advantage === null || advantage === undefined) { return null; }
  const alpha = Math.min(1, 0.15 + 0.75 * Math.abs(advantage) / (scale || 1));
  return `rgba(var(${advantage >= 0 ? "--pos" : "--neg"}), ${alpha.toFixed(2)})`;
}

function tokensView(tokens) {
  const box = h("div", {class: "tokens", id: "token-view"});
  if (!tokens.available) { box.appendChild(h("span", {class: "muted"}, tokens.reason)); return box; }
  const adv = tokens.advantage;
  const tip = document.getElementById("tip") || document.body.appendChild(h("div", {id: "tip", hidden: true}));
  tokens.sequences.forEach((seq, number) => {
    if (tokens.sequences.length > 1) { box.appendChild(h("div", {class: "muted"}, `sequence ${number + 1} (calls ${seq.call_ids.length})`)); }
    for (const segment of seq.segments) {
      if (segment.kind === "context") {
        box.appendChild(h("span", {class: "ctx", title: `context: ${segment.tokens} tokens, masked (not trained)`}, segment.text));
        continue;
      }
      for (const [id, text, logprob, adapterStep, trainerLogprob] of segment.tokens) {
        const ratio = trainerLogprob === null || trainerLogprob === undefined ? null : Math.exp(trainerLogprob - logprob);
        const span = h("span", {class: tokens.trained ? "tok trained" : "tok untrained",
          dataset: {id, logprob, adapterStep: adapterStep ?? "", advantageSign: adv === null || adv === undefined ? "" : Math.sign(adv),
                    ratio: ratio === null ? "" : ratio.toFixed(4)}}, text);
        const color = tokens.trained ? tokenColor(adv, 2) : null;
        if (color) { span.style.background = color; }
        span.addEventListener("mousemove", e => {
          tip.hidden = false;
          tip.textContent = `token ${JSON.stringify(text)} (id ${id})\nlogprob ${logprob.toFixed(4)} (p ${Math.exp(logprob).toFixed(3)})\n` +
            `sampled by adapter step ${adapterStep ?? "?"}\n` +
            (tokens.trained ? `advantage ${fmt(adv)}, weight ${fmt(tokens.token_weight)}\n` : "not trained\n") +
            (ratio === null ? "" : `importance ratio ${ratio.toFixed(4)} (trainer / sampler)`);
          tip.style.left = `${e.clientX + 12}px`; tip.style.top = `${e.clientY + 12}px`;
        });
        span.addEventListener("mouseleave", () => { tip.hidden = true; });
        box.appendChild(span);
      }
    }
    box.appendChild(document.createTextNode("\n"));
  });
  return box;
}

async function rolloutPage(project, name, split, step, id) {
  const model = modelPath(project, name);
  setCrumbs(["runs", page("")], [`${project}/${name}`, page(`run/${model}`)],
    [`${split} step ${step}`, page(`step/${model}/${enc(split)}/${enc(step)}`)], [`rollout`, null]);
  const data = await api(`runs/${model}/steps/${enc(split)}/${enc(step)}/rollouts/${enc(id)}`);
  const s = data.summary, t = data.tokens;
  const siblings = data.group.rollouts;
  const here = siblings.indexOf(id);
  const sib = k => h("a", {href: page(`rollout/${model}/${enc(split)}/${enc(step)}/${enc(siblings[k])}`)}, k < here ? "‹ previous in group" : "next in group ›");
  const legend = h("p", {class: "legend-box"},
    h("span", {style: `background:${tokenColor(1, 2)}`}, "trained, advantage > 0"),
    h("span", {style: `background:${tokenColor(-1, 2)}`}, "trained, advantage < 0"),
    h("span", {class: "tok untrained"}, "sampled, not trained"),
    h("span", {class: "ctx"}, "context (masked)"),
    h("span", {class: "muted"}, "colour strength: |advantage|; hover a token for its logprob, adapter step and importance ratio"));
  show(
    h("h1", {}, `Rollout ${s.index} of group ${s.group} · ${split} step ${step}`),
    h("p", {}, here > 0 ? sib(here - 1) : null, " ", here < siblings.length - 1 ? sib(here + 1) : null),
    h("dl", {class: "kv", id: "rollout-summary"},
      h("dt", {}, "reward"), h("dd", {id: "reward"}, fmt(s.reward)),
      h("dt", {}, "advantage"), h("dd", {id: "advantage"}, t.trained ? fmt(t.advantage) : "not trained"),
      s.ruler_score !== null ? [h("dt", {}, "RULER"), h("dd", {}, `${fmt(s.ruler_score)} ${s.ruler_explanation || ""}`)] : null,
      h("dt", {}, "turns · tool calls"), h("dd", {}, `${fmt(s.turns)} · ${fmt(s.tool_calls)}`),
      h("dt", {}, "tokens"), h("dd", {}, `${s.prompt_tokens} prompt, ${s.completion_tokens} completion`),
      h("dt", {}, "served by"), h("dd", {}, `adapter step ${s.adapter_steps.join(", ") || "?"}` + (s.replicas.length ? `, replica ${s.replicas.join(", ")}` : "") + `, ${s.apis.join(", ")}`),
      h("dt", {}, "id"), h("dd", {}, s.id)),
    ...problems(data.problems),
    h("h2", {}, "Conversation"), messagesView(data.messages),
    data.additional_histories.map((hist, i) => [h("h2", {}, `Further history ${i + 1}`), messagesView(hist.messages)]),
    h("h2", {}, "Tokens and their training signal"), h("p", {class: "muted", id: "token-reason"}, `${t.reason}. ${t.tokenizer || ""}`),
    legend, tokensView(t),
    h("h2", {}, "Calls"),
    h("table", {id: "calls"}, h("thead", {}, h("tr", {}, ["#", "API", "adapter step", "replica", "finish", "latency s", "prompt tok", "completion tok", "framework metadata"].map(x => h("th", {}, x)))),
      h("tbody", {}, data.calls.map(c => h("tr", {}, h("td", {}, fmt(c.index)), h("td", {}, c.api), h("td", {}, fmt(c.adapter_step)),
        h("td", {}, fmt(c.replica)), h("td", {}, c.finish_reason), h("td", {class: "num"}, fmt(c.latency_s)),
        h("td", {class: "num"}, c.prompt_tokens), h("td", {class: "num"}, c.completion_tokens),
        h("td", {}, h("pre", {class: "block"}, JSON.stringify(c.metadata, null, 1))))))),
    h("h2", {}, "Rollout metadata"), h("pre", {class: "block", id: "metadata"}, JSON.stringify({metadata: data.metadata, metrics: data.metrics}, null, 1)),
    data.logs.length ? [h("h2", {}, "Logs"), h("pre", {class: "block"}, data.logs.join("\n"))] : null,
    data.tools ? h("details", {}, h("summary", {}, `${data.tools.length} tools offered`), h("pre", {class: "block"}, JSON.stringify(data.tools, null, 1))) : null);
}

// ------------------------------------------------------------------ compare
async function comparePage(params) {
  const a = params.get("a") || "", b = params.get("b") || "";
  setCrumbs(["runs", page("")], ["compare", null]);
  let data;
  try { data = await api(`compare?a=${enc(a)}&b=${enc(b)}`); }
  catch (error) { data = {scenarios: [], problems: [error.message]}; }  // keep the form to fix it
  const [pa, na, sa, ta] = a.split("/"), [pb, nb, sb, tb] = b.split("/");
  const left = h("div", {id: "compare-a-view"}), right = h("div", {id: "compare-b-view"});
  async function load(scenario, side, [p, n, s, t], box, chosen) {
    const rollouts = scenario[side].rollouts;
    const pick = h("select", {class: "pick-rollout"}, rollouts.map((r, i) =>
      h("option", {value: i}, `rollout ${i} · reward ${fmt(r.reward)}`)));
    pick.value = String(chosen);
    pick.addEventListener("change", () => load(scenario, side, [p, n, s, t], box, Number(pick.value)).catch(failed));
    const id = rollouts[chosen].id;
    const r = await api(`runs/${modelPath(p, n)}/steps/${enc(s)}/${enc(t)}/rollouts/${enc(id)}`);
    box.replaceChildren(h("h2", {}, `${p}/${n} · ${s} step ${t}`),
      h("p", {}, `group mean reward ${fmt(scenario[side].mean_reward)} · `, pick, " ",
        h("a", {href: page(`rollout/${modelPath(p, n)}/${enc(s)}/${enc(t)}/${enc(id)}`)}, "open")),
      messagesView(r.messages));
  }
  async function open(scenario) {
    await Promise.all([load(scenario, "a", [pa, na, sa, ta], left, 0), load(scenario, "b", [pb, nb, sb, tb], right, 0)]);
  }
  const rows = data.scenarios.map(sc => h("tr", {},
    h("td", {}, h("a", {href: "#", class: "scenario", onclick: e => { e.preventDefault(); open(sc).catch(failed); }}, sc.task || sc.scenario)),
    h("td", {class: "num"}, fmt(sc.a.mean_reward)), h("td", {class: "num"}, fmt(sc.b.mean_reward)),
    h("td", {class: "num"}, sc.a.mean_reward !== null && sc.b.mean_reward !== null ? fmt(sc.b.mean_reward - sc.a.mean_reward) : "")));
  // Either side may be any model's step: project/model/split/step.
  const inputA = h("input", {id: "compare-input-a", value: a, size: 40});
  const inputB = h("input", {id: "compare-input-b", value: b, size: 40});
  const go = h("button", {id: "compare-submit", onclick: () => {
    history.pushState(null, "", page(`compare?a=${enc(inputA.value)}&b=${enc(inputB.value)}`));
    route();
  }}, "compare");
  show(h("h1", {}, "Compare"), h("p", {class: "toolbar"}, "A ", inputA, " B ", inputB, go), ...problems(data.problems),
    rows.length ? h("table", {id: "scenarios"}, h("thead", {}, h("tr", {}, ["scenario", "A mean reward", "B mean reward", "B − A"].map(x => h("th", {}, x)))), h("tbody", {}, rows))
      : h("p", {class: "muted"}, "No scenario was run at both: compare steps that share scenarios (validation steps always do)."),
    h("div", {class: "grid2"}, left, right));
  if (data.scenarios.length) { await open(data.scenarios[0]); }
}

route();
