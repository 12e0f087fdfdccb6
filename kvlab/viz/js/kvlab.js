// kvlab's browser side: formatting and the ledger, mirrored from kvlab/fmt.py and
// kvlab/cost.py so that static panels can recombine terms Python computed at build time.
// Every operation follows the Python order of operations. The panels' own functions live
// beside this file (kvlab/viz/js/*.js) and register in KVLAB.panels; the book ships all of
// them once per site. tests/test_js.py runs every twin here and every panel function under
// node against the Python it mirrors.
window.KVLAB = window.KVLAB || (function () {
  "use strict";

  // ---------------------------------------------------------------- kvlab.fmt
  function decimalsFor(x, digits) {
    let a = Math.abs(x);
    if (a === 0 || !isFinite(a)) return 0;
    let exponent = 0;
    while (a >= 10) { a /= 10; exponent += 1; }
    while (a < 1) { a *= 10; exponent -= 1; }
    return Math.max(digits - 1 - exponent, 0);
  }
  function fixed(x, decimals) {
    // toFixed rounds half away from zero on the exact binary value, like Python's
    // Decimal(x).quantize(ROUND_HALF_UP); past 1e21 it turns exponential, and every such
    // double is a whole number, which BigInt prints exactly.
    let text = Math.abs(x) >= 1e21
      ? BigInt(Math.abs(x)).toString() + (decimals ? "." + "0".repeat(decimals) : "")
      : Math.abs(x).toFixed(decimals);
    const parts = text.split(".");
    parts[0] = parts[0].replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    text = parts.join(".");
    return (x < 0 && /[1-9]/.test(text)) ? "-" + text : text;
  }
  // Mirrors kvlab.fmt.sig: scientific notation (Python's "1.00e-07") outside [1e-6, 1e21).
  function sig(x, digits) {
    const a = Math.abs(x);
    if (isFinite(a) && a !== 0 && !(a >= 1e-6 && a < 1e21)) {
      const [mantissa, exponent] = x.toExponential(Math.max(digits - 1, 0)).split("e");
      const e = Number(exponent);
      return mantissa + "e" + (e < 0 ? "-" : "+") + String(Math.abs(e)).padStart(2, "0");
    }
    return fixed(x, decimalsFor(x, digits));
  }
  const SI = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  function si(value, unit, digits) {
    digits = digits || 3;
    if (value === null || value === undefined || !isFinite(value)) {
      return (value !== null && value > 0) ? "unbounded" : "n/a";
    }
    for (const [scale, prefix] of SI) {
      if (Math.abs(value) >= scale) return sig(value / scale, digits) + " " + prefix + unit;
    }
    return sig(value, digits) + " " + unit;
  }
  function seconds(value, digits) {
    digits = digits || 3;
    if (value === null || !isFinite(value)) return "n/a";
    if (value === 0) return "0 s";
    for (const [scale, unit] of [[1.0, "s"], [1e-3, "ms"], [1e-6, "µs"]]) {
      if (Math.abs(value) >= scale) return sig(value / scale, digits) + " " + unit;
    }
    return sig(value / 1e-9, digits) + " ns";
  }
  function rate(value, digits) {
    if (value === null || !isFinite(value)) return "n/a";
    return sig(value, digits || 4);
  }
  // kvlab/fmt.py percent: a share short of all never reads 100% (one more digit until it shows)
  function percent(fraction, digits) {
    let d = digits || 3;
    let text = sig(100 * fraction, d);
    while (fraction < 1 && d < 9 && Number(text.replace(/,/g, "")) >= 100) {
      d += 1;
      text = sig(100 * fraction, d);
    }
    return text + "%";
  }

  // One formatter per readout kind (kvlab/viz/panel.py FORMATS holds the Python side).
  const FORMATS = {
    bytes: (v) => si(v, "B"),
    bytes_per_s: (v) => si(v, "B/s"),
    flops: (v) => si(v, "FLOP"),
    flops_per_s: (v) => si(v, "FLOP/s"),
    seconds: (v) => seconds(v),
    rate: (v) => rate(v),
    percent: (v) => percent(v),
    count: (v) => fixed(v, 0),
    count_or_never: (v) => (v === null ? "never" : fixed(v, 0)),
    ratio: (v) => (v === null || !isFinite(v) ? "n/a" : sig(v, 3) + "×"),
    intensity: (v) => sig(v, 3) + " FLOP/B",
    yesno: (v) => (v ? "yes" : "no"),
    count_or_unbounded: (v) => (v === null ? "unbounded" : fixed(v, 0)),  // null: a window caps KV
    text: (v) => String(v),
  };
  function escape(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;");
  }
  function readoutHtml(spec, values) {
    let html = '<table class="kvlab-readout">';
    for (const [key, label, kind] of spec) {
      let v = values[key];
      if (typeof v === "number" && !isFinite(v)) v = null;  // as Python's readout: no infinity
      const raw = (typeof v === "number") ? v.toPrecision(17) : (v === null ? "None" : String(v));
      html += '<tr><th>' + escape(label) + '</th><td data-key="' + key + '" data-value="' +
        escape(raw) + '" data-kind="' + kind + '">' + escape(FORMATS[kind](v)) + '</td></tr>';
    }
    return html + '</table>';
  }

  // ---------------------------------------------------------------- kvlab.cost
  // The groups come from kvlab.operators through kvlab/viz/terms.py; here a pass is only
  // counted (kvlab.operators.pass_counts) and its groups summed (kvlab.cost.UnitSeconds).
  function queryKeyPairs(n, c) { return n * c + n * (n + 1) / 2; }  // operators.query_key_pairs
  function expertsTouched(m, tokens) {  // operators.experts_touched
    if (!(m.num_experts > 0)) return 0.0;
    return m.num_experts * (1.0 - Math.pow(1.0 - m.experts_per_token / m.num_experts, tokens));
  }
  function passCounts(b, n, c) {  // operators.pass_counts for scalars
    const tokens = b * n;
    return { tokens, touching: n >= 1 ? tokens : b * Math.max(n, 1),
             kv_tokens: b * (c + n), pairs: b * queryKeyPairs(n, c) };
  }
  function peakFlops(d, dt) {
    return (dt.compute === "fp8" && d.fp8_flops_per_s) ? d.fp8_flops_per_s : d.bf16_flops_per_s;
  }
  // (bytes, FLOPs) of each operator group of a pass: OperatorTable.work, the table's
  // element counts times the dtypes' bytes per element.
  function groupWork(m, w, kvTok, c, flash) {
    let attention = kvTok * c.kv_tokens;
    if (flash === false) attention = attention + m.score_bytes_per_pair * c.pairs;
    const bpe = w.bytes_per_element;
    return [
      [m.dense_elements * bpe, m.dense_flops_per_token * c.tokens],
      [m.expert_elements * bpe * expertsTouched(m, c.touching),
       m.experts_flops_per_token * c.tokens],
      [attention, m.flops_per_pair * c.pairs],
    ];
  }
  // Sum over groups of max(bytes / bandwidth, FLOPs / peak), and the bytes and FLOPs.
  function sumGroups(groups, bandwidth, peak) {
    let ceiling = 0.0, bytes = 0.0, flops = 0.0;
    for (const [b, f] of groups) {
      ceiling = ceiling + Math.max(b / bandwidth, f / peak);
      bytes = bytes + b;
      flops = flops + f;
    }
    return { ceiling, bytes, flops };
  }
  // Mirrors kvlab.cost.decode_step for scalar inputs (one GPU).
  function step(T, s) {
    const m = T.models[s.model], d = T.devices[s.hardware];
    const w = T.dtypes[s.weight_dtype];
    const kv_bytes_per_token = m.kv_elements_per_token * T.dtypes[s.kv_dtype].bytes_per_element;
    const b = s.batch, eff = (s.efficiency === undefined) ? 1.0 : s.efficiency;
    const bandwidth = s.bandwidth || d.memory_bandwidth_bytes_per_s;
    const attended = m.sliding_window ? Math.min(s.context, m.sliding_window) : s.context;
    const c = passCounts(b, 1, attended);
    const groups = groupWork(m, w, kv_bytes_per_token, c, true);
    const peak = peakFlops(d, T.dtypes[s.weight_dtype]);
    const sum = sumGroups(groups, bandwidth, peak);
    const weight_bytes = m.resident_elements * w.bytes_per_element;
    const weight_read_bytes = groups[0][0] + groups[1][0];
    const step_bytes = sum.bytes, flops = sum.flops;
    const memory_time_s = step_bytes / (bandwidth * eff);
    const compute_time_s = flops / (peak * eff);
    const step_time_s = sum.ceiling / eff;
    const kv_cache_bytes = c.tokens * attended * kv_bytes_per_token;
    const memory_needed_bytes = weight_bytes + kv_cache_bytes;
    const per_seq_kv = Math.max(attended, 1.0) * kv_bytes_per_token;
    return {
      model: s.model, hardware: s.hardware, weight_dtype: s.weight_dtype, kv_dtype: s.kv_dtype,
      batch: b, context: s.context, bandwidth_bytes_per_s: bandwidth, efficiency: eff,
      weight_bytes, weight_read_bytes, kv_bytes_per_token,
      kv_read_bytes: kv_cache_bytes, kv_write_bytes: c.tokens * kv_bytes_per_token,
      step_bytes, flops,
      arithmetic_intensity: flops / step_bytes, ridge_flops_per_byte: peak / bandwidth,
      memory_time_s, compute_time_s, step_time_s,
      bound: compute_time_s > memory_time_s ? "compute" : "memory",
      tokens_per_s: c.tokens / step_time_s, tokens_per_s_per_sequence: 1 / step_time_s,
      kv_cache_bytes, memory_needed_bytes, capacity_bytes: d.capacity_bytes,
      fits: memory_needed_bytes <= d.capacity_bytes,
      max_batch: Math.floor(Math.max(d.capacity_bytes - weight_bytes, 0.0) / per_seq_kv),
      ceiling_step_time_s: sum.ceiling,
      efficiency_source: "the sheet's bandwidth and FLOP/s x efficiency",
      overhead_s: 0.0,
      // one GPU: no tensor parallelism, so no all-reduces and nothing to note about them
      tensor_parallel: 1, allreduce_time_s: 0.0, allreduce_latency_s: 0.0, notes: [],
    };
  }
  // Mirrors kvlab.cost.memory_fit for scalar inputs: the longest context is unbounded
  // (Infinity) when a sliding window caps every sequence's KV and the batch of windows fits.
  function memoryFit(T, s) {
    const r = step(T, s), m = T.models[s.model];
    const room = Math.max(r.capacity_bytes - r.weight_bytes, 0.0);
    let max_context = Math.floor(room / (r.batch * r.kv_bytes_per_token));
    if (m.sliding_window && r.batch * m.sliding_window * r.kv_bytes_per_token <= room) {
      max_context = Infinity;
    }
    return { weight_bytes: r.weight_bytes, kv_cache_bytes: r.kv_cache_bytes,
             needed_bytes: r.memory_needed_bytes, capacity_bytes: r.capacity_bytes, fits: r.fits,
             max_batch: r.max_batch, max_context };
  }
  // Mirrors kvlab.cost.batch_knee: in steps over a grid of batches, the first index where
  // KV reads reach the weight reads or compute takes over; the last index if none does.
  function batchKnee(steps) {
    const k = steps.findIndex((r) => r.kv_read_bytes >= r.weight_read_bytes
                                     || r.bound === "compute");
    return k < 0 ? steps.length - 1 : k;
  }
  // Mirrors kvlab.prompt.served_tokens: a hit never serves the prompt's last token.
  function servedTokens(hitTokens, promptTokens) {
    return Math.max(0, Math.min(hitTokens, promptTokens - 1));
  }
  // Mirrors kvlab.cost.prefill for scalar inputs (one GPU).
  function prefill(T, s) {
    const m = T.models[s.model], d = T.devices[s.hardware];
    const w = T.dtypes[s.weight_dtype];
    const kvTok = m.kv_elements_per_token * T.dtypes[s.kv_dtype].bytes_per_element;
    const b = s.batch || 1, eff = (s.efficiency === undefined) ? 1.0 : s.efficiency;
    const bandwidth = s.bandwidth || d.memory_bandwidth_bytes_per_s;
    const p = s.prompt_tokens, c = servedTokens(s.cached_tokens || 0, p);  // the last token computes
    const n = p - c;
    const groups = groupWork(m, w, kvTok, passCounts(b, n, c), s.flash_attention !== false);
    const peak = peakFlops(d, T.dtypes[s.weight_dtype]);
    const sum = sumGroups(groups, bandwidth, peak);
    const flops = sum.flops, bytes_moved = sum.bytes;
    const compute_time_s = n > 0 ? flops / (peak * eff) : 0.0;
    const memory_time_s = n > 0 ? bytes_moved / (bandwidth * eff) : 0.0;
    const ceiling = n > 0 ? sum.ceiling : 0.0;
    const time_s = n > 0 ? sum.ceiling / eff : 0.0;
    return { batch: b, prompt_tokens: p, cached_tokens: c, computed_tokens: n, flops, bytes_moved,
             compute_time_s, memory_time_s, time_s,
             bound: compute_time_s >= memory_time_s ? "compute" : "memory", ttft_s: time_s,
             ceiling_time_s: ceiling,
             efficiency_source: "the sheet's bandwidth and FLOP/s x efficiency" };
  }

  // ------------------------------------------------------------ panel plumbing
  // Read every control into a state object: sliders and selects both hold an index into
  // the list of values Python gave them.
  function state(controls, grids) {
    const out = {};
    for (const [key, widget] of Object.entries(controls)) {
      out[key] = grids[key][Math.round(Number(widget.value))];
    }
    return out;
  }
  function apply(result, sources, readout, spec, titles) {
    for (const [name, data] of Object.entries(result.sources || {})) {
      sources[name].data = data;
    }
    for (const [name, text] of Object.entries(result.titles || {})) {
      titles[name].text = text;  // a figure's title that names its numbers' source
    }
    if (readout) readout.text = readoutHtml(spec, result.values);
    window.KVLAB.updates = (window.KVLAB.updates || 0) + 1;  // tests wait on this
  }

  // Each static panel's browser twin of its Python `compute`, by the name Panel.js gives:
  // KVLAB.panels[name](K, T, s) with K this library, T the panel's build-time terms and s
  // the state; lookup panels' source builders register in KVLAB.sources the same way.
  return { decimalsFor, fixed, sig, si, seconds, rate, percent, FORMATS, readoutHtml,
           queryKeyPairs, expertsTouched, passCounts, peakFlops, step, prefill, memoryFit,
           batchKnee, servedTokens,
           state, apply,
           panels: {}, sources: {}, tables: {} };
})();
