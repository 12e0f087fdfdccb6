// kvlab/viz/roofline.py's quantization panel in the browser, the twin of its Python
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
