// Lookup panels (kvlab/viz/panel.py lookup_panel): kvlab computed every grid state at build
// time; the page looks the state up in T.table (parsed once per page) and, where the table
// holds readout values only, rebuilds the figure sources with KVLAB.sources[T.sources].
(function (KVLAB) {
  "use strict";
  KVLAB.panels.lookup = function (K, T, s) {
    const table = K.tables[T.key] || (K.tables[T.key] = JSON.parse(T.table));
    const r = table[JSON.stringify(T.order.map((k) => s[k]))];
    if (!T.sources) return r;
    const v = Object.fromEntries(T.keys.map((k, i) => [k, r[i]]));
    return { values: v, sources: K.sources[T.sources](K, T.source_terms, v) };
  };
})(window.KVLAB);
