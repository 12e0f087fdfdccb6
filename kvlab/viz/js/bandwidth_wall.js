// kvlab/viz/bandwidth_wall.py's panel in the browser: one decode step at the chosen speed (the
// ceiling, or the kernel tables through KVLAB.measuredTime), the batch and context sweeps
// through it, and its place on the roofline. Twin of bandwidth_wall._compute, part by part
// (tests/test_js.py checks it under node over the grid, measured states included).
(function (KVLAB) {
  "use strict";
  const at = (s, change) => Object.assign({}, s, change);
  const empty = (...names) => Object.fromEntries(names.map((n) => [n, []]));
  const rows = (columns, keep) => Object.fromEntries(Object.entries(columns).map(
    ([k, col]) => [k, col.filter((_, i) => keep[i])]));
  const ratio = (a, b) => (a === a && b === b ? a / b : NaN);

  // bandwidth_wall._point: the readout's step and the phrase saying where its speed comes from.
  function point(K, T, s) {
    const measured = s.speed === "measured";
    const m = measured ? K.measuredTime(T, T.measured, s) : { t: NaN, why: "" };
    const step = (measured && !m.why) ? K.measuredStep(T, T.measured, s, m.t) : K.step(T, s);
    return [step, K.speedText(T.measured, measured, m.why, s.efficiency, s.hardware)];
  }

  // bandwidth_wall._main: measured times (NaN where not covered) if any point is covered.
  function main(K, T, s, ceilingTimes, pairs) {
    if (s.speed === "measured") {
      const times = pairs.map(
        ([b, c]) => K.measuredTime(T, T.measured, at(s, { batch: b, context: c })).t);
      if (times.some((t) => t === t)) return [times, true];
    }
    return [ceilingTimes, false];
  }

  function batchPart(K, T, s, short) {
    const b = T.batches, steps = b.map((x) => K.step(T, at(s, { batch: x })));
    const k = K.batchKnee(steps);
    const [times, measured] = main(K, T, s, steps.map((r) => r.step_time_s),
                                   b.map((x) => [x, s.context]));
    const keep = times.map((t) => t === t), tps = b.map((x, i) => x / times[i]);
    const label = measured ? " (" + short + ")" : "";
    const line = { batch: b, tokens_per_s: tps, per_sequence: times.map((t) => 1.0 / t),
                   tpot_s: times,
                   total_label: b.map(() => "whole batch" + label),
                   each_label: b.map(() => "each sequence" + label) };
    let ref = empty("batch", "tokens_per_s", "per_sequence", "tpot_s", "ref_label");
    if (measured) {
      const ceiling = "ceiling × " + K.percent(s.efficiency);
      ref = { batch: b, tokens_per_s: steps.map((r) => r.tokens_per_s),
              per_sequence: steps.map((r) => r.tokens_per_s_per_sequence),
              tpot_s: steps.map((r) => r.step_time_s), ref_label: b.map(() => ceiling) };
    }
    const knee = keep[k]
      ? { batch: [b[k]], tokens_per_s: [tps[k]], tpot_s: [times[k]], knee_label: ["knee"] }
      : empty("batch", "tokens_per_s", "tpot_s", "knee_label");
    const values = { knee_batch: b[k], knee_tokens_per_s: tps[k], knee_tpot_s: times[k],
                     batch1_tokens_per_s: tps[0], max_tokens_per_s: tps[tps.length - 1] };
    return [{ batch: rows(line, keep), batch_ref: ref, knee }, values];
  }

  function contextPart(K, T, s, short) {
    const c = T.contexts, steps = c.map((x) => K.step(T, at(s, { context: x })));
    const [times, measured] = main(K, T, s, steps.map((r) => r.step_time_s),
                                   c.map((x) => [s.batch, x]));
    const keep = times.map((t) => t === t), each = times.map((t) => 1.0 / t);
    const line = { context: c, per_sequence: each,
                   label: c.map(() => "each sequence" + (measured ? " (" + short + ")" : "")) };
    let ref = empty("context", "per_sequence", "ref_label");
    if (measured) {
      const ceiling = "ceiling × " + K.percent(s.efficiency);
      ref = { context: c, per_sequence: steps.map((r) => r.tokens_per_s_per_sequence),
              ref_label: c.map(() => ceiling) };
    }
    const near = each[T.short], far = each[T.long], w = steps[0].weight_read_bytes;
    const crossover = w / (s.batch * steps[0].kv_bytes_per_token);
    return [{ context: rows(line, keep), context_ref: ref,
              context_bytes: { context: c, weights: c.map(() => w),
                               kv_read: steps.map((r) => r.kv_read_bytes) } },
            { at_4k: near, at_32k: far, slowdown: ratio(near, far),
              kv_equals_weights_context: Math.floor(crossover) }];
  }

  function rooflinePart(K, T, s, r, short) {
    const ceiling = K.step(T, s);
    const base = { model: s.model, hardware: s.hardware, weight_dtype: s.weight_dtype,
                   kv_dtype: s.kv_dtype, efficiency: s.efficiency };
    const noCache = K.prefill(T, at(base, { prompt_tokens: s.context + 1 }));
    const flash = K.prefill(T, at(base, { prompt_tokens: s.context }));
    const naive = K.prefill(T, at(base, { prompt_tokens: s.context, flash_attention: false }));
    const pts = [[ceiling.flops, ceiling.step_bytes, ceiling.step_time_s],
                 [noCache.flops, noCache.bytes_moved, noCache.time_s],
                 [naive.flops, naive.bytes_moved, naive.time_s],
                 [flash.flops, flash.bytes_moved, flash.time_s]];
    const styles = T.points.slice();
    if (r.efficiency === "measured") {
      pts.push([r.flops, r.step_bytes, r.step_time_s]);
      const [label, color, marker] = T.measured_point;
      styles.push([label + " (" + short + ")", color, marker]);
    }
    const peak = r.ridge_flops_per_byte * r.bandwidth_bytes_per_s;
    const roofPeak = ceiling.ridge_flops_per_byte * ceiling.bandwidth_bytes_per_s;
    const bw = ceiling.bandwidth_bytes_per_s;
    const roof = T.roof_x.map((x) => Math.min(roofPeak, x * bw) * s.efficiency);
    return [{ roof: { x: T.roof_x, y: roof },
              points: { label: styles.map((p) => p[0]), color: styles.map((p) => p[1]),
                        marker: styles.map((p) => p[2]), intensity: pts.map((p) => p[0] / p[1]),
                        flops_per_s: pts.map((p) => p[0] / p[2]) } },
            { peak_compute_used: r.flops / r.step_time_s / peak, no_cache_time_s: noCache.time_s,
              prefill_naive_intensity: naive.flops / naive.bytes_moved,
              prefill_flash_intensity: flash.flops / flash.bytes_moved }];
  }

  KVLAB.panels["decode-step"] = function (K, T, s) {
    const [r, phrase] = point(K, T, s), M = T.measured;
    const covered = s.speed === "measured" && !K.measuredWhyNot(M, s);
    const short = covered ? M.devices[s.hardware].short : "";
    const [batchSources, batchValues] = batchPart(K, T, s, short);
    const [contextSources, contextValues] = contextPart(K, T, s, short);
    const [roofSources, roofValues] = rooflinePart(K, T, s, r, short);
    const measured = r.efficiency === "measured";
    const times = [r.memory_time_s, r.compute_time_s, r.step_time_s];
    const sources = Object.assign({
      bytes: { y: T.bytes_y, weights: [r.weight_read_bytes], kv_read: [r.kv_read_bytes],
               kv_write: [r.kv_write_bytes] },
      time: { kind: T.time_kinds, seconds: times,
              color: [T.time_colors[0], T.time_colors[1], T.time_colors[measured ? 3 : 2]],
              label: times.map((t) => K.seconds(t)) },
      batch_here: { batch: [r.batch], tokens_per_s: [r.tokens_per_s], tpot_s: [r.step_time_s] },
      context_here: { context: [r.context], per_sequence: [r.tokens_per_s_per_sequence] },
    }, batchSources, contextSources, roofSources);
    const values = Object.assign({}, r, { speed: phrase }, batchValues, contextValues, roofValues);
    const where = measured ? "measured: " + M.devices[s.hardware].tables
      : "ceiling × " + K.percent(s.efficiency);
    return { sources, values, titles: { time: T.time_title + " (" + where + ")" } };
  };
})(window.KVLAB);

// kvlab/viz/bandwidth_wall.py's quantization panel in the browser, the twin of its Python
// `compute` (checked under node by tests/test_js.py).
(function (KVLAB) {
  "use strict";
  const at = (s, change) => Object.assign({}, s, change);

  // quantization_panel: tokens/s per sequence for each (weights, KV) dtype pair in T.configs.
  KVLAB.panels.quantization = function (K, T, s) {
    const rows = T.configs.map((c) => K.step(T, at(s, { weight_dtype: c[0], kv_dtype: c[1] })));
    const speeds = rows.map((r) => r.tokens_per_s_per_sequence);
    return {
      sources: { bars: { config: T.labels, color: T.colors, tokens_per_s: speeds,
                         kv_share: rows.map((r) => r.kv_read_bytes / r.step_bytes) } },
      values: { fp16_tokens_per_s: speeds[0], weight_only_speedup: speeds[1] / speeds[0],
                both_speedup: speeds[3] / speeds[0],
                kv_share_weight_only: rows[1].kv_read_bytes / rows[1].step_bytes },
    };
  };
})(window.KVLAB);
