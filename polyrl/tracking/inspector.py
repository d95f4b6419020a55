"""The rollout inspector: one self-contained HTML page per sample table, where each completion's
tokens are shaded by a chosen per-token quantity, each sample shows its reward components, and
filters pick the samples a reader asks about first.

The page embeds the step's data as compact JSON and a small inline script (no network, no CDN),
so it opens from an MLflow artifact or a local file alike. The view (quantity, filter, prompt
group) is kept in the address's fragment, so a link opens the page on the same view. Per-token quantities are whatever the
rows carry, by name (:data:`TOKEN_QUANTITIES`): the sampler's log-prob always comes with a
rollout; the learner's log-prob, entropy, ratio and the clip/correction masks when the step
recorded them (polyrl/learner/token_capture.py). The figures at the top (samples, mean
reward, mean length, truncated share; with the learner's values also the mean ratio, the clipped
share, the mean advantage and the mean |learner − sampler| log-prob) are computed by the script
from the embedded rows, so a test can compare what a browser shows with the run's logged metrics.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any, Sequence

# Per-token quantities the page can shade by: key in a row's "tokens" dict → label in the page.
TOKEN_QUANTITIES: dict[str, str] = {
    "sampler_logprob": "sampler log-prob",
    "learner_logprob": "learner log-prob",
    "logprob_diff": "learner − sampler log-prob",
    "entropy": "entropy",
    "advantage": "advantage",
    "ratio": "ratio",
    "clipped": "removed by the clip",
    "masked": "removed by rollout correction",
}
DIGITS = 4  # significant enough for shading and hover; keeps the JSON small


def _round(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    value = float(value)
    return None if not math.isfinite(value) else float(f"{value:.{DIGITS}g}")


def sampled_token_values(completion: Any) -> dict[str, list[Any]]:
    """A completion's token ids and the sampler's log-prob of each, as :func:`inspector_rows` takes
    them. An episode's observation tokens (``completion_mask`` 0: not sampled, their log-prob held
    as 0.0) get None, so the page leaves them unshaded instead of showing a log-prob of 0."""
    mask = completion.completion_mask or (1,) * len(completion.completion_ids)
    return {
        "ids": list(completion.completion_ids),
        "sampler_logprob": [float(lp) if m else None for lp, m in zip(completion.sampling_logprobs, mask)],
    }


def inspector_rows(
    samples: Sequence[dict[str, Any]],
    *,
    tokens: Sequence[list[str]] | None = None,
    token_values: Sequence[dict[str, Sequence[float]]] | None = None,
    parts: dict[str, Sequence[float | None]] | None = None,
) -> list[dict[str, Any]]:
    """Compact rows for :func:`inspector_html`: ``samples`` are the step's sample rows (prompt,
    completion, reward, length, finish_reason, optionally advantage and a ``label`` shown first in
    its card), ``tokens`` each completion's
    token strings, ``token_values`` per-token quantities by :data:`TOKEN_QUANTITIES` key, ``parts``
    each reward component's score per sample. ``logprob_diff`` is added where both log-probs are."""
    prompts: dict[str, int] = {}
    rows = []
    for i, sample in enumerate(samples):
        raw = {k: v for k, v in (token_values[i] if token_values else {}).items() if k in TOKEN_QUANTITIES}
        if "sampler_logprob" in raw and "learner_logprob" in raw and "logprob_diff" not in raw:
            # From the unrounded log-probs: the gap is often far below their fourth digit.
            raw["logprob_diff"] = [
                None if a is None or b is None else b - a for a, b in zip(raw["sampler_logprob"], raw["learner_logprob"])
            ]
        values = {k: [_round(x) for x in v] for k, v in raw.items()}
        prompt = str(sample.get("prompt", ""))
        rows.append(
            {
                "g": prompts.setdefault(prompt, len(prompts)),
                "c": str(sample.get("completion", "")),
                "r": _round(sample.get("reward")),
                "n": sample.get("length"),
                "f": sample.get("finish_reason"),
                "a": _round(sample.get("advantage")),
                "rp": {label: _round(v[i]) for label, v in (parts or {}).items() if i < len(v)},
                "t": list(tokens[i]) if tokens else [],
                "v": values,
                "l": sample.get("label"),  # who wrote it, where a page mixes runs (flip pages: arm, seed, verdict)
            }
        )
    return rows


