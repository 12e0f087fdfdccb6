// What a reader cannot read: every visible text inside `scope` (a CSS selector; shadow roots
// included, where bokeh renders its widgets, readouts, tabs and legends) that an ancestor
// hiding overflow cuts, or that runs past the text column (`column`, a CSS selector; its
// content box). Canvas-drawn text (titles, axis labels) is measured against its plot, a
// <select>'s shown option against the select, and a legend must stay clear of its plot's
// frame (the data). Returns one line per problem; [] when everything can be read.
// Used by tests/test_browser.py and tests/test_dashboard.py (Playwright's page.evaluate).
([scope, column]) => {
  const SLACK = 1.5; // px: subpixel rounding
  const problems = [];
  const columnEl = document.querySelector(column);
  const box = (() => {
    const r = columnEl.getBoundingClientRect(), s = getComputedStyle(columnEl);
    const left = r.left + parseFloat(s.paddingLeft) + parseFloat(s.borderLeftWidth);
    const right = r.right - parseFloat(s.paddingRight) - parseFloat(s.borderRightWidth);
    return { left, right };
  })();
  const short = (text) => JSON.stringify(text.trim().replace(/\s+/g, " ").slice(0, 60));
  const parentOf = (el) => el.parentElement || (el.getRootNode() && el.getRootNode().host) || null;
  const visible = (el) =>
    el.checkVisibility({ checkOpacity: true, checkVisibilityCSS: true,
                         opacityProperty: true, visibilityProperty: true });
  // Whether an element cuts what overflows it, across and down. A box that scrolls down
  // is how a page scrolls (Voila's panels do), not a cut; one that scrolls across hides
  // what a reader must scroll sideways to find, so it counts.
  const clips = (el) => {
    const s = getComputedStyle(el);
    return [s.overflowX !== "visible", s.overflowY === "hidden" || s.overflowY === "clip"];
  };
  // ------------------------------------------------------------------ DOM text
  function* elements(root) {
    for (const el of root.querySelectorAll("*")) {
      yield el;
      if (el.shadowRoot) yield* elements(el.shadowRoot);
    }
  }
  function* texts(root) {
    for (const el of [root, ...elements(root)]) {
      const kids = el.shadowRoot ? [...el.childNodes, ...el.shadowRoot.childNodes]
                                 : [...el.childNodes];
      for (const node of kids) {
        if (node.nodeType === Node.TEXT_NODE && node.textContent.trim()) yield [node, el];
      }
    }
  }
  function checkText(node, el) {
    if (["OPTION", "OPTGROUP", "STYLE", "SCRIPT", "TITLE"].includes(el.tagName)) return;
    if (!visible(el)) return;
    const range = document.createRange();
    range.selectNodeContents(node);
    const rects = [...range.getClientRects()].filter((r) => r.width > 0.5 && r.height > 0.5);
    if (!rects.length) return;
    const r = {
      left: Math.min(...rects.map((q) => q.left)), right: Math.max(...rects.map((q) => q.right)),
      top: Math.min(...rects.map((q) => q.top)), bottom: Math.max(...rects.map((q) => q.bottom)),
    };
    if (r.left < box.left - SLACK || r.right > box.right + SLACK) {
      problems.push(`${short(node.textContent)} runs past the text column ` +
                    `(${r.left.toFixed(0)}–${r.right.toFixed(0)} px, column ` +
                    `${box.left.toFixed(0)}–${box.right.toFixed(0)})`);
      return;
    }
    let scrolls = false;  // inside a box that scrolls down: boxes around it cannot cut down
    for (let a = el; a && a !== columnEl; a = parentOf(a)) {
      const [x, y0] = clips(a);
      const y = y0 && !scrolls;
      scrolls = scrolls || ["auto", "scroll"].includes(getComputedStyle(a).overflowY);
      if (!x && !y) continue;
      const q = a.getBoundingClientRect();
      const left = q.left + a.clientLeft, top = q.top + a.clientTop;
      const right = left + a.clientWidth, bottom = top + a.clientHeight;
      const cutX = x && (r.left < left - SLACK || r.right > right + SLACK);
      const cutY = y && (r.top < top - SLACK || r.bottom > bottom + SLACK);
      if (cutX || cutY) {
        const what = (a.className && typeof a.className === "string") ? a.className : a.tagName;
        problems.push(`${short(node.textContent)} is cut by an ancestor that hides overflow ` +
                      `(${what}: text ${r.left.toFixed(0)}–${r.right.toFixed(0)} × ` +
                      `${r.top.toFixed(0)}–${r.bottom.toFixed(0)}, box ${left.toFixed(0)}–` +
                      `${right.toFixed(0)} × ${top.toFixed(0)}–${bottom.toFixed(0)})`);
        return;
      }
    }
  }
  // ------------------------------------------------------------------ <select>
  const ctx = document.createElement("canvas").getContext("2d");
  const textWidth = (text, font) => { ctx.font = font; return ctx.measureText(text).width; };
  function checkSelect(sel) {
    if (!visible(sel) || sel.selectedIndex < 0) return;
    const s = getComputedStyle(sel);
    const shown = sel.options[sel.selectedIndex].text;
    const room = sel.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
    const need = textWidth(shown, `${s.fontStyle} ${s.fontWeight} ${s.fontSize} ${s.fontFamily}`);
    if (need > room + SLACK) {
      problems.push(`${short(shown)} is cut in its drop-down (${need.toFixed(0)} px of text, ` +
                    `${room.toFixed(0)} px of room)`);
    }
  }
  // ------------------------------------------------------------------ canvas text (bokeh)
  function* views(view, seen = new Set()) {
    if (!view || seen.has(view)) return;
    seen.add(view);
    yield view;
    let kids = [];
    try { kids = [...view.children()]; } catch (e) { kids = []; }
    for (const kid of kids) yield* views(kid, seen);
  }
  const inScope = (el) => {
    for (let a = el; a; a = parentOf(a)) if (a.matches && a.matches(scope)) return true;
    return false;
  };
  const font = (m, prefix) =>
    `${m[prefix + "_font_style"]} ${m[prefix + "_font_size"]} ${m[prefix + "_font"]}`;
  function checkPlot(pv) {
    if (!pv.el || !inScope(pv.el) || !visible(pv.el)) return;
    const name = pv.model.title && pv.model.title.text ? pv.model.title.text
                                                        : (pv.model.name || "a plot");
    const frame = pv.frame.bbox, whole = pv.bbox;
    const width = whole.x1 - whole.x0;  // the frame is in the plot's own coordinates
    // A title, or a caption (a Title beside the plot): its widest line, placed as bokeh
    // aligns it on the frame, inside the plot.
    const checkTitle = (t, what) => {
      const need = Math.max(...t.text.split("\n").map((l) => textWidth(l, font(t, "text"))));
      const start = { left: frame.x0, center: (frame.x0 + frame.x1 - need) / 2,
                      right: frame.x1 - need }[t.align] ?? frame.x0;
      if (start < -SLACK || start + need > width + SLACK) {
        problems.push(`${what} ${short(t.text)} is cut (${need.toFixed(0)} px of text from ` +
                      `${start.toFixed(0)} px in a ${width.toFixed(0)} px plot)`);
      }
    };
    const title = pv.model.title;
    if (title && title.text && title.visible) checkTitle(title, "title");
    const sides = [...pv.model.below, ...pv.model.above, ...pv.model.left, ...pv.model.right];
    for (const t of sides.filter((m) => m.type === "Title" && m !== title)) {
      if (t.visible && t.text) checkTitle(t, `caption of ${short(name)}`);
    }
    for (const v of views(pv)) {  // text placed in the plot at a screen position
      const m = v.model;
      if (!m || m.type !== "Label" || !m.visible || !m.text || m.x_units !== "screen") continue;
      const need = textWidth(m.text, font(m, "text"));
      if (m.x + need > width + SLACK) {
        problems.push(`label ${short(m.text)} of ${short(name)} is cut (${need.toFixed(0)} px ` +
                      `of text from ${m.x} px in a ${width.toFixed(0)} px plot)`);
      }
    }
    for (const axis of sides) {
      if (!axis.axis_label || typeof axis.axis_label !== "string" || !axis.visible) continue;
      if (!("axis_label_text_font_size" in axis)) continue;
      const need = textWidth(axis.axis_label, font(axis, "axis_label_text"));
      const across = pv.model.below.includes(axis) || pv.model.above.includes(axis);
      const room = across ? whole.x1 - whole.x0 : whole.y1 - whole.y0;
      if (need > room + SLACK) {
        problems.push(`axis label ${short(axis.axis_label)} of ${short(name)} is cut ` +
                      `(${need.toFixed(0)} px of text, ${room.toFixed(0)} px of plot)`);
      }
    }
    for (const v of views(pv)) {
      if (!v.model || v.model.type !== "Legend" || !v.el || !visible(v.el)) continue;
      if (!v.model.items.length) continue;
      const canvas = pv.canvas_view ? pv.canvas_view.el.getBoundingClientRect()
                                    : pv.el.getBoundingClientRect();
      const f = { left: canvas.left + frame.x0, right: canvas.left + frame.x1,
                  top: canvas.top + frame.y0, bottom: canvas.top + frame.y1 };
      const l = v.el.getBoundingClientRect();
      if (l.width < 1 || l.height < 1) continue;
      const overlap = Math.min(l.right, f.right) - Math.max(l.left, f.left) > SLACK &&
                      Math.min(l.bottom, f.bottom) - Math.max(l.top, f.top) > SLACK;
      if (overlap) {
        problems.push(`the legend of ${short(name)} lies over its data (inside the plot frame)`);
      }
    }
  }
  // ------------------------------------------------------------------ run
  for (const root of document.querySelectorAll(scope)) {
    for (const [node, el] of texts(root)) checkText(node, el);
    for (const el of elements(root)) if (el.tagName === "SELECT") checkSelect(el);
  }
  if (window.Bokeh && Bokeh.index) {
    const seen = new Set();
    for (const root of Bokeh.index.roots) {
      for (const v of views(root, seen)) {
        if (v.model && v.frame && v.model.title !== undefined && v.model.below) checkPlot(v);
      }
    }
  }
  return [...new Set(problems)];
}
