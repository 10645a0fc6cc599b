/* gpuflame viewer: a flame graph of GPU memory on a canvas, from the profile
 * embedded in this page (see gpuflame/render/html.py).
 *
 * Rules this file keeps:
 *  - names, files and labels come from user code: they reach the page only
 *    through canvas fillText and element.textContent, never as markup;
 *  - no network: the data is decoded from the page itself;
 *  - large profiles (a million frames): numbers arrive as typed arrays and
 *    stacks as one prefix tree, so with no frame hidden the tree is summed
 *    over its nodes in one pass (treeOfStacks); it is aggregated once per
 *    (sample type, label, hiding setting), drawing walks only nodes wider
 *    than MIN_PX, and the top table and the search index wait until asked.
 *
 * Diff mode (the page embeds a second sample set, "base"): one tree holds
 * both profiles, widths are NEW's, colours say how each bar changed. A bar
 * that only BASE has would be zero wide, so such "vanished" stacks are
 * listed under the graph instead (widths of max(base, new) would make
 * children overflow their parent, and base + new would no longer read as
 * NEW's memory).
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
    hideTrampolines: el("hide-trampolines"), hideFramework: el("hide-framework"), icicle: el("icicle"), tableToggle: el("table-toggle"),
    reset: el("reset"), breadcrumb: el("breadcrumb"), canvas: el("graph"), tableBox: el("table-box"),
    tableNote: el("table-note"), tableBody: document.querySelector("#top-table tbody"),
    tooltip: el("tooltip"), paletteBox: el("palette-box"), palette: el("cb-palette"),
    categoryBox: el("category-box"), byCategory: el("by-category"), categoryLegend: el("category-legend"),
    diffSummary: el("diff-summary"), vanishedBox: el("vanished-box"), vanished: el("vanished"),
    expandGroups: el("expand-groups"), collapseGroups: el("collapse-groups"),
    timelineBox: el("timeline-box"), timeline: el("timeline"),
    momentBox: el("moment-box"), momentLabel: el("moment-label"), momentBack: el("moment-back"),
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

  /** The page's payload (render/html.py encode_payload): a JSON head whose arrays are typed views of the body. */
  async function decodeData() {
    // Each copy of the payload is let go once read: at a million frames they are tens of MB each
    // (the DOM's text, its base64 as a string, the gzip bytes), and the renderer's memory is their sum.
    const node = el("gpuflame-data");
    let text = node.textContent.trim();
    node.textContent = "";
    let bytes;
    if (Uint8Array.fromBase64) bytes = Uint8Array.fromBase64(text);
    else {
      const raw = atob(text);
      bytes = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    }
    text = null;
    const size = bytes.length >= 18 ? new DataView(bytes.buffer, bytes.byteOffset).getUint32(bytes.length - 4, true) : 0;
    const blob = new Blob([bytes]);
    bytes = null;
    const { json, arrays } = await inflate(blob.stream().pipeThrough(new DecompressionStream("gzip")), size);
    const head = JSON.parse(new TextDecoder().decode(json));
    const Kinds = { i4: Int32Array, u1: Uint8Array, f8: Float64Array };
    const resolve = (v) => {
      if (v === null || typeof v !== "object") return v;
      if (Array.isArray(v)) {
        if (v.length && typeof v[0] === "object") for (let i = 0; i < v.length; i++) v[i] = resolve(v[i]);
        return v;
      }
      const ref = v["@"];
      if (ref) return new Kinds[ref[0]](arrays, ref[1], ref[2]);
      for (const k of Object.keys(v)) v[k] = resolve(v[k]);
      return v;
    };
    return resolve(head);
  }

  /**
   * The inflated body in two buffers of the sizes its head and gzip's trailer give (the stream checks
   * that trailer): the head (u32 length, JSON, padding to 8), whose JSON is let go once parsed, and the
   * arrays, which the page views in place. Pieces are copied in as they come instead of being held to the end and
   * joined; at a million frames that kept 80 MB twice, and the 33 MB head for as long as the page.
   */
  async function inflate(stream, size) {
    const reader = stream.getReader();
    const first = new Uint8Array(4);
    let head = null, arrays = null, length = 0, start = 0, at = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (at + value.length > size) throw new Error("the page's data is larger than its gzip trailer says");
      let piece = value;
      if (head === null) {  // the head's length: its first 4 bytes
        const take = Math.min(4 - at, piece.length);
        first.set(piece.subarray(0, take), at);
        at += take;
        piece = piece.subarray(take);
        if (at < 4) continue;
        length = new DataView(first.buffer).getUint32(0, true);
        start = 4 + length + ((8 - (4 + length) % 8) % 8);
        if (start > size) throw new Error("the page's data is cut short");
        head = new Uint8Array(start);
        head.set(first);
        arrays = new Uint8Array(size - start);
      }
      const inHead = Math.max(0, Math.min(piece.length, start - at));
      if (inHead) head.set(piece.subarray(0, inHead), at);
      if (piece.length > inHead) arrays.set(piece.subarray(inHead), at + inHead - start);
      at += piece.length;
    }
    if (head === null || at !== size) throw new Error("the page's data is cut short");
    return { json: head.subarray(4, 4 + length), arrays: arrays.buffer };
  }

  const asInt32 = (a) => (a instanceof Int32Array ? a : Int32Array.from(a));
  const asFloat64 = (a) => (a instanceof Float64Array ? a : Float64Array.from(a));

  /**
   * Typed arrays and lookups derived once from the embedded data. Stacks are
   * a prefix tree (stacks.parent, stacks.frame; node 0 the root, parents
   * before children): a sample's stack is the node where it ends.
   */
  function prepare(data) {
    const f = data.frames;
    const n = f.name.length;
    const trampolineKind = data.kinds.indexOf(TRAMPOLINE_KIND);
    const isTrampoline = new Uint8Array(n);
    for (let i = 0; i < n; i++) isTrampoline[i] = f.kind[i] === trampolineKind ? 1 : 0;
    const isFramework = f.framework ? Uint8Array.from(f.framework) : new Uint8Array(n);
    // Python sends the frame table sorted by name: a frame's index is its name rank.
    const nameRank = new Int32Array(n);
    for (let i = 0; i < n; i++) nameRank[i] = i;
    const stackParent = asInt32(data.stacks.parent), stackFrame = asInt32(data.stacks.frame);
    const stackDepth = new Int32Array(stackParent.length);
    for (let i = 1; i < stackParent.length; i++) stackDepth[i] = stackDepth[stackParent[i]] + 1;
    // a snapshot's peak counts what the allocator reserved; the strip counts allocations only: say which
    const reserved = f.name.includes("<cached free blocks>") || f.name.includes("<allocator rounding>");
    return {
      data, frameCount: n, names: f.name, normalized: null, isTrampoline, isFramework, nameRank, reserved,
      categoryOfSet: categoryOfSets(data.labelSets),
      stackParent, stackFrame, stackDepth,
      ...sampleSet(data.samples), base: data.base ? sampleSet(data.base.samples) : null,
    };
  }

  // The `category` label's values (model/categories.py) and their fixed colours in the
  // colour-by-category mode: one colour per kind of memory, the same on every page.
  // (tests/unit/render/test_viewer_categories_in_step.py keeps the list equal to the vocabulary's)
  const CATEGORIES = ["parameter", "frozen_parameter", "gradient", "optimizer_state", "kv_cache", "comm_buffer",
    "activation", "other", "cached_free", "outside_framework"];
  const CATEGORY_COLORS = ["#4e79a7", "#a0cbe8", "#f28e2b", "#76b7b2", "#e15759", "#edc948", "#59a14f", "#bab0ac",
    "#dddddd", "#b07aa1"];

  /** Per label set: the index of its `category` value in CATEGORIES, -1 without one; null when no set has one. */
  function categoryOfSets(labelSets) {
    const out = Int8Array.from(labelSets, (set) => {
      const pair = set.find(([k]) => k === "category");
      return pair ? CATEGORIES.indexOf(pair[1]) : -1;
    });
    return out.some((c) => c >= 0) ? out : null;
  }

  /** One profile's samples (NEW's, or BASE's in diff mode) as typed columns. */
  function sampleSet(samples) {
    return {
      sampleStack: asInt32(samples.stack), sampleLabels: asInt32(samples.labels),
      values: samples.values.map(asFloat64),
    };
  }

  // ---- the tree ----------------------------------------------------------

  /**
   * Aggregate the samples of one sample type into a tree. Node 0 is the
   * root ("total"); a node is a (parent, frame) pair (see treeBuilder).
   * In diff mode BASE's samples go into the same tree, in node.base, so a
   * bar's change is one subtraction and search, focus and type switches
   * work on both at once.
   */
  function buildTree(P, typeIndex, allowedLabels, hideTrampolines, hideFramework) {
    const sets = [{ set: P, into: "total" }];
    if (P.base) sets.push({ set: P.base, into: "base" });
    const keep = (set, s) => set.values[typeIndex][s] > 0 && (!allowedLabels || allowedLabels[set.sampleLabels[s]]);
    const K = CATEGORIES.length, withCats = Boolean(P.categoryOfSet && !P.base);
    if (!hideTrampolines && !hideFramework) return treeOfStacks(P, sets, typeIndex, keep, withCats);
    let bound = 1, deepest = 0;
    for (const { set } of sets) {
      for (let s = 0; s < set.sampleStack.length; s++) {
        if (keep(set, s)) { const d = P.stackDepth[set.sampleStack[s]]; bound += d; deepest = Math.max(deepest, d); }
      }
    }
    const b = treeBuilder(bound, P.base !== null);
    const cats = withCats ? new Float64Array(bound * K) : null;
    const stack = new Int32Array(deepest); // one sample's frames, root first
    for (const { set, into } of sets) {
      const values = set.values[typeIndex], sums = b.nodes[into];
      for (let s = 0; s < values.length; s++) {
        if (!keep(set, s)) continue; // zero and negative values make no bar
        const v = values[s], sid = set.sampleStack[s];
        const k = cats ? P.categoryOfSet[set.sampleLabels[s]] : -1;
        let cur = 0;
        sums[0] += v;
        const end = P.stackDepth[sid];
        for (let node = sid, i = end; node > 0; node = P.stackParent[node]) stack[--i] = P.stackFrame[node];
        const kept = hideFramework ? frameworkKept(P, stack, end) : null;
        for (let i = 0; i < end; i++) {
          const fid = stack[i];
          if (hideTrampolines && P.isTrampoline[fid]) continue;
          if (kept && !kept(i)) continue;
          cur = b.child(cur, fid);
          sums[cur] += v;
          if (cats && k >= 0) cats[cur * K + k] += v;
        }
        if (into === "total") b.nodes.self[cur] += v;
      }
    }
    const tree = layout(P, b.nodes, b.count());
    tree.category = cats ? dominantCategories(cats, tree.count, K) : null;
    return tree;
  }

  /**
   * The tree when no frame is hidden: the stack tree itself, summed once
   * from the leaves down (children come after their parent), then the
   * nodes no kept sample reaches are dropped. No per-frame work, so a
   * million-frame page paints in a second or two.
   */
  function treeOfStacks(P, sets, typeIndex, keep, withCats) {
    const N = P.stackParent.length, K = CATEGORIES.length, parent = P.stackParent;
    const total = new Float64Array(N), self = new Float64Array(N), base = P.base ? new Float64Array(N) : null;
    const cats = withCats ? new Float64Array(N * K) : null;
    for (const { set, into } of sets) {
      const values = set.values[typeIndex];
      for (let s = 0; s < values.length; s++) {
        if (!keep(set, s)) continue;
        const v = values[s], sid = set.sampleStack[s];
        if (into === "base") { base[sid] += v; continue; }
        total[sid] += v; self[sid] += v;
        const k = cats ? P.categoryOfSet[set.sampleLabels[s]] : -1;
        if (k >= 0 && sid > 0) cats[sid * K + k] += v;
      }
    }
    for (let n = N - 1; n > 0; n--) {
      const p = parent[n];
      total[p] += total[n];
      if (base) base[p] += base[n];
      if (cats && p > 0) for (let k = 0; k < K; k++) cats[p * K + k] += cats[n * K + k];
    }
    const id = new Int32Array(N).fill(-1);
    let count = 1;
    id[0] = 0;
    for (let n = 1; n < N; n++) if (total[n] > 0 || (base && base[n] > 0)) id[n] = count++;
    const nodes = {
      frame: new Int32Array(count), parent: new Int32Array(count), total: new Float64Array(count),
      self: new Float64Array(count), base: base ? new Float64Array(count) : null,
    };
    const dominant = cats ? dominantCategories(cats, N, K) : null, category = cats ? new Int8Array(count).fill(-1) : null;
    for (let n = 0; n < N; n++) {
      const m = id[n];
      if (m < 0) continue;
      nodes.frame[m] = n ? P.stackFrame[n] : -1;
      nodes.parent[m] = n ? id[parent[n]] : -1;
      nodes.total[m] = total[n]; nodes.self[m] = self[n];
      if (base) nodes.base[m] = base[n];
      if (category) category[m] = dominant[n];
    }
    const tree = layout(P, nodes, count, true);
    tree.category = category;
    return tree;
  }

  /** Per node: the category holding most of its bytes (-1: none), what colour-by-category paints. */
  function dominantCategories(cats, count, K) {
    const out = new Int8Array(count).fill(-1);
    for (let n = 0; n < count; n++) {
      let best = 0;
      for (let k = 0; k < K; k++) if (cats[n * K + k] > best) { best = cats[n * K + k]; out[n] = k; }
    }
    return out;
  }

  /**
   * Which positions of one stack (root first) stay when framework frames are
   * hidden, as `gpuflame report --prune-framework` does: framework frames
   * between the outermost and the innermost user frame go; below the
   * innermost user frame the framework function it called stays, and the
   * innermost class method under it (flag 2: "Adam > _init_group", what the
   * memory is); framework frames below the outermost user frame (a launcher)
   * stay; a stack with no user frame stays whole.
   */
  function frameworkKept(P, stack, end) {
    let first = -1, last = -1, named = -1;
    for (let i = 0; i < end; i++) {
      if (!P.isFramework[stack[i]]) { if (first < 0) first = i; last = i; }
    }
    if (first < 0) return null;
    for (let i = end - 1; i > last + 1 && named < 0; i--) if (P.isFramework[stack[i]] === 2) named = i;
    return (i) => !P.isFramework[stack[i]] || i < first || i === last + 1 || i === named;
  }

  /**
   * Typed arrays for at most `bound` nodes, and child(parent, frame) that
   * finds or adds that node through an open-addressing hash table (a Map
   * keyed by numbers this large is several times slower).
   */
  function treeBuilder(bound, withBase) {
    let slots = 1024;
    while (slots < bound * 2) slots *= 2;
    const mask = slots - 1;
    const slotNode = new Int32Array(slots).fill(-1);
    const nodes = {
      frame: new Int32Array(bound), parent: new Int32Array(bound),
      total: new Float64Array(bound), self: new Float64Array(bound),
      base: withBase ? new Float64Array(bound) : null,
    };
    let count = 1;
    nodes.frame[0] = -1;
    nodes.parent[0] = -1;
    function child(cur, fid) {
      let slot = (Math.imul(cur, 0x9e3779b1) ^ Math.imul(fid, 0x85ebca6b)) & mask;
      for (;;) {
        let node = slotNode[slot];
        if (node < 0) {
          node = count++;
          nodes.frame[node] = fid;
          nodes.parent[node] = cur;
          slotNode[slot] = node;
          return node;
        }
        if (nodes.parent[node] === cur && nodes.frame[node] === fid) return node;
        slot = (slot + 1) & mask;
      }
    }
    return { nodes, child, count: () => count };
  }

  let treeIds = 0; // so a group's key names its tree as well as its node

  /**
   * Children lists, x offsets and depths of a tree built by treeBuilder or
   * treeOfStacks. `ordered`: every node comes after its parent and siblings
   * come in name order (the stack tree's numbering), so one forward pass
   * lays it out with no sort and no walk.
   */
  function layout(P, nodes, count, ordered = false) {
    const childCount = new Int32Array(count + 1);
    for (let i = 1; i < count; i++) childCount[nodes.parent[i] + 1]++;
    const childStart = new Int32Array(count + 1);
    for (let i = 0; i < count; i++) childStart[i + 1] = childStart[i] + childCount[i + 1];
    const fill = childStart.slice(0, count);
    const childOrder = new Int32Array(Math.max(count - 1, 0));
    for (let i = 1; i < count; i++) childOrder[fill[nodes.parent[i]]++] = i;
    const x = new Float64Array(count), depth = new Int32Array(count);
    let maxDepth = 0;
    if (ordered) {
      const next = new Float64Array(count); // where a node's next child starts
      for (let c = 1; c < count; c++) {
        const p = nodes.parent[c];
        x[c] = next[c] = next[p];
        next[p] += nodes.total[c];
        depth[c] = depth[p] + 1;
        if (depth[c] > maxDepth) maxDepth = depth[c];
      }
    } else {
      sortChildren(P, nodes, count, childStart, childOrder);
      maxDepth = placeChildren(nodes, childStart, childOrder, x, depth);
    }
    return {
      id: ++treeIds, count, frame: nodes.frame.subarray(0, count), parent: nodes.parent.subarray(0, count),
      total: nodes.total.subarray(0, count), self: nodes.self.subarray(0, count),
      base: nodes.base ? nodes.base.subarray(0, count) : null, childStart, childOrder, x, depth, maxDepth,
    };
  }

  function sortChildren(P, nodes, count, childStart, childOrder) {
    const rank = P.nameRank;
    for (let p = 0; p < count; p++) {
      const a = childStart[p], b = childStart[p + 1];
      if (b - a > 1) {
        const part = childOrder.subarray(a, b);
        part.sort((x, y) => rank[nodes.frame[x]] - rank[nodes.frame[y]]);
      }
    }
  }

  /** Each node's x (its callers' offset plus its elder siblings' totals) and depth; the deepest depth. */
  function placeChildren(nodes, childStart, childOrder, x, depth) {
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
    return maxDepth;
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
        if (tree.total[n] > 0) seen[f] = 1; // in diff mode, vanished bars are listed apart
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

  // ---- sandwich ----------------------------------------------------------

  /**
   * The sandwich of function f in `tree`: two trees rooted at f, one of its
   * callers (each caller chain reversed, so the direct callers come first)
   * and one of its callees (every call of f merged). Only the outermost call
   * of a recursive f is taken, so f's total counts once per stack, as in
   * the top table; deeper calls stay inside the callee tree.
   */
  function sandwichTrees(P, tree, f) {
    const withBase = tree.base !== null;
    const callers = treeBuilder(tree.count + 1, withBase), callees = treeBuilder(tree.count + 1, withBase);
    callers.nodes.frame[0] = f;
    callees.nodes.frame[0] = f;
    const pending = [0];
    while (pending.length) {
      const n = pending.pop();
      if (n > 0 && tree.frame[n] === f) {
        addCallers(tree, n, callers);
        addCallees(tree, n, callees);
        continue;
      }
      for (let i = tree.childStart[n]; i < tree.childStart[n + 1]; i++) pending.push(tree.childOrder[i]);
    }
    callers.nodes.self[0] = callees.nodes.self[0];
    return { callers: layout(P, callers.nodes, callers.count()), callees: layout(P, callees.nodes, callees.count()) };
  }

  /** Add node n's callers, nearest first, to the callers tree with n's totals. */
  function addCallers(tree, n, b) {
    const add = (node) => {
      b.nodes.total[node] += tree.total[n];
      if (tree.base) b.nodes.base[node] += tree.base[n];
    };
    add(0);
    let cur = 0;
    for (let p = tree.parent[n]; p > 0; p = tree.parent[p]) {
      cur = b.child(cur, tree.frame[p]);
      add(cur);
    }
  }

  /** Merge node n's subtree into the callees tree, n itself onto its root. */
  function addCallees(tree, n, b) {
    const from = [n], to = [0];
    while (from.length) {
      const src = from.pop(), dst = to.pop();
      b.nodes.total[dst] += tree.total[src];
      b.nodes.self[dst] += tree.self[src];
      if (tree.base) b.nodes.base[dst] += tree.base[src];
      for (let i = tree.childStart[src]; i < tree.childStart[src + 1]; i++) {
        const c = tree.childOrder[i];
        from.push(c);
        to.push(b.child(dst, tree.frame[c]));
      }
    }
  }

  // ---- state -------------------------------------------------------------

  const state = {
    P: null, tree: null, table: null, typeIndex: 0, labelSet: -1, hideTrampolines: false, hideFramework: false,
    icicle: false,
    focus: 0, query: "", selectedFrame: -1, matches: null, matchTotal: 0,
    sortKey: "self", entry: null, sandwich: -1, sandwichTrees: null, colourBlind: false, byCategory: false,
    // Grouping starts expanded (see groupRun); expandedGroups holds "tree/node" keys of groups opened by a click.
    history: null, original: null, originalType: 0, selection: null, momentError: null, dragFrom: null, dragTo: null,
    groupsCollapsed: false, expandedGroups: new Set(), vanishedRows: [], timeline: null, timings: {}, drawn: null, drawnCount: 0, ready: false, buildMs: 0, drawMs: 0, cache: new Map(),
  };

  function unitOf() { return state.P.data.types[state.typeIndex][1]; }

  function currentTree() {
    const key = [state.typeIndex, state.labelSet, state.hideTrampolines, state.hideFramework].join("/");
    let entry = state.cache.get(key);
    if (!entry) {
      const t0 = performance.now();
      const allowed = state.labelSet < 0 ? null : labelFilter(state.labelSet);
      const tree = buildTree(state.P, state.typeIndex, allowed, state.hideTrampolines, state.hideFramework);
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
    if (state.sandwich >= 0) state.sandwichTrees = sandwichTrees(state.P, state.tree, state.sandwich);
    updateMatches();
    renderTable();
    renderDiffSummary();
    renderVanished();
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

  const HUES = { python: [8, 44], native: [190, 230], trampoline: null, synthetic: [265, 300] };
  const ROOT_COLOR = "#c9c9ce", DIMMED = "#e4e4e8", UNCHANGED = "hsl(0,0%,80%)";
  // Hues for grew / shrank: red and green as Grafana and pprof use, or
  // orange and blue, which the common red-green colour blindnesses tell apart.
  const DIFF_HUES = { usual: { grew: 0, shrank: 120 }, colourBlind: { grew: 28, shrank: 212 } };

  function nameHash(s) {
    let h = 2166136261;
    for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
    return (h >>> 0) / 4294967296;
  }

  const colorCache = new Map();
  function frameColor(fid) {
    if (fid < 0) return ROOT_COLOR;
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

  /**
   * A diff bar's colour. Intensity is the change relative to the larger
   * side, so a bar that appeared (or vanished) is at full strength and
   * +10% is faint: the eye goes to what changed most for that bar.
   */
  function diffColor(newValue, baseValue) {
    const delta = newValue - baseValue;
    if (delta === 0) return UNCHANGED;
    const rel = Math.min(1, Math.abs(delta) / Math.max(newValue, baseValue));
    const hues = state.colourBlind ? DIFF_HUES.colourBlind : DIFF_HUES.usual;
    const hue = delta > 0 ? hues.grew : hues.shrank;
    return "hsl(" + hue + "," + Math.round(45 + 45 * rel) + "%," + Math.round(88 - 38 * rel) + "%)";
  }

  function barColor(bar) {
    const t = bar.tree, members = bar.run || [bar.node];
    if (state.matches && !members.some((m) => t.frame[m] >= 0 && state.matches[t.frame[m]])) return DIMMED;
    if (t.base) return diffColor(t.total[bar.node], t.base[bar.node]);
    if (state.byCategory && t.category) {
      const c = t.category[members[members.length - 1]];
      if (c >= 0) return CATEGORY_COLORS[c];
    }
    return frameColor(t.frame[members[members.length - 1]]);
  }

  function nodeLabel(n, tree = state.tree) {
    const fid = tree.frame[n];
    return fid < 0 ? "total" : state.P.names[fid];
  }

  /** A group's label, as Grafana writes it: first ⋯ (frames hidden between) ⋯ last. */
  function barLabel(bar) {
    if (!bar.run) return nodeLabel(bar.node, bar.tree);
    const first = nodeLabel(bar.run[0], bar.tree), last = nodeLabel(bar.run[bar.run.length - 1], bar.tree);
    if (bar.run.length === 2) return first + " \u203a " + last;
    return first + " \u22ef (" + (bar.run.length - 2) + ") \u22ef " + last;
  }

  // ---- grouping ------------------------------------------------------------

  /** The one child of n that has a width, or -1 (diff mode keeps zero-wide vanished children). */
  function onlyChild(t, n) {
    let found = -1;
    for (let i = t.childStart[n]; i < t.childStart[n + 1]; i++) {
      const c = t.childOrder[i];
      if (t.total[c] <= 0) continue;
      if (found >= 0) return -1;
      found = c;
    }
    return found;
  }

  /**
   * The nodes one bar stands for: n alone, or, when groups are collapsed,
   * the run from n down through frames with one child and no self (the
   * terminal's flame_text collapses the same runs). A run is one bar only
   * if it has two frames or more. Groups start expanded, unlike Grafana's
   * panel: the AKS guide has to tell users to press "Expand all groups" to read
   * a stack bottom-up, and here every name stays visible and searchable by
   * default; "collapse all groups" gives Grafana's view.
   */
  function groupRun(t, n) {
    if (!state.groupsCollapsed || state.expandedGroups.has(t.id + "/" + n)) return null;
    const run = [n];
    for (let cur = n, next; t.self[cur] === 0 && (next = onlyChild(t, cur)) >= 0; cur = next) run.push(next);
    return run.length > 1 ? run : null;
  }

  function expandGroup(bar) {
    for (const n of bar.run) state.expandedGroups.add(bar.tree.id + "/" + n); // so no member starts a new group
    scheduleDraw();
  }

  function setGroupsCollapsed(collapsed) {
    state.groupsCollapsed = collapsed;
    state.expandedGroups.clear();
    scheduleDraw();
  }

  // ---- drawing -----------------------------------------------------------

  let drawPending = false;
  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(() => { drawPending = false; draw(); });
  }

  /**
   * The bars under `start` that are at least MIN_PX wide, start's row being
   * row0 and each level `dir` rows further (+1 up the flame, -1 down for the
   * sandwich's callers). A bar is {tree, node, run, x, w, row}.
   */
  function descendantBars(t, start, width, row0, dir, out) {
    const scale = t.total[start] > 0 ? width / t.total[start] : 0;
    const nodes = [], rows = [];
    const pushChildren = (n, row) => {
      for (let i = t.childStart[n]; i < t.childStart[n + 1]; i++) { nodes.push(t.childOrder[i]); rows.push(row); }
    };
    pushChildren(start, row0 + dir);
    while (nodes.length) {
      const n = nodes.pop(), row = rows.pop();
      const w = t.total[n] * scale;
      if (w < MIN_PX) continue;
      const run = groupRun(t, n);
      out.push({ tree: t, node: n, run, x: (t.x[n] - t.x[start]) * scale, w, row });
      pushChildren(run ? run[run.length - 1] : n, row + dir);
    }
  }

  /** Every bar to paint, rows counted from the bottom (row 0) of the flame graph. */
  function collectBars(width) {
    const bars = [];
    if (state.sandwich >= 0) {
      const { callers, callees } = state.sandwichTrees;
      bars.push({ tree: callees, node: 0, run: null, x: 0, w: width, row: 0 });
      descendantBars(callees, 0, width, 0, 1, bars);
      descendantBars(callers, 0, width, 0, -1, bars);
      const lowest = bars.reduce((m, b) => Math.min(m, b.row), 0);
      bars.forEach((b) => { b.row -= lowest; });
      return bars;
    }
    const t = state.tree;
    // The focused node and its callers span the full width, as in Grafana's focus.
    for (let n = state.focus; n >= 0; n = t.parent[n]) bars.push({ tree: t, node: n, run: null, x: 0, w: width, row: t.depth[n] });
    descendantBars(t, state.focus, width, t.depth[state.focus], 1, bars);
    return bars;
  }

  // A cleared canvas with as many pixels as the screen shows, drawn on in CSS pixels.
  function canvasContext(canvas, width, height, font) {
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = font;
    return ctx;
  }

  function draw() {
    const t0 = performance.now();
    const canvas = ui.canvas;
    const width = canvas.clientWidth || canvas.parentElement.clientWidth || 800;
    const bars = collectBars(width);
    const rows = bars.reduce((m, b) => Math.max(m, b.row), 0) + 1;
    const height = rows * ROW;
    canvas.style.height = height + "px";
    const ctx = canvasContext(canvas, width, height, "12px system-ui, sans-serif");
    ctx.textBaseline = "middle";
    const charWidth = ctx.measureText("abcdefghijklmnopqrstuvwxyz_ABCDE >").width / 34;
    for (const b of bars) {
      b.y = state.icicle ? (rows - 1 - b.row) * ROW : height - (b.row + 1) * ROW;
      b.color = barColor(b);
      b.label = barLabel(b);
      ctx.fillStyle = b.color;
      ctx.fillRect(b.x, b.y, Math.max(b.w - 0.5, 0.5), ROW - 1);
      if (b.w > 3 * charWidth + 6) {
        let label = b.label;
        const fits = Math.floor((b.w - 6) / charWidth);
        if (label.length > fits) label = label.slice(0, Math.max(fits - 1, 1)) + "\u2026";
        ctx.fillStyle = "#111";
        ctx.fillText(label, b.x + 3, b.y + ROW / 2);
      }
    }
    state.drawn = bars;
    state.drawnCount = bars.length;
    state.drawMs = performance.now() - t0;
    renderBreadcrumb();
    if (!state.ready) {
      state.timings.firstPaint = performance.now(); // since navigation start
      state.ready = true;
      document.body.dataset.ready = "1";
    }
    ui.status.textContent = statusLine();
  }

  /** "1 bar", "2 bars", "1,024 functions". */
  function counted(n, noun) {
    return n.toLocaleString("en") + " " + noun + (n === 1 ? "" : "s");
  }

  function statusLine() {
    const d = state.P.data, t = state.tree, st = d.types[state.typeIndex];
    // the peak's caption: a moment that happened, or a bound (the profile says which)
    const peak = d.peak && st[0].startsWith("peak_") ? "\n" + st[0] + ": " + d.peak : "";
    const which = state.P.reserved && st[1] === "bytes"
      ? "\nthe graph counts what the allocator reserved (allocations + <allocator rounding> + <cached free blocks>);" +
        " the strip above counts allocations only"
      : "";
    return st[0] + ": " + formatValue(t.total[0], st[1]) + " in " + counted(t.count - 1, "bar") + ", " +
      counted(state.P.frameCount, "function") + peak + which +
      (d.comments.length ? "\n" + d.comments.join("\n") : "");
  }

  /** The drawn bar under a client point, or null. */
  function barAt(clientX, clientY) {
    const r = ui.canvas.getBoundingClientRect();
    const x = clientX - r.left, y = clientY - r.top, bars = state.drawn;
    if (!bars) return null;
    for (let i = bars.length - 1; i >= 0; i--) {
      const b = bars[i];
      if (y >= b.y && y < b.y + ROW && x >= b.x && x < b.x + b.w) return b;
    }
    return null;
  }

  // ---- breadcrumb, tooltip, table ------------------------------------------

  function renderBreadcrumb() {
    if (state.sandwich >= 0) { renderSandwichCrumb(); return; }
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

  /** The sandwich's line: which function, how to read it, and the way back. */
  function renderSandwichCrumb() {
    const lead = document.createElement("span");
    lead.className = "sep";
    lead.textContent = "sandwich:";
    const name = document.createElement("strong");
    name.textContent = state.P.names[state.sandwich];
    const how = document.createElement("span");
    how.className = "sep";
    how.textContent = state.icicle ? "(callees below, callers above)" : "(callees above, callers below)";
    const back = document.createElement("button");
    back.type = "button";
    back.id = "sandwich-back";
    back.textContent = "← back to the flame graph";
    back.addEventListener("click", () => setSandwich(-1));
    ui.breadcrumb.replaceChildren(lead, name, how, back);
  }

  /** "+1.50 MiB (+25.0%)": a change in the unit, and relative to the base ("new" when it had none). */
  function formatDelta(newValue, baseValue, unit) {
    const delta = newValue - baseValue, sign = delta > 0 ? "+" : "";
    const rel = baseValue ? sign + (100 * delta / baseValue).toFixed(1) + "%" : (delta ? "new" : "0%");
    return sign + formatValue(delta, unit) + " (" + rel + ")";
  }

  function tooltipLines(bar) {
    const t = bar.tree, n = bar.node, unit = unitOf(), whole = state.tree.total[0];
    const last = bar.run ? bar.run[bar.run.length - 1] : n;
    const lines = [
      "total " + formatValue(t.total[n], unit) + " (" + percent(t.total[n], whole) + ")",
      "self  " + formatValue(t.self[last], unit) + " (" + percent(t.self[last], whole) + ")",
    ];
    if (t.base) {
      lines.push("base  " + formatValue(t.base[n], unit), "new   " + formatValue(t.total[n], unit),
        "delta " + formatDelta(t.total[n], t.base[n], unit));
    }
    if (bar.run) {
      lines.push("group of " + bar.run.length + " frames with one callee each (click to expand):");
      bar.run.forEach((m) => lines.push("  " + nodeLabel(m, t)));
    } else if (t.frame[n] >= 0) {
      const d = state.P.data, fid = t.frame[n];
      const file = d.files[d.frames.file[fid]], line = d.frames.line[fid];
      // a bar is a function: its line is where the function is defined (its def), not a line it ran
      if (file) lines.push(line ? "defined at " + file + ":" + line : file);
      lines.push(d.kinds[d.frames.kind[fid]] + " frame; shift-click or right-click: sandwich");
    }
    return lines;
  }

  function showTooltip(bar, clientX, clientY) {
    const lines = tooltipLines(bar);
    const name = document.createElement("div");
    name.className = "name";
    name.textContent = bar.label;
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
        sandwichCell(f),
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

  function sandwichCell(f) {
    const td = document.createElement("td");
    const b = document.createElement("button");
    b.type = "button";
    b.className = "sandwich";
    b.textContent = "sandwich";
    b.title = "this function's callers below it and its callees above it";
    b.addEventListener("click", (e) => { e.stopPropagation(); setSandwich(f); }); // not the row's select
    td.append(b);
    return td;
  }

  /** Diff mode's header: both totals and the change, for the current type and label. */
  function renderDiffSummary() {
    const t = state.tree;
    ui.diffSummary.hidden = !t.base;
    if (!t.base) return;
    const unit = unitOf();
    ui.diffSummary.textContent = "base " + formatValue(t.base[0], unit) + " → new " +
      formatValue(t.total[0], unit) + ": " + formatDelta(t.total[0], t.base[0], unit);
  }

  /** Stacks only BASE has (zero wide in NEW's graph): the topmost such node of each, largest first. */
  function vanishedNodes(t) {
    const out = [];
    for (let n = 1; n < t.count; n++) {
      if (t.total[n] === 0 && t.base[n] > 0 && (t.parent[n] === 0 || t.total[t.parent[n]] > 0)) out.push(n);
    }
    return out.sort((a, b) => t.base[b] - t.base[a]);
  }

  function renderVanished() {
    const t = state.tree;
    const nodes = t.base ? vanishedNodes(t) : [];
    ui.vanishedBox.hidden = nodes.length === 0;
    const unit = unitOf();
    state.vanishedRows = nodes.slice(0, TABLE_ROWS).map((n) => ({
      path: framePath(n).map((f) => state.P.names[f]).join(" › "), base: t.base[n],
    }));
    ui.vanished.replaceChildren(...state.vanishedRows.map((row) => {
      const li = document.createElement("li");
      li.textContent = row.path + "  −" + formatValue(row.base, unit);
      return li;
    }));
  }

  // ---- actions -----------------------------------------------------------

  /** Show the sandwich of function f (-1: back to the flame graph). */
  function setSandwich(f) {
    state.sandwich = f;
    state.sandwichTrees = f >= 0 ? sandwichTrees(state.P, state.tree, f) : null;
    scheduleDraw();
  }

  function clickBar(bar, e) {
    const fid = bar.tree.frame[bar.node];
    if (bar.run) expandGroup(bar);
    else if (e.shiftKey || (state.sandwich >= 0 && fid >= 0)) setSandwich(fid);
    else if (state.sandwich < 0) setFocus(bar.node);
  }

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
    ui.labels.addEventListener("change", () => { state.labelSet = Number(ui.labels.value); useTree(true); useTimeline(); });
    ui.hideTrampolines.addEventListener("change", () => {
      state.hideTrampolines = ui.hideTrampolines.checked;
      useTree(false);
    });
    ui.hideFramework.addEventListener("change", () => {
      state.hideFramework = ui.hideFramework.checked;
      useTree(false);
    });
    ui.icicle.addEventListener("change", () => { state.icicle = ui.icicle.checked; scheduleDraw(); });
    ui.reset.addEventListener("click", () => {
      ui.search.value = "";
      state.query = "";
      state.selectedFrame = -1;
      state.focus = 0;
      setSandwich(-1);
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
      const bar = barAt(e.clientX, e.clientY);
      if (!bar) ui.tooltip.hidden = true;
      else showTooltip(bar, e.clientX, e.clientY);
    });
    ui.canvas.addEventListener("mouseleave", () => { ui.tooltip.hidden = true; });
    ui.canvas.addEventListener("click", (e) => {
      const bar = barAt(e.clientX, e.clientY);
      if (bar) clickBar(bar, e);
    });
    ui.canvas.addEventListener("contextmenu", (e) => {
      const bar = barAt(e.clientX, e.clientY);
      if (!bar || bar.tree.frame[bar.node] < 0) return;
      e.preventDefault(); // the browser's menu would cover the sandwich
      setSandwich(bar.tree.frame[bar.run ? bar.run[bar.run.length - 1] : bar.node]);
    });
    ui.palette.addEventListener("change", () => { state.colourBlind = ui.palette.checked; scheduleDraw(); });
    ui.byCategory.addEventListener("change", () => {
      state.byCategory = ui.byCategory.checked;
      ui.categoryLegend.hidden = !state.byCategory;
      scheduleDraw();
    });
    ui.expandGroups.addEventListener("click", () => setGroupsCollapsed(false));
    ui.collapseGroups.addEventListener("click", () => setGroupsCollapsed(true));
    window.addEventListener("resize", scheduleDraw);
  }

  function fillTypes() {
    ui.type.textContent = "";
    state.P.data.types.forEach(([type, unit], i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = type + " (" + unit + ")";
      ui.type.append(o);
    });
    ui.type.value = String(state.typeIndex);
  }

  function fillSelectors() {
    const d = state.P.data;
    fillTypes();
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
    ui.paletteBox.hidden = !d.base;
    ui.categoryBox.hidden = !state.P.categoryOfSet || Boolean(d.base);
    CATEGORIES.forEach((name, i) => {
      const item = document.createElement("span");
      item.className = "swatch";
      item.style.borderLeftColor = CATEGORY_COLORS[i];
      item.textContent = name;
      ui.categoryLegend.append(item);
    });
  }

  // ---- memory over time ---------------------------------------------------

  /** Nanoseconds in the largest unit that keeps the number readable. */
  function formatDuration(ns) {
    const units = [[60e9, "min"], [1e9, "s"], [1e6, "ms"], [1e3, "\u00b5s"]];
    for (const [size, name] of units) {
      if (Math.abs(ns) >= size) { const v = ns / size; return (v < 10 ? v.toFixed(2) : v.toFixed(1)) + " " + name; }
    }
    return Math.round(ns) + " ns";
  }

  /**
   * The series carrying the label pair `match` ([key, value], or null for
   * all) summed into one step line of [time, bytes] (times in ns since the
   * timeline's start), as model/timeline.py's Timeline.total sums them: a
   * series counts from its first point to its last (its process's start and
   * end) and 0 outside; one that ends before the line does drops out with a
   * second point at its end; a time at which several series have points is
   * one point, the total after all of them (a sampler writes every device's
   * total at one time). The peak is the first highest point, as the
   * converter's peak is the first of equal moments.
   */
  function sumTimeline(timeline, match) {
    const chosen = timeline.series.filter((s) => s.t.length && (!match || s.labels.some(([k, v]) => k === match[0] && v === match[1])));
    const span = Math.max(1, ...timeline.series.filter((s) => s.t.length).map((s) => s.t[s.t.length - 1]));
    const out = { points: [], peakBytes: 0, peakTime: 0, span, series: chosen.length, match };
    if (!chosen.length) return out;
    const end = Math.max(...chosen.map((s) => s.t[s.t.length - 1]));
    const events = [];
    chosen.forEach((s, k) => {
      for (let i = 0; i < s.t.length; i++) events.push([s.t[i], 0, k, s.b[i]]);
      if (s.t[s.t.length - 1] < end) events.push([s.t[s.t.length - 1], 1, k, 0]);
    });
    events.sort((a, b) => a[0] - b[0] || a[1] - b[1]); // stable: an end comes after the updates of its moment
    const firstSeries = new Map(), shared = new Set();
    for (const [t, , k] of events) {
      if (!firstSeries.has(t)) firstSeries.set(t, k);
      else if (firstSeries.get(t) !== k) shared.add(t);
    }
    const current = new Array(chosen.length).fill(0);
    let total = 0, peakBytes = -1;
    for (let i = 0; i < events.length; i++) {
      const [t, , k, b] = events[i];
      total += b - current[k];
      current[k] = b;
      if (shared.has(t) && i + 1 < events.length && events[i + 1][0] === t) continue; // one moment: its last total
      const last = out.points[out.points.length - 1];
      if (!last || last[0] !== t || last[1] !== total) out.points.push([t, total]);
      if (total > peakBytes) { peakBytes = total; out.peakTime = t; }
    }
    out.peakBytes = Math.max(peakBytes, 0);
    return out;
  }

  /**
   * The strip above the graph: total memory over time on the whole run's
   * time axis (so a process sits where it ran), the peak a dot with its
   * bytes and time. A step line: a spike of microseconds is a vertical
   * stroke up and back down within one pixel column.
   */
  function drawTimeline() {
    const tl = state.timeline;
    if (!tl) return;
    const canvas = ui.timeline;
    const width = canvas.clientWidth || 800, height = canvas.clientHeight || 90;
    const ctx = canvasContext(canvas, width, height, "11px system-ui, sans-serif");
    const left = 64, right = 8, top = 14, bottom = 16;
    const span = tl.span, top_ = Math.max(tl.peakBytes, 1);
    const X = (t) => left + (width - left - right) * t / span;
    const Y = (b) => height - bottom - (height - top - bottom) * b / top_;
    tl.at = (t, b) => ({ x: X(t), y: Y(b) });
    tl.toTime = (x) => Math.min(span, Math.max(0, (x - left) / (width - left - right) * span));
    drawSelection(ctx, X, top, height - bottom);
    ctx.strokeStyle = "#d8d8dc";
    ctx.beginPath(); ctx.moveTo(left, top); ctx.lineTo(left, height - bottom); ctx.lineTo(width - right, height - bottom); ctx.stroke();
    ctx.fillStyle = "#6b6b70";
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(formatBytes(tl.peakBytes), left - 4, Y(tl.peakBytes));
    ctx.fillText("0 B", left - 4, height - bottom);
    ctx.textBaseline = "top";
    ctx.textAlign = "left"; ctx.fillText("0", left, height - bottom + 2);
    ctx.textAlign = "right"; ctx.fillText(formatDuration(span), width - right, height - bottom + 2);
    if (tl.unsplit) { ctx.textAlign = "left"; ctx.fillText("all series: the timeline is not split by " + tl.unsplit, left + 40, height - bottom + 2); }
    tl.peakX = tl.peakY = null;
    if (!tl.points.length) {
      ctx.textAlign = "left"; ctx.textBaseline = "middle";
      ctx.fillText("no memory timeline was recorded for " + tl.match.join("="), left + 8, (top + height - bottom) / 2);
      return;
    }
    ctx.strokeStyle = "#2f6fdb"; ctx.lineWidth = 1.5;
    ctx.beginPath();
    let prevY = Y(tl.points[0][1]);
    ctx.moveTo(X(tl.points[0][0]), prevY);
    for (const [t, b] of tl.points) { const x = X(t); ctx.lineTo(x, prevY); prevY = Y(b); ctx.lineTo(x, prevY); }
    ctx.stroke();
    const px = X(tl.peakTime), py = Y(tl.peakBytes);
    ctx.fillStyle = "#d62728";
    ctx.beginPath(); ctx.arc(px, py, 4, 0, 2 * Math.PI); ctx.fill();
    ctx.textBaseline = "bottom";
    ctx.textAlign = px > width / 2 ? "right" : "left";
    ctx.fillText("allocations' peak " + formatBytes(tl.peakBytes) + " at " + formatDuration(tl.peakTime), px + (px > width / 2 ? -6 : 6), Math.max(py - 2, 12));
    tl.peakX = px; tl.peakY = py;
  }

  // ---- any moment: click or drag on the strip (model/moment.py) -------------

  /** The chosen instant (a line) or window (a band) on the strip, and a drag in progress. */
  function drawSelection(ctx, X, y0, y1) {
    const sel = state.selection;
    ctx.save();
    ctx.fillStyle = "rgba(255, 127, 14, 0.18)";
    ctx.strokeStyle = "#ff7f0e";
    if (state.dragFrom !== null && state.dragTo !== null) {
      ctx.fillRect(Math.min(state.dragFrom, state.dragTo), y0, Math.abs(state.dragTo - state.dragFrom), y1 - y0);
    } else if (sel && sel.kind === "at") {
      ctx.lineWidth = 2; ctx.beginPath(); ctx.moveTo(X(sel.t1), y0); ctx.lineTo(X(sel.t1), y1); ctx.stroke();
    } else if (sel) {
      ctx.fillRect(X(sel.t1), y0, Math.max(2, X(sel.t2) - X(sel.t1)), y1 - y0);
    }
    ctx.restore();
  }

  /** The history's events as typed arrays, times in ns since the strip's start. */
  function prepareHistory(h) {
    if (!h) return null;
    const tracks = h.tracks.map((tr) => {
      const n = tr.t.length, times = new Float64Array(n);
      let now = tr.fold;
      for (let i = 0; i < n; i++) { now += tr.t[i]; times[i] = now; }
      return { start: tr.start, end: tr.end, fold: tr.fold, folded: tr.folded, base: tr.base, times,
        sites: Int32Array.from(tr.s), sizes: Float64Array.from(tr.b) };
    });
    return { stack: h.stack, labels: h.labels, tracks };
  }

  /** How many of the sorted `times` are <= t. */
  function countUpTo(times, t) {
    let lo = 0, hi = times.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (times[mid] <= t) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function seconds(ns) { return (ns / 1e9).toFixed(3) + " s"; }

  function foldedMessage(tr) {
    const earliest = Math.ceil((tr.fold + 1) / 1e6) / 1e3;
    const why = tr.start === null
      ? "the history begins at " + seconds(tr.fold) + ", where the allocator's trace (its latest events) begins"
      : "the history before " + seconds(tr.fold) + " was folded to keep its memory bounded";
    return "not available: " + why + "; the earliest exact moment is " + earliest.toFixed(3) + " s";
  }

  /** Site -> [bytes, count] live at t1 ("at") or allocated within [t1, t2] ("between"), as model/moment.py. */
  function momentRows(kind, t1, t2) {
    const rows = new Map();
    const add = (s, b, c) => { const r = rows.get(s); if (r) { r[0] += b; r[1] += c; } else rows.set(s, [b, c]); };
    for (const tr of state.history.tracks) {
      if ((tr.end !== null && tr.end < t1) || (tr.start !== null && t2 < tr.start)) continue;
      if (kind === "at") {
        if (t1 < tr.fold) return { error: foldedMessage(tr) };
        tr.base.forEach(([s, b, c]) => add(s, b, c));
        const n = countUpTo(tr.times, t1);
        for (let i = 0; i < n; i++) add(tr.sites[i], tr.sizes[i], tr.sizes[i] > 0 ? 1 : -1);
      } else {
        if (tr.folded && t1 <= tr.fold) return { error: foldedMessage(tr) };
        const hi = countUpTo(tr.times, t2);
        for (let i = countUpTo(tr.times, t1 - 1); i < hi; i++) if (tr.sizes[i] > 0) add(tr.sites[i], tr.sizes[i], 1);
      }
    }
    return { rows };
  }

  /** The page's profile of one moment or window: the same tables, other samples and types. */
  function momentPage(kind, t1, t2) {
    const found = momentRows(kind, t1, t2);
    if (found.error) return found;
    const H = state.history, samples = { stack: [], labels: [], values: [[], []] };
    for (const [s, [b, c]] of found.rows) {
      if (b <= 0 && c <= 0) continue;
      samples.stack.push(H.stack[s]); samples.labels.push(H.labels[s]);
      samples.values[0].push(b); samples.values[1].push(c);
    }
    const types = kind === "at" ? [["inuse_space", "bytes"], ["inuse_objects", "count"]]
      : [["alloc_space", "bytes"], ["alloc_objects", "count"]];
    return { P: prepare({ ...state.original.data, types, samples, defaultType: 0, base: null }) };
  }

  function usePage(P, typeIndex) {
    state.P = P; state.typeIndex = typeIndex; state.cache.clear(); state.focus = 0;
    fillTypes();
    setSandwich(-1);
    useTree(false);
  }

  /** Show what was live at t1 ("at") or allocated within [t1, t2] ("between"); times in ns on the strip. */
  function showMoment(kind, t1, t2) {
    ui.momentBox.hidden = false;
    state.selection = { kind, t1, t2 };
    if (!state.history) {
      state.momentError = state.original.data.noHistory || "this profile has no event history";
      ui.momentLabel.textContent = state.momentError;
      drawTimeline();
      return;
    }
    const made = momentPage(kind, t1, t2);
    state.momentError = made.error || null;
    if (made.error) {
      ui.momentLabel.textContent = (kind === "at" ? "at " + seconds(t1) : "from " + seconds(t1) + " to " + seconds(t2)) + ": " + made.error;
    } else {
      usePage(made.P, 0);
      ui.momentLabel.textContent = kind === "at" ? "what was live at " + seconds(t1)
        : "what was allocated from " + seconds(t1) + " to " + seconds(t2);
    }
    drawTimeline();
  }

  /** Back to the profile's own types: the peak and the end. */
  function backToProfile() {
    state.selection = null; state.momentError = null;
    ui.momentBox.hidden = true;
    if (state.P !== state.original) usePage(state.original, state.originalType);
    drawTimeline();
  }

  function wireMoments() {
    const x = (e) => e.clientX - ui.timeline.getBoundingClientRect().left;
    ui.timeline.addEventListener("mousedown", (e) => { state.dragFrom = x(e); state.dragTo = null; });
    ui.timeline.addEventListener("mousemove", (e) => {
      if (state.dragFrom === null || !(e.buttons & 1)) return;
      state.dragTo = x(e); drawTimeline();
    });
    ui.timeline.addEventListener("mouseup", (e) => {
      if (state.dragFrom === null || !state.timeline || !state.timeline.toTime) return;
      const from = state.dragFrom, to = x(e), tl = state.timeline;
      state.dragFrom = state.dragTo = null;
      if (Math.abs(to - from) < 4) showMoment("at", Math.round(tl.toTime(to)), Math.round(tl.toTime(to)));
      else showMoment("between", Math.round(tl.toTime(Math.min(from, to))), Math.round(tl.toTime(Math.max(from, to))));
    });
    ui.momentBack.addEventListener("click", backToProfile);
  }

  /**
   * The strip for the label selector's choice (all, one process, one
   * device). A label key no series carries (gpu_model, say) does not split
   * the timeline: the strip then shows every series and says so.
   */
  function useTimeline() {
    const data = state.P.data.timeline;
    if (!data) return;
    const choice = state.labelSet < 0 ? null : state.labelOptions[state.labelSet];
    const split = !choice || data.series.some((s) => s.labels.some(([k]) => k === choice[0]));
    state.timeline = sumTimeline(data, split ? choice : null);
    state.timeline.unsplit = split ? null : choice[0];
    const n = state.timeline.series, what = choice ? choice.join("=") : "all";
    ui.timeline.title = "live allocated bytes over time, " + what +
      (split ? "" : " (the timeline is not split by " + choice[0] + ": all series shown)") +
      (n > 1 ? ": the sum of " + n + " series (processes, devices), each counted while it ran" : "") +
      "; click: what was live at that instant, drag: what was allocated within that window";
    drawTimeline();
  }

  /** Show the strip when the page's profile has a timeline (never in diff mode: Python sends none there). */
  function setupTimeline(data) {
    if (!data.timeline || !data.timeline.series.length) { state.timeline = null; ui.timelineBox.hidden = true; return; }
    ui.timelineBox.hidden = false;
    useTimeline();
    window.addEventListener("resize", drawTimeline);
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
          tableSort: state.sortKey, hideTrampolines: state.hideTrampolines, hideFramework: state.hideFramework,
          icicle: state.icicle,
          diff: Boolean(state.P.base), baseTotal: t.base ? t.base[0] : null,
          diffText: t.base ? ui.diffSummary.textContent : null, colourBlind: state.colourBlind,
          byCategory: state.byCategory, categoryBox: !ui.categoryBox.hidden,
          vanished: Object.freeze(state.vanishedRows.map((r) => Object.freeze({ ...r }))),
          sandwich: state.sandwich >= 0 ? state.P.names[state.sandwich] : null,
          sandwichCallers: state.sandwichTrees ? topChildren(state.sandwichTrees.callers) : null,
          sandwichCallees: state.sandwichTrees ? topChildren(state.sandwichTrees.callees) : null,
          sandwichTotal: state.sandwichTrees ? state.sandwichTrees.callees.total[0] : null,
          groupsCollapsed: state.groupsCollapsed, groupBars: (state.drawn || []).filter((b) => b.run).length,
          buildMs: state.buildMs, drawMs: state.drawMs, timings: Object.freeze({ ...state.timings }),
          moment: state.selection ? Object.freeze({ ...state.selection, label: ui.momentLabel.textContent,
            error: state.momentError, visible: !ui.momentBox.hidden }) : null,
          timeline: state.timeline ? Object.freeze({
            points: Object.freeze(state.timeline.points.map((p) => Object.freeze(p.slice()))),
            peakBytes: state.timeline.peakBytes, peakTime: state.timeline.peakTime,
            peakX: state.timeline.peakX, peakY: state.timeline.peakY, visible: !ui.timelineBox.hidden,
            span: state.timeline.span, series: state.timeline.series, title: ui.timeline.title,
            unsplit: state.timeline.unsplit,
          }) : null,
        });
      },
    });
  }

  /** A tree's root's children, widest first, as {name, total}: the sandwich's direct callers or callees. */
  function topChildren(t) {
    const out = [];
    for (let i = t.childStart[0]; i < t.childStart[1]; i++) {
      const c = t.childOrder[i];
      if (t.total[c] > 0) out.push(Object.freeze({ name: nodeLabel(c, t), total: t.total[c] }));
    }
    return Object.freeze(out.sort((a, b) => b.total - a.total));
  }

  /** The first drawn bar labelled `name`, for tests: where it is (client pixels), its colour and values. */
  function barInfo(name) {
    const bars = state.drawn, r = ui.canvas.getBoundingClientRect();
    const b = bars && bars.find((x) => x.label === name);
    if (!b) return null;
    const t = b.tree;
    return Object.freeze({
      x: r.left + b.x + b.w / 2, y: r.top + b.y + ROW / 2, width: b.w, color: b.color, group: b.run ? b.run.length : 0,
      total: t.total[b.node], base: t.base ? t.base[b.node] : null,
      category: t.category && t.category[b.node] >= 0 ? CATEGORIES[t.category[b.node]] : null,
    });
  }

  function barCenter(name) {
    const info = barInfo(name);
    return info && { x: info.x, y: info.y };
  }

  async function start() {
    exposeState();
    Object.defineProperty(window, "gpuflameBarCenter", { value: barCenter });
    Object.defineProperty(window, "gpuflameBar", { value: barInfo });
    Object.defineProperty(window, "gpuflameTimelineAt", { value: (t, b) => state.timeline && state.timeline.at && state.timeline.at(t, b) });
    Object.defineProperty(window, "gpuflameBarLabels", { value: () => (state.drawn || []).map((b) => b.label) });
    Object.defineProperty(window, "gpuflameInflate", { value: inflate });
    try {
      let t0 = performance.now();
      const data = await decodeData();
      state.timings.decode = performance.now() - t0;
      t0 = performance.now();
      state.P = prepare(data);
      state.timings.prepare = performance.now() - t0;
      state.typeIndex = data.defaultType || 0;
      state.original = state.P; state.originalType = state.typeIndex;
      state.history = prepareHistory(data.history);
      document.title = "gpuflame: " + data.title;
      ui.title.textContent = data.title;
      ui.title.title = data.title;
      fillSelectors();
      wire();
      wireMoments();
      setupTimeline(data);
      useTree(false);
    } catch (err) {
      state.error = String(err && err.message ? err.message : err);
      ui.status.textContent = "cannot read the profile in this page: " + state.error;
    }
  }

  start();
})();
