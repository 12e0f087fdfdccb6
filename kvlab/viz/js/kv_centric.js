// kvlab/viz/kv_centric.py in the browser: the sweep's page holds readout values only, and
// this rebuilds its bars from them ({metric: one value per architecture}, as compute does).
(function (KVLAB) {
  "use strict";
  KVLAB.sources.sweep = function (K, T, v) {
    const bars = { arch: T.archs, color: T.colors };
    for (const k of T.metrics) bars[k] = T.archs.map((a) => v[a + "_" + k]);
    return { bars };
  };
})(window.KVLAB);

// kvlab/viz/kv_centric.py capacity_panel in the browser: the same lookups as its Python
// `_capacity_state` into the load sweep kvlab ran when the book was built.
(function (KVLAB) {
  "use strict";
  KVLAB.panels.load_capacity = function (K, T, s) {
    const i = T.rates.indexOf(s.rate);
    const picked = { colocated: T.colocated[String(s.chunk)],
                     disaggregated: T.disaggregated[s.early_reject],
                     kv_centric: T.kv_centric[s.early_reject] };
    const curves = { rate: T.rates.slice() }, values = {};
    const at = { design: T.designs.slice(), color: T.colors.slice(),
                 rate: T.designs.map(() => T.rates[i]), slo_attainment: [],
                 goodput_requests_per_s: [] };
    for (const d of T.designs) {
      const c = T.curves[picked[d]];
      for (const k of T.keys) values[d + "_" + k] = c[k][i];
      for (const k of ["slo_attainment", "goodput_requests_per_s"]) {
        curves[d + "_" + k] = c[k].slice();
        at[k].push(c[k][i]);
      }
      values[d + "_saturation"] = T.saturation[picked[d]];
    }
    return { sources: { curves, at }, values };
  };
})(window.KVLAB);
