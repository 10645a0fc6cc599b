/* gpuflame viewer: a flame graph of GPU memory on a canvas, from the profile
 * embedded in this page (see gpuflame/render/html.py).
 *
 * Rules this file keeps:
 *  - names, files and labels come from user code: they reach the page only
 *    through canvas fillText and element.textContent, never as markup;
 *  - no network: the data is decoded from the page itself;
 *  - large profiles (100k frames): the tree is aggregated once per (sample
 *    type, label, trampoline setting) into typed arrays, and drawing walks
 *    only nodes wider than MIN_PX, so cost follows what is visible.
 */
"use strict";
(function () {
  const ROW = 18;          // bar height in CSS pixels
  const MIN_PX = 0.5;      // narrower bars (and everything above them) are not drawn
  const TABLE_ROWS = 200;  // rows of the top table put in the DOM
  const TRAMPOLINE_KIND = "trampoline";

  const el = (id) => document.getElementById(id);
  const ui = {
    status: el("status"), title: el("title"), type: el("type-select"), labels: el("label-select"),
    labelBox: el("label-box"), search: el("search"), share: el("match-share"),
    hideTrampolines: el("hide-trampolines"), icicle: el("icicle"), tableToggle: el("table-toggle"),
    reset: el("reset"), breadcrumb: el("breadcrumb"), canvas: el("graph"), tableBox: el("table-box"),
    tableNote: el("table-note"), tableBody: document.querySelector("#top-table tbody"),
    tooltip: el("tooltip"),
  };

  // ---- formatting --------------------------------------------------------

  const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  /** Bytes in binary units, as gpuflame's terminal output writes them. */
  function formatBytes(n) {
    const sign = n < 0 ? "-" : "";
    let v = Math.abs(n), u = 0;
    while (v >= 1024 && u < BYTE_UNITS.length - 1) { v /= 1024; u++; }
    if (u === 0) return sign + Math.round(v) + " B";
    return sign + (v < 10 ? v.toFixed(2) : v.toFixed(1)) + " " + BYTE_UNITS[u];
  }

  function formatValue(n, unit) {
    if (unit === "bytes") return formatBytes(n);
    return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  }

  function percent(part, whole) {
    return whole ? (100 * part / whole).toFixed(part / whole < 0.001 && part ? 3 : 1) + "%" : "0%";
  }

  /** One spelling for search, as symbols/names.py: "Foo > bar" and "Foo.bar" become "foo.bar". */
  function normalize(name) {
    return name.trim().replace(/\s*>\s*/g, ".").toLowerCase();
  }

  // ---- loading -----------------------------------------------------------

  async function decodeData() {
    const text = el("gpuflame-data").textContent.trim();
    const raw = atob(text);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  /** Typed arrays and lookups derived once from the embedded JSON. */
  function prepare(data) {
    const f = data.frames;
    const n = f.name.length;
    const trampolineKind = data.kinds.indexOf(TRAMPOLINE_KIND);
    const isTrampoline = new Uint8Array(n);
    for (let i = 0; i < n; i++) isTrampoline[i] = f.kind[i] === trampolineKind ? 1 : 0;
    // Python sends the frame table sorted by name: a frame's index is its name rank.
    const nameRank = Int32Array.from({ length: n }, (_, i) => i);
    const lengths = data.stacks.length;
    const stackStart = new Int32Array(lengths.length + 1);
    for (let i = 0; i < lengths.length; i++) stackStart[i + 1] = stackStart[i] + lengths[i];
    return {
      data, frameCount: n, names: f.name, normalized: null, isTrampoline, nameRank,
      stackStart, stackFrames: Int32Array.from(data.stacks.frames),
      sampleStack: Int32Array.from(data.samples.stack), sampleLabels: Int32Array.from(data.samples.labels),
      values: data.samples.values.map((col) => Float64Array.from(col)),
    };
  }

  // ---- the tree ----------------------------------------------------------

  /**
   * Aggregate the samples of one sample type into a tree. Node 0 is the
   * root ("total"); a node is a (parent, frame) pair, found through an
   * open-addressing hash table on typed arrays (a Map keyed by numbers this
   * large is several times slower). The number of nodes is at most one per
   * stack entry, so every array is sized once, up front.
   */
  function buildTree(P, typeIndex, allowedLabels, hideTrampolines) {
    const values = P.values[typeIndex];
    const keep = (s) => values[s] > 0 && (!allowedLabels || allowedLabels[P.sampleLabels[s]]);
    let bound = 1;
    for (let s = 0; s < values.length; s++) {
      if (keep(s)) bound += P.stackStart[P.sampleStack[s] + 1] - P.stackStart[P.sampleStack[s]];
    }
    let slots = 1024;
    while (slots < bound * 2) slots *= 2;
    const mask = slots - 1;
    const slotNode = new Int32Array(slots).fill(-1);
    const nodes = {
      frame: new Int32Array(bound), parent: new Int32Array(bound),
      total: new Float64Array(bound), self: new Float64Array(bound),
    };
    let count = 1;
    nodes.frame[0] = -1;
    nodes.parent[0] = -1;
    for (let s = 0; s < values.length; s++) {
      if (!keep(s)) continue; // zero and negative values make no bar
      const v = values[s], sid = P.sampleStack[s];
      let cur = 0;
      nodes.total[0] += v;
      for (let i = P.stackStart[sid], end = P.stackStart[sid + 1]; i < end; i++) {
        const fid = P.stackFrames[i];
        if (hideTrampolines && P.isTrampoline[fid]) continue;
        let slot = (Math.imul(cur, 0x9e3779b1) ^ Math.imul(fid, 0x85ebca6b)) & mask;
        let child;
        for (;;) {
          child = slotNode[slot];
          if (child < 0) {
            child = count++;
            nodes.frame[child] = fid;
            nodes.parent[child] = cur;
            slotNode[slot] = child;
            break;
          }
          if (nodes.parent[child] === cur && nodes.frame[child] === fid) break;
          slot = (slot + 1) & mask;
        }
        nodes.total[child] += v;
        cur = child;
      }
      nodes.self[cur] += v;
    }
    return layout(P, nodes, count);
  }

  function layout(P, nodes, count) {
    const childCount = new Int32Array(count + 1);
    for (let i = 1; i < count; i++) childCount[nodes.parent[i] + 1]++;
    const childStart = new Int32Array(count + 1);
    for (let i = 0; i < count; i++) childStart[i + 1] = childStart[i] + childCount[i + 1];
    const fill = childStart.slice(0, count);
    const childOrder = new Int32Array(Math.max(count - 1, 0));
    for (let i = 1; i < count; i++) childOrder[fill[nodes.parent[i]]++] = i;
    const rank = P.nameRank;
    for (let p = 0; p < count; p++) {
      const a = childStart[p], b = childStart[p + 1];
      if (b - a > 1) {
        const part = childOrder.subarray(a, b);
        part.sort((x, y) => rank[nodes.frame[x]] - rank[nodes.frame[y]]);
      }
    }
    const x = new Float64Array(count), depth = new Int32Array(count);
    let maxDepth = 0;
    const pending = [0];
    while (pending.length) {
      const n = pending.pop();
      let offset = x[n];
      for (let i = childStart[n]; i < childStart[n + 1]; i++) {
        const c = childOrder[i];
        x[c] = offset;
        depth[c] = depth[n] + 1;
        if (depth[c] > maxDepth) maxDepth = depth[c];
        offset += nodes.total[c];
        pending.push(c);
      }
    }
    return {
      count, frame: nodes.frame.subarray(0, count), parent: nodes.parent.subarray(0, count),
      total: nodes.total.subarray(0, count), self: nodes.self.subarray(0, count),
      childStart, childOrder, x, depth, maxDepth,
    };
  }

  /** Self and total per function; a recursive function's total counts once per stack. */
  function functionTable(P, tree) {
    const self = new Float64Array(P.frameCount), total = new Float64Array(P.frameCount);
    const onStack = new Int32Array(P.frameCount);
    const seen = new Uint8Array(P.frameCount);
    const pending = [0], leaving = [false];
    while (pending.length) {
      const n = pending.pop(), exit = leaving.pop(), f = tree.frame[n];
      if (exit) { onStack[f]--; continue; }
      if (f >= 0) {
        seen[f] = 1;
        self[f] += tree.self[n];
        if (!onStack[f]) total[f] += tree.total[n];
        onStack[f]++;
        pending.push(n); leaving.push(true);
      }
      for (let i = tree.childStart[n]; i < tree.childStart[n + 1]; i++) {
        pending.push(tree.childOrder[i]); leaving.push(false);
      }
    }
    const rows = [];
    for (let f = 0; f < P.frameCount; f++) if (seen[f]) rows.push(f);
    return { self, total, rows };
  }

  // ---- state -------------------------------------------------------------

  const state = {
    P: null, tree: null, table: null, typeIndex: 0, labelSet: -1, hideTrampolines: false, icicle: false,
    focus: 0, query: "", selectedFrame: -1, matches: null, matchTotal: 0,
    sortKey: "self", entry: null, timings: {}, drawn: null, drawnCount: 0, ready: false, buildMs: 0, drawMs: 0, cache: new Map(),
  };

  function unitOf() { return state.P.data.types[state.typeIndex][1]; }

  function currentTree() {
    const key = state.typeIndex + "/" + state.labelSet + "/" + state.hideTrampolines;
    let entry = state.cache.get(key);
    if (!entry) {
      const t0 = performance.now();
      const allowed = state.labelSet < 0 ? null : labelFilter(state.labelSet);
      const tree = buildTree(state.P, state.typeIndex, allowed, state.hideTrampolines);
      entry = { tree, table: null };
      state.buildMs = performance.now() - t0;
      if (state.cache.size > 8) state.cache.clear();
      state.cache.set(key, entry);
    }
    return entry;
  }

  /** Label choices are "key=value" pairs; a sample qualifies if its label set has the pair. */
  function labelChoices() {
    const seen = new Map();
    state.P.data.labelSets.forEach((set) => set.forEach(([k, v]) => seen.set(k + "=" + v, [k, v])));
    return Array.from(seen.values()).sort((a, b) => (a[0] + a[1] < b[0] + b[1] ? -1 : 1));
  }

  function labelFilter(choice) {
    const [key, value] = state.labelOptions[choice];
    return Uint8Array.from(state.P.data.labelSets, (set) => (set.some(([k, v]) => k === key && v === value) ? 1 : 0));
  }

  function useTree(keepFocusPath) {
    const path = keepFocusPath ? framePath(state.focus) : [];
    const entry = currentTree();
    state.tree = entry.tree;
    state.entry = entry;
    state.focus = nodeOnPath(path);
    updateMatches();
    renderTable();
    scheduleDraw();
  }

  function framePath(node) {
    const out = [];
    for (let n = node; n > 0; n = state.tree.parent[n]) out.push(state.tree.frame[n]);
    return out.reverse();
  }

  /** The node reached by following frame ids from the root in the current tree (0 if lost). */
  function nodeOnPath(path) {
    const t = state.tree;
    let node = 0;
    for (const fid of path) {
      let next = -1;
      for (let i = t.childStart[node]; i < t.childStart[node + 1]; i++) {
        if (t.frame[t.childOrder[i]] === fid) { next = t.childOrder[i]; break; }
      }
      if (next < 0) return node;
      node = next;
    }
    return node;
  }

  // ---- search ------------------------------------------------------------

  /** Which frames match; and the share of the total under matching frames, counted once per stack. */
  function updateMatches() {
    const P = state.P, t = state.tree;
    let matches = null;
    if (state.selectedFrame >= 0) {
      matches = new Uint8Array(P.frameCount);
      matches[state.selectedFrame] = 1;
    } else if (state.query) {
      const q = normalize(state.query);
      if (!P.normalized) P.normalized = P.names.map(normalize); // on the first search only
      matches = new Uint8Array(P.frameCount);
      for (let f = 0; f < P.frameCount; f++) if (P.normalized[f].includes(q)) matches[f] = 1;
    }
    state.matches = matches;
    state.matchTotal = 0;
    if (matches) {
      const pending = [0];
      while (pending.length) {
        const n = pending.pop();
        if (n > 0 && matches[t.frame[n]]) { state.matchTotal += t.total[n]; continue; }
        for (let i = t.childStart[n]; i < t.childStart[n + 1]; i++) pending.push(t.childOrder[i]);
      }
    }
    showMatchShare();
  }

  function showMatchShare() {
    if (!state.matches) { ui.share.textContent = ""; return; }
    const total = state.tree.total[0];
    ui.share.textContent = "matches " + percent(state.matchTotal, total) + " (" +
      formatValue(state.matchTotal, unitOf()) + " of " + formatValue(total, unitOf()) + ")";
  }

  // ---- drawing -----------------------------------------------------------

  let drawPending = false;
  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(() => { drawPending = false; draw(); });
  }

  const HUES = { python: [8, 44], native: [190, 230], trampoline: null, synthetic: [265, 300] };

  function nameHash(s) {
    let h = 2166136261;
    for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
    return (h >>> 0) / 4294967296;
  }

  const colorCache = new Map();
  function frameColor(fid) {
    if (fid < 0) return "#c9c9ce";
    if (state.matches && !state.matches[fid]) return "#e4e4e8";
    let c = colorCache.get(fid);
    if (!c) {
      const kind = state.P.data.kinds[state.P.data.frames.kind[fid]];
      const range = HUES[kind];
      const h = nameHash(state.P.names[fid]);
      c = range ? "hsl(" + Math.round(range[0] + h * (range[1] - range[0])) + ",78%," + Math.round(62 + h * 10) + "%)"
        : "hsl(0,0%," + Math.round(74 + h * 8) + "%)";
      colorCache.set(fid, c);
    }
    return c;
  }

  function nodeLabel(n) {
    return n === 0 ? "total" : state.P.names[state.tree.frame[n]];
  }

  function draw() {
    const t0 = performance.now();
    const t = state.tree, canvas = ui.canvas, ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.parentElement.clientWidth || 800;
    const rows = t.maxDepth + 1;
    const height = rows * ROW;
    canvas.style.height = height + "px";
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "12px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    const charWidth = ctx.measureText("abcdefghijklmnopqrstuvwxyz_ABCDE >").width / 34;
    const drawn = { node: [], x: [], y: [], w: [] };
    const rowY = (d) => (state.icicle ? d * ROW : height - (d + 1) * ROW);
    const bar = (n, x, w) => {
      const y = rowY(t.depth[n]);
      ctx.fillStyle = frameColor(t.frame[n]);
      ctx.fillRect(x, y, Math.max(w - 0.5, 0.5), ROW - 1);
      drawn.node.push(n); drawn.x.push(x); drawn.y.push(y); drawn.w.push(w);
      if (w > 3 * charWidth + 6) {
        let label = nodeLabel(n);
        const fits = Math.floor((w - 6) / charWidth);
        if (label.length > fits) label = label.slice(0, Math.max(fits - 1, 1)) + "\u2026";
        ctx.fillStyle = "#111";
        ctx.fillText(label, x + 3, y + ROW / 2);
      }
    };
    // The focused node and its callers span the full width, as in Grafana's focus.
    for (let n = state.focus; n >= 0; n = t.parent[n]) bar(n, 0, width);
    const f = state.focus;
    const scale = t.total[f] > 0 ? width / t.total[f] : 0;
    const pending = [];
    for (let i = t.childStart[f]; i < t.childStart[f + 1]; i++) pending.push(t.childOrder[i]);
    while (pending.length) {
      const n = pending.pop();
      const w = t.total[n] * scale;
      if (w < MIN_PX) continue;
      bar(n, (t.x[n] - t.x[f]) * scale, w);
      for (let i = t.childStart[n]; i < t.childStart[n + 1]; i++) pending.push(t.childOrder[i]);
    }
    state.drawn = drawn;
    state.drawnCount = drawn.node.length;
    state.drawMs = performance.now() - t0;
    renderBreadcrumb();
    if (!state.ready) {
      state.timings.firstPaint = performance.now(); // since navigation start
      state.ready = true;
      document.body.dataset.ready = "1";
    }
    ui.status.textContent = statusLine();
  }

  function statusLine() {
    const d = state.P.data, t = state.tree, st = d.types[state.typeIndex];
    return st[0] + ": " + formatValue(t.total[0], st[1]) + " in " + (t.count - 1).toLocaleString("en") +
      " bars, " + state.P.frameCount.toLocaleString("en") + " functions" +
      (d.comments.length ? "\n" + d.comments.join("\n") : "");
  }

  function nodeAt(clientX, clientY) {
    const r = ui.canvas.getBoundingClientRect();
    const x = clientX - r.left, y = clientY - r.top, d = state.drawn;
    if (!d) return -1;
    for (let i = d.node.length - 1; i >= 0; i--) {
      if (y >= d.y[i] && y < d.y[i] + ROW && x >= d.x[i] && x < d.x[i] + d.w[i]) return d.node[i];
    }
    return -1;
  }

  // ---- breadcrumb, tooltip, table ------------------------------------------

  function renderBreadcrumb() {
    const parts = [];
    for (let n = state.focus; n >= 0; n = state.tree.parent[n]) parts.push(n);
    parts.reverse();
    const lead = document.createElement("span");
    lead.className = "sep";
    lead.textContent = "focus:";
    ui.breadcrumb.replaceChildren(lead);
    parts.forEach((n, i) => {
      if (i) {
        const sep = document.createElement("span");
        sep.className = "sep";
        sep.textContent = "\u203a";
        ui.breadcrumb.append(sep);
      }
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = nodeLabel(n);
      b.disabled = n === state.focus;
      b.addEventListener("click", () => setFocus(n));
      ui.breadcrumb.append(b);
    });
  }

  function showTooltip(n, clientX, clientY) {
    const t = state.tree, unit = unitOf(), whole = t.total[0];
    const lines = [
      "total " + formatValue(t.total[n], unit) + " (" + percent(t.total[n], whole) + ")",
      "self  " + formatValue(t.self[n], unit) + " (" + percent(t.self[n], whole) + ")",
    ];
    if (n > 0) {
      const d = state.P.data, fid = t.frame[n];
      const file = d.files[d.frames.file[fid]], line = d.frames.line[fid];
      if (file) lines.push(line ? file + ":" + line : file);
      lines.push(d.kinds[d.frames.kind[fid]] + " frame");
    }
    const name = document.createElement("div");
    name.className = "name";
    name.textContent = nodeLabel(n);
    const body = document.createElement("div");
    body.textContent = lines.join("\n");
    ui.tooltip.replaceChildren(name, body);
    ui.tooltip.hidden = false;
    const pad = 14, w = ui.tooltip.offsetWidth, h = ui.tooltip.offsetHeight;
    ui.tooltip.style.left = Math.min(clientX + pad, window.innerWidth - w - 4) + "px";
    ui.tooltip.style.top = (clientY + pad + h > window.innerHeight ? clientY - h - pad : clientY + pad) + "px";
  }

  /** The per-function table of the current tree, computed when the table is first shown. */
  function currentTable() {
    const entry = state.entry;
    if (!entry.table) {
      const t0 = performance.now();
      entry.table = functionTable(state.P, entry.tree);
      state.timings.table = performance.now() - t0;
    }
    return entry.table;
  }

  function sortedTableRows() {
    const tb = currentTable(), key = state.sortKey, names = state.P.names;
    let rows = tb.rows;
    if (state.matches) rows = rows.filter((f) => state.matches[f]);
    rows = rows.slice();
    if (key === "name") rows.sort((a, b) => state.P.nameRank[a] - state.P.nameRank[b]);
    else {
      const v = tb[key], other = key === "self" ? tb.total : tb.self;
      rows.sort((a, b) => v[b] - v[a] || other[b] - other[a] || (names[a] < names[b] ? -1 : 1));
    }
    return rows;
  }

  function renderTable() {
    if (ui.tableBox.hidden) return;
    const rows = sortedTableRows(), tb = currentTable(), unit = unitOf(), whole = state.tree.total[0];
    const d = state.P.data;
    const shown = rows.slice(0, TABLE_ROWS);
    const cell = (text, cls) => {
      const td = document.createElement("td");
      td.textContent = text;
      if (cls) td.className = cls;
      return td;
    };
    const trs = shown.map((f) => {
      const tr = document.createElement("tr");
      const file = d.files[d.frames.file[f]], line = d.frames.line[f];
      tr.append(
        cell(state.P.names[f]),
        cell(formatValue(tb.self[f], unit) + "  " + percent(tb.self[f], whole), "num"),
        cell(formatValue(tb.total[f], unit) + "  " + percent(tb.total[f], whole), "num"),
        cell(file ? (line ? file + ":" + line : file) : "", "loc"),
      );
      if (f === state.selectedFrame) tr.className = "selected";
      tr.addEventListener("click", () => selectFrame(f));
      return tr;
    });
    ui.tableBody.replaceChildren(...trs);
    ui.tableNote.textContent = (rows.length > shown.length ? "top " + shown.length + " of " : "") +
      rows.length.toLocaleString("en") + " functions, by " + state.sortKey +
      (state.selectedFrame >= 0 ? " (click the selected row again to clear)" : "");
    document.querySelectorAll("#top-table th button").forEach((b) => {
      b.classList.toggle("sorted", b.dataset.sort === state.sortKey);
    });
    state.tableRows = shown.map((f) => state.P.names[f]);
  }

  // ---- actions -----------------------------------------------------------

  function setFocus(n) {
    state.focus = n;
    scheduleDraw();
  }

  /** From the table: highlight every bar of the function and focus its widest one. */
  function selectFrame(f) {
    if (state.selectedFrame === f) { state.selectedFrame = -1; }
    else {
      state.selectedFrame = f;
      const t = state.tree;
      let best = -1;
      for (let n = 1; n < t.count; n++) {
        if (t.frame[n] === f && (best < 0 || t.total[n] > t.total[best])) best = n;
      }
      state.focus = best > 0 ? best : 0;
    }
    updateMatches();
    renderTable();
    scheduleDraw();
  }

  function setQuery(q) {
    state.query = q;
    state.selectedFrame = -1;
    updateMatches();
    renderTable();
    scheduleDraw();
  }

  function wire() {
    ui.search.addEventListener("input", () => setQuery(ui.search.value));
    ui.type.addEventListener("change", () => { state.typeIndex = Number(ui.type.value); useTree(true); });
    ui.labels.addEventListener("change", () => { state.labelSet = Number(ui.labels.value); useTree(true); });
    ui.hideTrampolines.addEventListener("change", () => {
      state.hideTrampolines = ui.hideTrampolines.checked;
      useTree(false);
    });
    ui.icicle.addEventListener("change", () => { state.icicle = ui.icicle.checked; scheduleDraw(); });
    ui.reset.addEventListener("click", () => {
      ui.search.value = "";
      state.query = "";
      state.selectedFrame = -1;
      state.focus = 0;
      updateMatches();
      renderTable();
      scheduleDraw();
    });
    ui.tableToggle.addEventListener("click", () => {
      ui.tableBox.hidden = !ui.tableBox.hidden;
      renderTable();
    });
    document.querySelectorAll("#top-table th button").forEach((b) => {
      b.addEventListener("click", () => { state.sortKey = b.dataset.sort; renderTable(); });
    });
    ui.canvas.addEventListener("mousemove", (e) => {
      const n = nodeAt(e.clientX, e.clientY);
      if (n < 0) ui.tooltip.hidden = true;
      else showTooltip(n, e.clientX, e.clientY);
    });
    ui.canvas.addEventListener("mouseleave", () => { ui.tooltip.hidden = true; });
    ui.canvas.addEventListener("click", (e) => {
      const n = nodeAt(e.clientX, e.clientY);
      if (n >= 0) setFocus(n);
    });
    window.addEventListener("resize", scheduleDraw);
  }

  function fillSelectors() {
    const d = state.P.data;
    d.types.forEach(([type, unit], i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = type + " (" + unit + ")";
      ui.type.append(o);
    });
    ui.type.value = String(state.typeIndex);
    state.labelOptions = labelChoices();
    const all = document.createElement("option");
    all.value = "-1";
    all.textContent = "all";
    ui.labels.append(all);
    state.labelOptions.forEach(([k, v], i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = k + "=" + v;
      ui.labels.append(o);
    });
    ui.labelBox.hidden = state.labelOptions.length === 0;
  }

  /** A read-only summary for tests and scripts: window.gpuflameState. */
  function exposeState() {
    Object.defineProperty(window, "gpuflameState", {
      enumerable: true,
      get() {
        if (!state.P) return Object.freeze({ ready: false, error: state.error || null });
        const t = state.tree;
        return Object.freeze({
          ready: state.ready, error: state.error || null, type: state.P.data.types[state.typeIndex][0],
          types: state.P.data.types.map((x) => x[0]), total: t.total[0], drawnRects: state.drawnCount,
          nodes: t.count, functions: state.P.frameCount, focus: nodeLabel(state.focus),
          focusPath: framePath(state.focus).map((f) => state.P.names[f]), query: state.query,
          matchTotal: state.matches ? state.matchTotal : null,
          matchShare: state.matches ? (t.total[0] ? state.matchTotal / t.total[0] : 0) : null,
          matchText: ui.share.textContent, tableRows: Object.freeze((state.tableRows || []).slice()),
          tableSort: state.sortKey, hideTrampolines: state.hideTrampolines, icicle: state.icicle,
          buildMs: state.buildMs, drawMs: state.drawMs, timings: Object.freeze({ ...state.timings }),
        });
      },
    });
  }

  /** Where the drawn bar of a node is, for tests: {x, y} in client pixels, or null. */
  function barCenter(name) {
    const d = state.drawn, r = ui.canvas.getBoundingClientRect();
    if (!d) return null;
    for (let i = 0; i < d.node.length; i++) {
      if (nodeLabel(d.node[i]) === name) return { x: r.left + d.x[i] + d.w[i] / 2, y: r.top + d.y[i] + ROW / 2 };
    }
    return null;
  }

  async function start() {
    exposeState();
    Object.defineProperty(window, "gpuflameBarCenter", { value: barCenter });
    try {
      let t0 = performance.now();
      const data = await decodeData();
      state.timings.decode = performance.now() - t0;
      t0 = performance.now();
      state.P = prepare(data);
      state.timings.prepare = performance.now() - t0;
      state.typeIndex = data.defaultType || 0;
      document.title = "gpuflame: " + data.title;
      ui.title.textContent = data.title;
      ui.title.title = data.title;
      fillSelectors();
      wire();
      useTree(false);
    } catch (err) {
      state.error = String(err && err.message ? err.message : err);
      ui.status.textContent = "cannot read the profile in this page: " + state.error;
    }
  }

  start();
})();
