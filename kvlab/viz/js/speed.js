// The ledger's measured mode in the browser (kvlab/viz/speed.py builds its terms): one
// decode step timed from the kernel tables, added up exactly as kvlab.measured's
// Kernels.decode_step_s adds it — the step outside attention at this batch, plus the
// layers times one layer's attention, never below attention's own ceiling — from doubles
// Python computed at build time. Where the tables have nothing, it says why in the same
// phrase as speed.why_not.
(function (KVLAB) {
  "use strict";
  const decoded = new WeakMap();  // terms -> their doubles, decoded once per page

  // base64 of little-endian doubles -> Float64Array, bit for bit.
  function doubles(M) {
    if (!decoded.has(M)) {
      const bytes = Uint8Array.from(atob(M.data), (c) => c.charCodeAt(0));
      const view = new DataView(bytes.buffer), out = new Float64Array(bytes.length / 8);
      for (let i = 0; i < out.length; i++) out[i] = view.getFloat64(8 * i, true);
      decoded.set(M, out);
    }
    return decoded.get(M);
  }

  // Mirrors speed.why_not: "" when the tables cover the configuration.
  function whyNot(M, s) {
    const m = M.models[s.model], wk = M.dtype_keys[s.weight_dtype];
    const kk = M.dtype_keys[s.kv_dtype];
    if (!M.devices[s.hardware]) return M.no.device;
    if (m.mla) return M.no.mla;
    if (!M.fixed[s.model + "|" + s.hardware + "|" + wk]) {
      return "no " + s.weight_dtype + " weight tables";
    }
    if (!M.attention[s.hardware + "|" + m.layout + "/" + kk]) {
      return "no " + s.kv_dtype + " KV tables";
    }
    return "";
  }

  // Mirrors speed.measured_time: {t: seconds, why: ""} or {t: NaN, why: the phrase}.
  // T is the ledger's terms (device bandwidth and peaks), M = T.measured.
  function measuredTime(T, M, s) {
    const why = whyNot(M, s);
    if (why) return { t: NaN, why };
    const m = M.models[s.model], d = T.devices[s.hardware], data = doubles(M);
    const fixed = M.fixed[s.model + "|" + s.hardware + "|" + M.dtype_keys[s.weight_dtype]];
    const att = M.attention[s.hardware + "|" + m.layout + "/" + M.dtype_keys[s.kv_dtype]];
    const b = s.batch, i = M.batches.indexOf(b);
    const ctx = m.window ? Math.min(s.context, m.window) : s.context, j = M.contexts.indexOf(ctx);
    if (i < 0 || j < 0) throw new Error("no measured terms at batch " + b + ", context " + ctx);
    let start = att[0];
    for (let r = 0; r < i; r++) start += att[1 + r];
    const perLayer = j < att[1 + i] ? data[start + j] : NaN;
    if (perLayer !== perLayer) return { t: NaN, why: M.no.range };
    const kvTok = m.kv_tok_layer[M.dtype_keys[s.kv_dtype]];
    const peak = KVLAB.peakFlops(d, T.dtypes[s.weight_dtype]);
    const floor = Math.max(b * (ctx + 1) * kvTok / d.memory_bandwidth_bytes_per_s,
                           b * KVLAB.queryKeyPairs(1, ctx) * m.attn_flops_layer / peak);
    return { t: data[fixed[0] + i] + m.layers * Math.max(perLayer, floor), why: "" };
  }

  // Mirrors cost.decode_step(..., efficiency="measured") for a point the tables cover.
  function measuredStep(T, M, s, t) {
    const r = KVLAB.step(T, Object.assign({}, s, { efficiency: 1.0 }));
    const fixed = M.fixed[s.model + "|" + s.hardware + "|" + M.dtype_keys[s.weight_dtype]];
    return Object.assign(r, { efficiency: "measured", step_time_s: t, tokens_per_s: s.batch / t,
                              tokens_per_s_per_sequence: 1.0 / t,
                              efficiency_source: M.devices[s.hardware].source,
                              overhead_s: fixed[1] });
  }

  // Mirrors speed.speed_text.
  function speedText(M, measured, why, efficiency, hardware) {
    if (measured && !why) return "measured: " + M.devices[hardware].short;
    const ceiling = "ceiling × " + KVLAB.percent(efficiency);
    return measured ? ceiling + ": " + why : ceiling;
  }

  Object.assign(KVLAB, { measuredTime, measuredStep, speedText, measuredWhyNot: whyNot });
})(window.KVLAB);
