
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  let DATA = null;  // the explorer's data (explorer.pack): labels, words, links, where each map starts
  const SVG = "http://www.w3.org/2000/svg";  // the SVG namespace (a name, never loaded)
  const VIRIDIS = [[68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140],
                   [40, 174, 128], [94, 201, 98], [173, 220, 48], [253, 231, 37]];
  const LINE_MIN = 0.002;  // lines for weights below this are not drawn
  const PITCH = 22;
  const LINK_NAMES = {"link-sure": "sure, predicted", "link-possible": "possible, predicted",
                      "link-false": "predicted, not in gold", "link-missed": "sure, missed",
                      "link-predicted": "predicted link"};
  const state = {sentence: 0, kind: null, layer: null, head: "avg", view: "heatmap", units: "pieces"};
  let WEIGHTS = null;
  let drawn = null;  // what is on screen: {mat, rowLabels, colLabels, marks}
  window.explorerDraws = 0;

  function colour(w) {
    const x = Math.min(Math.max(w, 0), 1) * (VIRIDIS.length - 1);
    const k = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - k;
    const a = VIRIDIS[k], b = VIRIDIS[k + 1];
    return "rgb(" + [0, 1, 2].map((c) => Math.round(a[c] + f * (b[c] - a[c]))).join(",") + ")";
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  async function inflate(packed, size) {
    const binary = atob(packed.trim());
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+)");
    }
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    const out = new Uint8Array(await new Response(stream).arrayBuffer());
    if (out.length !== size) throw new Error("the embedded weights are damaged");
    return out;
  }

  // Each piece's words with their share: [[word, share], ...] (the data stores a whole word as its index).
  function readWords(data) {
    for (const s of data.sentences) {
      for (const side of Object.values(s.words)) {
        side.members = side.members.map((m) => (typeof m === "number" ? [[m, 1]] : m));
      }
    }
  }

  function text(pieces) {
    return pieces.filter((p) => p !== "<s>" && p !== "</s>" && p !== "<pad>").join("")
      .replace(/\u2581/g, " ").trim();
  }

  // The (rows, cols) weights of one layer: one head, or the mean of the heads ("avg").
  function pieceMatrix(map, layer, head) {
    const n = map.rows * map.cols, base = map.offset + layer * map.heads * n;
    const w = new Float64Array(n);
    if (head === "avg") {
      for (let h = 0; h < map.heads; h++) {
        const start = base + h * n;
        for (let k = 0; k < n; k++) w[k] += WEIGHTS[start + k];
      }
      const scale = DATA.levels * map.heads;
      for (let k = 0; k < n; k++) w[k] /= scale;
    } else {
      const start = base + head * n;
      for (let k = 0; k < n; k++) w[k] = WEIGHTS[start + k] / DATA.levels;
    }
    return {rows: map.rows, cols: map.cols, w: w};
  }

  // words.merge: (Mr^T W Mc) / colsum(Mr), key pieces summed with their share, query pieces averaged.
  function mergeWords(mat, rowWords, colWords) {
    const R = rowWords.labels.length, C = colWords.labels.length;
    const summed = new Float64Array(mat.rows * C);  // W Mc: (T, C)
    for (let i = 0; i < mat.rows; i++) {
      for (let j = 0; j < mat.cols; j++) {
        const v = mat.w[i * mat.cols + j];
        if (v === 0) continue;
        for (const [b, share] of colWords.members[j]) summed[i * C + b] += v * share;
      }
    }
    const w = new Float64Array(R * C), total = new Float64Array(R);
    for (let i = 0; i < mat.rows; i++) {
      for (const [a, share] of rowWords.members[i]) {
        total[a] += share;
        for (let b = 0; b < C; b++) w[a * C + b] += share * summed[i * C + b];
      }
    }
    for (let a = 0; a < R; a++) {
      const d = total[a] > 0 ? total[a] : 1;
      for (let b = 0; b < C; b++) w[a * C + b] /= d;
    }
    return {rows: R, cols: C, w: w};
  }

  // Alignment classes by "row,col" (target word, source word), for the word view of cross-attention.
  function alignmentMarks(s) {
    const marks = new Map();
    if (!s.links) return marks;
    const key = (pair) => pair[1] + "," + pair[0];
    const gold = s.sure !== null || s.possible !== null;
    const sure = new Set((s.sure || []).map(key)), possible = new Set((s.possible || []).map(key));
    for (const link of s.links) {
      const k = key(link);
      marks.set(k, !gold ? "link-predicted" : sure.has(k) ? "link-sure"
        : possible.has(k) ? "link-possible" : "link-false");
    }
    for (const k of sure) if (!marks.has(k)) marks.set(k, "link-missed");
    return marks;
  }

  function current() {
    const s = DATA.sentences[state.sentence];
    const map = s.maps[state.kind];
    const layer = state.layer === null ? map.layers - 1 : Math.min(state.layer, map.layers - 1);
    const head = state.head === "avg" || Number(state.head) >= map.heads ? "avg" : Number(state.head);
    const [rowSide, colSide] = DATA.axes[state.kind];
    let mat = pieceMatrix(map, layer, head), rowLabels = s[rowSide], colLabels = s[colSide];
    let marks = new Map();
    if (state.units === "words") {
      mat = mergeWords(mat, s.words[rowSide], s.words[colSide]);
      rowLabels = s.words[rowSide].labels;
      colLabels = s.words[colSide].labels;
      if (state.kind === "cross" || state.kind === "align") marks = alignmentMarks(s);
    }
    return {s: s, mat: mat, rowLabels: rowLabels, colLabels: colLabels, marks: marks,
            rowSide: rowSide, colSide: colSide, layer: layer, head: head};
  }

  function options(select, items, value) {
    select.replaceChildren(...items.map(([v, label]) => {
      const option = el("option", null, label);
      option.value = v;
      return option;
    }));
    select.value = value;
  }

  // The sentence's kinds, layers and heads as choices, keeping the current choice where it still exists.
  function refreshChoices() {
    const s = DATA.sentences[state.sentence];
    const kinds = Object.keys(s.maps);
    if (!kinds.includes(state.kind)) state.kind = kinds[0];
    options($("explorer-kind"), kinds.map((k) => [k, DATA.kinds[k]]), state.kind);
    const map = s.maps[state.kind];
    const layer = state.layer === null ? map.layers - 1 : Math.min(state.layer, map.layers - 1);
    options($("explorer-layer"), [...Array(map.layers).keys()].map((l) => [String(l), String(l + 1)]),
            String(layer));
    if (state.head !== "avg" && Number(state.head) >= map.heads) state.head = "avg";
    options($("explorer-head"), [["avg", "avg"], ...[...Array(map.heads).keys()].map((h) => [String(h),
            String(h + 1)])], state.head);
  }

  function showSentence() {
    const s = DATA.sentences[state.sentence];
    $("explorer-sentence").value = String(state.sentence);
    $("explorer-number").textContent = "sentence " + s.number;
    $("explorer-src").textContent = text(s.src);
    $("explorer-tgt").textContent = text(s.tgt);
    $("explorer-aer").textContent = s.aer === null ? "" : "AER " + s.aer.toFixed(3);
  }

  function label(tag, cls, textValue, attr, index) {
    const node = el(tag, cls, textValue);
    node.dir = "auto";
    node.title = textValue;
    node.dataset[attr] = String(index);
    return node;
  }

  function viewBox(cls, id, mat) {
    const box = el("div", cls);
    box.id = id;
    box.dataset.rows = String(mat.rows);
    box.dataset.cols = String(mat.cols);
    return box;
  }

  function drawHeatmap(view, area) {
    const {mat, rowLabels, colLabels, marks} = view;
    const grid = viewBox("heatmap", "explorer-heatmap", mat);
    grid.style.gridTemplateColumns = "max-content repeat(" + mat.cols + ", var(--cell))";
    const parts = document.createDocumentFragment();
    parts.appendChild(el("div", "corner"));
    colLabels.forEach((t, j) => parts.appendChild(label("div", "col-label", t, "col", j)));
    for (let i = 0; i < mat.rows; i++) {
      parts.appendChild(label("div", "row-label", rowLabels[i], "row", i));
      for (let j = 0; j < mat.cols; j++) {
        const w = mat.w[i * mat.cols + j];
        const cell = el("div", "cell");
        cell.dataset.row = String(i);
        cell.dataset.col = String(j);
        cell.dataset.w = w.toFixed(6);
        cell.style.backgroundColor = colour(w);
        const mark = marks.get(i + "," + j);
        if (mark) cell.classList.add("link", mark);
        parts.appendChild(cell);
      }
    }
    grid.appendChild(parts);
    area.replaceChildren(grid);
  }

  function svgNode(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  function drawLines(view, area) {
    const {mat, rowLabels, colLabels, marks} = view;
    const box = viewBox("lines", "explorer-lines", mat);
    const keys = el("div", "line-column"), queries = el("div", "line-column");
    colLabels.forEach((t, j) => keys.appendChild(label("div", "line-key", t, "col", j)));
    rowLabels.forEach((t, i) => queries.appendChild(label("div", "line-query", t, "row", i)));
    const height = Math.max(mat.rows, mat.cols) * PITCH, width = 260;
    const svg = svgNode("svg", {width: width, height: height, viewBox: "0 0 " + width + " " + height});
    const y = (k) => k * PITCH + PITCH / 2;
    for (let i = 0; i < mat.rows; i++) {
      for (let j = 0; j < mat.cols; j++) {
        const w = mat.w[i * mat.cols + j];
        if (w < LINE_MIN) continue;
        const line = svgNode("line", {class: "attn-line", x1: 0, y1: y(j), x2: width, y2: y(i),
                                      "stroke-opacity": w.toFixed(4)});
        line.dataset.row = String(i);
        line.dataset.col = String(j);
        line.dataset.w = w.toFixed(6);
        svg.appendChild(line);
      }
    }
    for (const [k, mark] of marks) {
      const [i, j] = k.split(",").map(Number);
      const line = svgNode("line", {class: "align-line link " + mark, x1: 0, y1: y(j), x2: width, y2: y(i)});
      line.dataset.row = String(i);
      line.dataset.col = String(j);
      svg.appendChild(line);
    }
    box.append(keys, svg, queries);
    area.replaceChildren(box);
  }

  // The source share of each prediction (ALTI+, a gradient attribution, rollout, flow) as a line over the
  // target pieces: where it falls, the model predicts from the prefix alone.
  function drawShare(s) {
    const box = $("explorer-share");
    const name = state.kind.replace(/_prefix$/, "");
    const values = (s.shares || {})[name];
    box.hidden = !values;
    if (!values) { box.replaceChildren(); return; }
    const width = Math.max(values.length * PITCH, 120), height = 90, top = 8, span = height - 2 * top;
    const svg = svgNode("svg", {id: "explorer-share-line", width: width + 40, height: height,
                                viewBox: "0 0 " + (width + 40) + " " + height});
    const x = (k) => 30 + k * PITCH + PITCH / 2, y = (v) => top + (1 - v) * span;
    for (const v of [0, 0.5, 1]) {
      svg.appendChild(svgNode("line", {class: "share-grid", x1: 30, x2: width + 30, y1: y(v), y2: y(v)}));
      const tick = svgNode("text", {x: 0, y: y(v) + 4, class: "share-tick"});
      tick.textContent = v.toFixed(1);
      svg.appendChild(tick);
    }
    svg.appendChild(svgNode("polyline", {class: "share-polyline",
      points: values.map((v, k) => x(k) + "," + y(v)).join(" ")}));
    values.forEach((v, k) => {
      const dot = svgNode("circle", {class: "share-point", cx: x(k), cy: y(v), r: 4});
      dot.dataset.row = String(k);
      dot.dataset.share = v.toFixed(4);
      const title = svgNode("title", {});
      title.textContent = s.tgt[k] + ": source share " + v.toFixed(3);
      dot.appendChild(title);
      svg.appendChild(dot);
    });
    const caption = el("div", "share-caption", DATA.kinds[name].replace(/: source$/, "")
      + ": the source's share in each prediction");
    box.replaceChildren(caption, svg);
  }

  function drawLegend(marks) {
    const legend = $("explorer-legend");
    const counts = new Map();
    for (const mark of marks.values()) counts.set(mark, (counts.get(mark) || 0) + 1);
    const order = ["link-sure", "link-possible", "link-false", "link-missed", "link-predicted"];
    const s = DATA.sentences[state.sentence];
    const gold = s.sure !== null || s.possible !== null;
    const shown = order.filter((c) => (gold ? c !== "link-predicted" : c === "link-predicted"));
    legend.hidden = !(state.units === "words" && (state.kind === "cross" || state.kind === "align") && s.links);
    legend.replaceChildren(...shown.map((c) => {
      const item = el("span", "legend-item");
      item.dataset.class = c;
      item.dataset.count = String(counts.get(c) || 0);
      let swatch;
      if (state.view === "lines") {
        swatch = svgNode("svg", {width: 30, height: 10});
        swatch.appendChild(svgNode("line", {class: "align-line link " + c, x1: 0, y1: 5, x2: 30, y2: 5}));
      } else {
        swatch = el("span", "swatch link " + c);
      }
      item.append(swatch, el("span", null, LINK_NAMES[c] + " (" + (counts.get(c) || 0) + ")"));
      return item;
    }));
  }

  function draw() {
    const view = current();
    drawn = view;
    const area = $("explorer-view-area");
    if (state.view === "lines") drawLines(view, area); else drawHeatmap(view, area);
    const names = {src: "source", tgt: "target", tgt_in: "target input"};
    const unit = state.units === "words" ? "words" : "pieces";
    const count = view.s.maps[state.kind].heads;
    const heads = view.head !== "avg" ? "head " + (view.head + 1)
      : count === 1 ? "1 head" : "average of " + count + " heads";
    const lines = state.view === "lines";
    $("explorer-axes").textContent = DATA.kinds[state.kind] + ", layer " + (view.layer + 1) + ", " + heads
      + ": " + (lines ? "keys (left): " : "columns (keys): ") + names[view.colSide] + " " + unit
      + "; " + (lines ? "queries (right): " : "rows (queries): ") + names[view.rowSide] + " " + unit;
    drawLegend(view.marks);
    drawShare(view.s);
    $("explorer-tooltip").textContent = "";
    window.explorerDraws += 1;
    document.body.dataset.draws = String(window.explorerDraws);
    if (window.explorerReady === undefined) window.explorerReady = performance.now();
  }

  // ------------------------------------------------------------------ hovering

  const tip = (t) => { $("explorer-tooltip").textContent = t; };
  const fmt = (w) => w.toFixed(3);

  function pairText(i, j) {
    const w = drawn.mat.w[i * drawn.mat.cols + j];
    const mark = drawn.marks.get(i + "," + j);
    return drawn.colLabels[j] + " \u2192 " + drawn.rowLabels[i] + ": " + fmt(w)
      + (mark ? " (" + LINK_NAMES[mark] + ")" : "");
  }

  // A token's weights, largest first: a query's over the keys, or what each query gives a key.
  function tokenText(axis, index) {
    const {mat, rowLabels, colLabels} = drawn;
    const pairs = [];
    if (axis === "row") {
      for (let j = 0; j < mat.cols; j++) pairs.push([colLabels[j], mat.w[index * mat.cols + j]]);
    } else {
      for (let i = 0; i < mat.rows; i++) pairs.push([rowLabels[i], mat.w[i * mat.cols + index]]);
    }
    pairs.sort((a, b) => b[1] - a[1]);
    const top = pairs.slice(0, 10).map(([t, w]) => t + " " + fmt(w)).join(", ");
    return (axis === "row" ? rowLabels[index] + " \u2190 " : colLabels[index] + " \u2192 ") + top
      + (pairs.length > 10 ? ", \u2026" : "");
  }

  function clearFocus() {
    for (const node of document.querySelectorAll(".hl")) node.classList.remove("hl");
    for (const node of document.querySelectorAll(".focus")) node.classList.remove("focus");
  }

  function focus(area, axis, index) {
    clearFocus();
    const container = area.firstElementChild;
    container.classList.add("focus");
    const attr = axis === "row" ? "data-row" : "data-col";
    for (const node of container.querySelectorAll("[" + attr + '="' + index + '"]')) {
      if (!node.classList.contains("align-line")) node.classList.add("hl");
    }
  }

  function hover(event) {
    const area = $("explorer-view-area");
    const target = event.target.closest ? event.target.closest("[data-row], [data-col]") : null;
    if (!target || !drawn) return;
    const row = target.dataset.row, col = target.dataset.col;
    if (row !== undefined && col !== undefined) {
      tip(pairText(Number(row), Number(col)));
    } else if (row !== undefined) {
      focus(area, "row", row);
      tip(tokenText("row", Number(row)));
    } else {
      focus(area, "col", col);
      tip(tokenText("col", Number(col)));
    }
  }

  // ------------------------------------------------------------------ controls

  function go(index) {
    const n = DATA.sentences.length;
    state.sentence = ((index % n) + n) % n;
    refreshChoices();
    showSentence();
    draw();
  }

  let wired = false;

  function wire() {
    const select = $("explorer-sentence");
    select.addEventListener("change", () => go(Number(select.value)));
    $("explorer-prev").addEventListener("click", () => go(state.sentence - 1));
    $("explorer-next").addEventListener("click", () => go(state.sentence + 1));
    $("explorer-kind").addEventListener("change", (e) => {
      state.kind = e.target.value;
      refreshChoices();
      draw();
    });
    $("explorer-layer").addEventListener("change", (e) => { state.layer = Number(e.target.value); draw(); });
    $("explorer-head").addEventListener("change", (e) => { state.head = e.target.value; draw(); });
    $("explorer-view").addEventListener("change", (e) => { state.view = e.target.value; draw(); });
    $("explorer-units").addEventListener("change", (e) => { state.units = e.target.value; draw(); });
    document.addEventListener("keydown", (e) => {
      const typing = ["SELECT", "TEXTAREA", "INPUT"].includes(e.target.tagName);
      if (typing || e.altKey || e.ctrlKey || e.metaKey) return;
      if (e.key === "ArrowLeft") go(state.sentence - 1);
      if (e.key === "ArrowRight") go(state.sentence + 1);
    });
    const area = $("explorer-view-area");
    area.addEventListener("mouseover", hover);
    area.addEventListener("mouseleave", () => { clearFocus(); tip(""); });
    wired = true;
  }

  function start() {
    if (!wired) wire();
    $("explorer-sentence").replaceChildren(...DATA.sentences.map((s, k) => {
      const aer = s.aer === null ? "" : "  (AER " + s.aer.toFixed(3) + ")";
      const cut = (t) => (t.length > 60 ? t.slice(0, 59) + "\u2026" : t);
      const caption = s.number + ": " + cut(text(s.src)) + " \u2192 " + cut(text(s.tgt)) + aer;
      const option = el("option", null, caption);
      option.value = String(k);
      return option;
    }));
    go(0);
  }

  // Show the explorer's data (explorer.pack: data, base64 weights, their inflated size); the page calls
  // it with what it embeds, attnmt serve's page with what /attention answers.
  async function show(data, packed, size) {
    const weights = await inflate(packed, size);
    readWords(data);
    DATA = data;
    WEIGHTS = weights;
    if (DATA.sentences.length === 0) {
      tip("no sentences");
      window.explorerReady = performance.now();
      return;
    }
    start();
  }

  window.attnmtExplorer = {show: show};
  const embedded = $("explorer-data");
  if (embedded) {
    const weights = $("explorer-weights");
    show(JSON.parse(embedded.textContent), weights.textContent, Number(weights.dataset.bytes)).catch((error) => {
      window.explorerError = String(error && error.message || error);
      tip("cannot show the attention: " + window.explorerError);
      console.error(error);
    });
  }
})();
