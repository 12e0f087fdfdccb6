// kvlab/viz/roofline.py's panels in the browser: the roofline and quantization at long
// context, twins of their panels' Python `compute` (checked under node by tests/test_js.py).
(function (KVLAB) {
  "use strict";
  const at = (s, change) => Object.assign({}, s, change);

  // roofline_panel: the decode step, decode without a KV cache, and prefill with naive and
  // flash attention, placed under the roof (peak x efficiency).
  KVLAB.panels.roofline = function (K, T, s) {
    const r = K.step(T, s);
    const base = { model: s.model, hardware: s.hardware, weight_dtype: s.weight_dtype,
                   kv_dtype: s.kv_dtype, efficiency: s.efficiency };
    const noCache = K.prefill(T, at(base, { prompt_tokens: s.context + 1 }));
    const flash = K.prefill(T, at(base, { prompt_tokens: s.context }));
    const naive = K.prefill(T, at(base, { prompt_tokens: s.context, flash_attention: false }));
    const bandwidth = r.bandwidth_bytes_per_s;
    const peak = r.ridge_flops_per_byte * bandwidth;
    const pts = [[r.flops, r.step_bytes, r.step_time_s],
                 [noCache.flops, noCache.bytes_moved, noCache.time_s],
                 [naive.flops, naive.bytes_moved, naive.time_s],
                 [flash.flops, flash.bytes_moved, flash.time_s]];
    return {
      sources: {
        roof: { x: T.roof_x, y: T.roof_x.map((x) => Math.min(peak, x * bandwidth) * s.efficiency) },
        points: at(T.points, { intensity: pts.map((p) => p[0] / p[1]),
                               flops_per_s: pts.map((p) => p[0] / p[2]) }),
      },
      values: { arithmetic_intensity: r.arithmetic_intensity,
                ridge_flops_per_byte: r.ridge_flops_per_byte, bound: r.bound,
                peak_compute_used: r.flops / r.step_time_s / peak, no_cache_time_s: noCache.time_s,
                step_time_s: r.step_time_s,
                prefill_naive_intensity: naive.flops / naive.bytes_moved,
                prefill_flash_intensity: flash.flops / flash.bytes_moved },
    };
  };

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