def _token_mean(rows: Sequence[dict[str, Any]], key: str, transform: Any = float) -> float:
    xs = [transform(x) for r in rows for x in r["v"].get(key, []) if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def figures(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """What the page's header shows, computed as its script does (over scored samples for the
    reward; the token figures over the tokens that have the quantity: ``ratio_mean`` and
    ``clipped`` over the trained ones, to set beside actor/ratio_mean and actor/clip_frac_low +
    clip_frac_high; ``advantage_mean`` beside advantage/mean; ``logprob_gap``, the mean
    |learner − sampler| log-prob, beside rollout/logprob_gap)."""
    rewards = [r["r"] for r in rows if r["r"] is not None]
    lengths = [r["n"] for r in rows if r["n"] is not None]
    return {
        "samples": float(len(rows)),
        "reward_mean": sum(rewards) / len(rewards) if rewards else float("nan"),
        "length_mean": sum(lengths) / len(lengths) if lengths else float("nan"),
        "truncated": sum(r["f"] == "length" for r in rows) / len(rows) if rows else float("nan"),
        "ratio_mean": _token_mean(rows, "ratio"),
        "clipped": _token_mean(rows, "clipped"),
        "advantage_mean": _token_mean(rows, "advantage"),
        "logprob_gap": _token_mean(rows, "logprob_diff", abs),
    }


SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const Q = D.quantities, L = D.labels;
const $ = (id) => document.getElementById(id);
function mean(xs) { return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN; }
function fmt(x) { return x === null || x === undefined || Number.isNaN(x) ? '–' : (Number.isInteger(x) ? String(x) : Math.abs(x) >= 100 ? x.toFixed(1) : x.toPrecision(4)); }
const scored = D.rows.filter(r => r.r !== null).map(r => r.r);
const lengths = D.rows.filter(r => r.n !== null).map(r => r.n);
function tokens(q, f) { const xs = []; for (const r of D.rows) for (const x of (r.v[q] || [])) if (x !== null) xs.push(f(x)); return xs; }
const fig = {samples: D.rows.length, reward_mean: mean(scored), length_mean: mean(lengths),
             truncated: D.rows.length ? D.rows.filter(r => r.f === 'length').length / D.rows.length : NaN,
             ratio_mean: mean(tokens('ratio', Number)), clipped: mean(tokens('clipped', Number)),
             advantage_mean: mean(tokens('advantage', Number)), logprob_gap: mean(tokens('logprob_diff', Math.abs))};
for (const [k, v] of Object.entries(fig)) { const e = $('fig-' + k); e.textContent = fmt(v); e.dataset.value = String(v); }
const qsel = $('quantity'); for (const q of Q) qsel.add(new Option(L[q], q));
const gsel = $('group'); gsel.add(new Option('all prompts', '-1'));
const groups = [...new Set(D.rows.map(r => r.g))]; for (const g of groups) gsel.add(new Option('prompt ' + g + ' side by side', String(g)));
function spread(q) {
  let lo = Infinity, hi = -Infinity;
  for (const r of D.rows) for (const x of (r.v[q] || [])) if (x !== null && typeof x === 'number') { lo = Math.min(lo, x); hi = Math.max(hi, x); }
  return [lo, hi];
}
function shade(x, q, lo, hi) {
  if (x === null || x === undefined) return 'transparent';
  if (typeof x === 'boolean') return x ? 'rgba(220,50,47,0.55)' : 'transparent';
  if (q === 'advantage' || q === 'logprob_diff') { const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    return x >= 0 ? `rgba(38,139,210,${0.6 * x / m})` : `rgba(220,50,47,${0.6 * -x / m})`; }
  const t = hi > lo ? (x - lo) / (hi - lo) : 0; return `rgba(220,50,47,${0.6 * (1 - t)})`;
}
function norm(label) { const xs = D.rows.map(r => r.rp[label]).filter(x => x !== null && x !== undefined);
  const lo = Math.min(...xs), hi = Math.max(...xs); return (x) => hi > lo ? (x - lo) / (hi - lo) : 0; }
function pick(filter) {
  let idx = D.rows.map((_, i) => i);
  if (filter === 'high_adv' || filter === 'low_adv') {
    idx = idx.filter(i => D.rows[i].a !== null).sort((i, j) => D.rows[j].a - D.rows[i].a);
    if (filter === 'low_adv') idx.reverse(); idx = idx.slice(0, 8);
  } else if (filter === 'clipped') idx = idx.filter(i => (D.rows[i].v.clipped || []).some(x => x) || (D.rows[i].v.masked || []).some(x => x));
  else if (filter === 'truncated') idx = idx.filter(i => D.rows[i].f === 'length');
  else if (filter === 'disagree') {
    const out = new Set();
    for (const [j, r] of D.pairs) { const nj = norm(j), nr = norm(r);
      idx.forEach(i => { const a = D.rows[i].rp[j], b = D.rows[i].rp[r];
        if (a !== null && b !== null && a !== undefined && b !== undefined && Math.abs(nj(a) - nr(b)) > 0.5) out.add(i); }); }
    idx = idx.filter(i => out.has(i));
  }
  const g = Number(gsel.value); if (g >= 0) idx = idx.filter(i => D.rows[i].g === g);
  return idx;
}
function render() {
  const q = qsel.value, [lo, hi] = spread(q), idx = pick($('filter').value);
  const box = $('samples'); box.innerHTML = ''; box.className = Number(gsel.value) >= 0 ? 'side' : '';
  $('shown').textContent = idx.length;
  for (const i of idx) {
    const r = D.rows[i], card = document.createElement('div'); card.className = 'card'; card.dataset.index = i;
    const head = document.createElement('div'); head.className = 'head';
    const parts = Object.entries(r.rp).map(([k, v]) => `${k} ${fmt(v)}`).join(' · ');
    head.textContent = (r.l ? r.l + ' · ' : '') + `#${i} · prompt ${r.g} · reward ${fmt(r.r)}` + (r.a !== null ? ` · advantage ${fmt(r.a)}` : '') +
      ` · ${r.n} tokens · ${r.f}` + (parts ? ' · ' + parts : '');
    card.appendChild(head);
    const body = document.createElement('div'); body.className = 'tokens';
    if (r.t.length) r.t.forEach((tok, k) => { const s = document.createElement('span'); s.textContent = tok;
      const x = r.v[q] ? r.v[q][k] : null; s.style.background = shade(x, q, lo, hi); s.title = `${L[q] || ''}: ${fmt(x)}`; body.appendChild(s); });
    else body.textContent = r.c;
    card.appendChild(body); box.appendChild(card);
  }
}
// A link can open the page on a view: #quantity=entropy&filter=truncated&group=0.
const want = new URLSearchParams(location.hash.slice(1));
for (const [id, sel] of [['quantity', qsel], ['filter', $('filter')], ['group', gsel]]) {
  const v = want.get(id); if (v !== null && [...sel.options].some(o => o.value === v)) sel.value = v; }
const sync = () => { history.replaceState(null, '', '#quantity=' + qsel.value + '&filter=' + $('filter').value + '&group=' + gsel.value); render(); };
qsel.onchange = sync; $('filter').onchange = sync; gsel.onchange = sync;
const p = $('prompts'); D.prompts.forEach((t, g) => { const e = document.createElement('details'); e.innerHTML = '<summary></summary><pre></pre>';
  e.querySelector('summary').textContent = 'prompt ' + g; e.querySelector('pre').textContent = t; p.appendChild(e); });
render();
document.body.dataset.ready = '1';
"""

STYLE = """
body{font:14px system-ui,sans-serif;margin:1em;color:#222}.figs span{margin-right:1.5em}.figs b{font-variant-numeric:tabular-nums}
.controls{margin:.8em 0}.controls select{margin-right:1em}.card{border:1px solid #ddd;border-radius:4px;padding:.4em;margin:.4em 0}
.head{color:#555;font-size:12px;margin-bottom:.3em}.tokens{font-family:monospace;white-space:pre-wrap}
.tokens span{border-radius:2px}#samples.side{display:grid;grid-template-columns:repeat(auto-fill,minmax(22em,1fr));gap:.4em}
"""


def inspector_html(
    rows: Sequence[dict[str, Any]],
    *,
    title: str,
    prompts: Sequence[str] | None = None,
    judge_rule_pairs: dict[str, str] | None = None,
) -> str:
    """The page for ``rows`` (from :func:`inspector_rows`); ``prompts`` are the distinct prompts in
    group order, ``judge_rule_pairs`` the {judge: rule} reward labels the disagreement filter compares."""
    present = [q for q in TOKEN_QUANTITIES if any(q in r["v"] for r in rows)]
    data = {
        "rows": list(rows),
        "quantities": present,
        "labels": {q: TOKEN_QUANTITIES[q] for q in present},
        "prompts": list(prompts or []),
        "pairs": [[j, r] for j, r in (judge_rule_pairs or {}).items()],
    }
    # "</" inside the JSON would end the script element early; "<\/" is the same JSON string.
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).replace("</", "<\\/")
    filters = [
        ("all", "all samples"),
        ("high_adv", "highest advantage"),
        ("low_adv", "lowest advantage"),
        ("clipped", "clipped or masked tokens"),
        ("truncated", "truncated"),
        ("disagree", "judge and rule disagree"),
    ]
    options = "".join(f'<option value="{v}">{html.escape(t)}</option>' for v, t in filters)
    figs = "".join(
        f'<span>{label} <b id="fig-{key}">…</b></span>'
        for key, label in (
            ("samples", "samples"),
            ("reward_mean", "mean reward"),
            ("length_mean", "mean length"),
            ("truncated", "truncated"),
            ("ratio_mean", "mean ratio"),
            ("clipped", "clipped share"),
            ("advantage_mean", "mean advantage"),
            ("logprob_gap", "mean |learner − sampler|"),
        )
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h2>{html.escape(title)}</h2><div class='figs'>{figs}</div>"
        "<div class='controls'>shade by <select id='quantity'></select> show <select id='filter'>"
        f"{options}</select><select id='group'></select> (<span id='shown'></span> shown)</div>"
        "<div id='prompts'></div><div id='samples'></div>"
        f"<script type='application/json' id='data'>{payload}</script><script>{SCRIPT}</script></body></html>"
    )
