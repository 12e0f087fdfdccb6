// kvlab/viz/sim_panels.py in the browser: the sweep's page holds readout values only, and
// this rebuilds its bars from them ({metric: one value per architecture}, as compute does).
(function (KVLAB) {
  "use strict";
  KVLAB.sources.sweep = function (K, T, v) {
    const bars = { arch: T.archs, color: T.colors };
    for (const k of T.metrics) bars[k] = T.archs.map((a) => v[a + "_" + k]);
    return { bars };
  };
})(window.KVLAB);
