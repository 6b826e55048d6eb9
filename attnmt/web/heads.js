"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  // Okabe-Ito colours: told apart with the common colour-vision deficiencies.
  const COLOURS = {"diagonal": [0, 114, 178], "previous": [86, 180, 233], "next": [0, 158, 115],
                   "stripe": [230, 159, 0], "block": [204, 121, 167], "dispersed": [120, 120, 120],
                   "long-range": [213, 94, 0]};
  const MAP_SIZE = 150;  // the longer side of a heatmap, in pixels (cells of 2 to 10 pixels)

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  const css = (rgb) => "rgb(" + rgb.join(",") + ")";
  const fixed = (x, digits) => (x === null || x === undefined ? "–" : x.toFixed(digits));
  const signed = (x, digits) => (x === null || x === undefined ? "–" : (x > 0 ? "+" : "") + x.toFixed(digits));
  const percent = (f) => Math.round(f * 1000) / 10 + "%";
  const key = (kind, layer, head) => kind + ":" + layer + ":" + head;

  function paint(node, pattern) {
    node.style.setProperty("--pattern", css(COLOURS[pattern]));
    node.dataset.pattern = pattern;
  }

  function text(pieces) {
    return pieces.filter((p) => p !== "<s>" && p !== "</s>" && p !== "<pad>").join("")
      .replace(/\u2581/g, " ").trim();
  }

  function row(cells, header) {
    const tr = el("tr");
    cells.forEach((cell, k) => {
      const td = el(header ? "th" : "td", k === 0 ? "text" : null, cell);
      tr.appendChild(td);
    });
    return tr;
  }

  function summary(DATA) {
    const r = DATA.report;
    const refs = r.references === "targets" ? "the given targets"
      : "the model's own translations (the unmasked BLEU is 100 by construction)";
    const search = r.beam_size === 1 ? "greedy search" : "beam search (beam " + r.beam_size + ")";
    const box = $("heads-summary");
    box.replaceChildren(
      el("div", null, r.pairs + " sentence pairs, " + r.target_tokens + " target tokens; teacher forcing and " +
         "BLEU against " + refs + "; " + search + "."),
      el("div", null, "Unmasked: BLEU " + fixed(r.bleu, 2) + ", loss " + fixed(r.loss, 4) +
         " per target token. " + r.heads.length + " heads."));
  }

  function legend(DATA) {
    const counts = {};
    for (const h of DATA.report.heads) counts[h.pattern] = (counts[h.pattern] || 0) + 1;
    const box = $("heads-legend");
    for (const pattern of DATA.patterns) {
      const item = el("span", "legend-item");
      paint(item, pattern);
      item.dataset.count = String(counts[pattern] || 0);
      item.title = DATA.rules[pattern];
      item.append(el("span", "swatch"), el("span", null, pattern + " (" + (counts[pattern] || 0) + ")"),
                  el("span", "rule", DATA.rules[pattern]));
      box.appendChild(item);
    }
    const table = $("heads-counts");
    table.appendChild(row(["kind", ...DATA.patterns], true));
    for (const [kind, name] of DATA.kinds) {
      const found = DATA.report.pattern_counts[kind];
      if (found) table.appendChild(row([name, ...DATA.patterns.map((p) => String(found[p]))]));
    }
  }

  function pruning(DATA) {
    const r = DATA.report, table = $("heads-pruning");
    table.appendChild(row(["heads masked", "heads", "BLEU", "ΔBLEU", "loss"], true));
    table.appendChild(row(["none", "0", fixed(r.bleu, 2), "", fixed(r.loss, 4)]));
    for (const p of r.pruned) {
      const tr = row([percent(p.fraction) + " least important", String(p.heads.length), fixed(p.bleu, 2),
                      signed(p.bleu - r.bleu, 2), fixed(p.loss, 4)]);
      tr.dataset.fraction = String(p.fraction);
      tr.dataset.how = "importance";
      table.appendChild(tr);
    }
    const draws = r.random.draws;
    if (draws.length) {
      const loss = draws.reduce((a, d) => a + d.loss, 0) / draws.length;
      const tr = row([percent(r.random.fraction) + " at random (mean of " + draws.length + ")",
                      String(draws[0].heads.length), fixed(r.random.mean_bleu, 2),
                      signed(r.random.mean_bleu - r.bleu, 2), fixed(loss, 4)]);
      tr.dataset.fraction = String(r.random.fraction);
      tr.dataset.how = "random";
      tr.title = "draws: " + draws.map((d) => fixed(d.bleu, 2)).join(", ");
      table.appendChild(tr);
    }
  }

  function heatmap(matrix, pattern, labels, name, tip) {
    const rows = matrix.length, cols = matrix[0].length;
    const cell = Math.max(2, Math.min(10, Math.floor(MAP_SIZE / Math.max(rows, cols))));
    const canvas = el("canvas");
    canvas.width = cols * cell;
    canvas.height = rows * cell;
    const g = canvas.getContext("2d"), rgb = COLOURS[pattern];
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        const w = Math.min(Math.max(matrix[i][j], 0), 1);
        g.fillStyle = css(rgb.map((c) => Math.round(255 + (c - 255) * w)));
        g.fillRect(j * cell, i * cell, cell, cell);
      }
    }
    canvas.addEventListener("mousemove", (e) => {
      const box = canvas.getBoundingClientRect();
      const i = Math.floor((e.clientY - box.top) / cell), j = Math.floor((e.clientX - box.left) / cell);
      if (i < 0 || j < 0 || i >= rows || j >= cols) return;
      tip(name + ": " + labels[1][j] + " → " + labels[0][i] + " " + matrix[i][j].toFixed(3));
    });
    canvas.addEventListener("mouseleave", () => tip(""));
    return canvas;
  }

  function maps(DATA, byKey) {
    const s = DATA.sample, area = $("heads-maps"), tip = (t) => { $("heads-tooltip").textContent = t; };
    if (s === null) {
      $("heads-sentence").textContent = "no sentence to show";
      return;
    }
    const sentence = $("heads-sentence");
    sentence.append(el("b", null, "sentence " + s.number), el("br"), el("span", "side", "source"),
                    el("span", null, text(s.src)), el("br"), el("span", "side", "target"),
                    el("span", null, text(s.tgt)));
    for (const [kind, name] of DATA.kinds) {
      if (!s.maps[kind]) continue;
      const section = el("section", "kind");
      section.dataset.kind = kind;
      const [rowSide, colSide] = DATA.axes[kind];
      section.appendChild(el("h3", null, name + " (rows: " + rowSide + ", columns: " + colSide + ")"));
      s.maps[kind].forEach((layer, l) => {
        const line = el("div", "layer-row");
        line.appendChild(el("div", "layer-name", "layer " + (l + 1)));
        layer.forEach((matrix, h) => {
          const head = byKey.get(key(kind, l + 1, h + 1));
          const pattern = head ? head.pattern : "dispersed";
          const figure = el("figure", "head-map");
          paint(figure, pattern);
          Object.assign(figure.dataset, {kind: kind, layer: String(l + 1), head: String(h + 1),
                                         rows: String(matrix.length), cols: String(matrix[0].length)});
          const label = kind + " L" + (l + 1) + " H" + (h + 1);
          figure.appendChild(heatmap(matrix, pattern, [s[rowSide], s[colSide]], label, tip));
          figure.appendChild(el("figcaption", null, "H" + (h + 1) + " " + pattern +
                                (head ? " " + head.score.toFixed(2) : "")));
          line.appendChild(figure);
        });
        section.appendChild(line);
      });
      area.appendChild(section);
    }
  }

  function table(DATA) {
    const t = $("heads-table");
    const header = row(["layer", "kind", "head", "pattern", "score", "confidence", "entropy", "Δloss", "ΔBLEU"],
                       true);
    for (const k of [1, 3]) header.cells[k].className = "text";
    t.appendChild(header);
    const names = Object.fromEntries(DATA.kinds);
    for (const h of DATA.report.heads) {
      const tr = row([String(h.layer), names[h.kind], String(h.head), "", fixed(h.score, 3),
                      fixed(h.confidence, 3), fixed(h.entropy, 3), signed(h.delta_loss, 4),
                      signed(h.delta_bleu, 2)]);
      tr.cells[1].className = "text";
      const cell = tr.cells[3];
      cell.className = "text";
      cell.append(el("span", "chip"), el("span", null, h.pattern));
      paint(tr, h.pattern);
      t.appendChild(tr);
    }
  }

  try {
    const DATA = JSON.parse($("heads-data").textContent);
    const byKey = new Map(DATA.report.heads.map((h) => [key(h.kind, h.layer, h.head), h]));
    summary(DATA);
    legend(DATA);
    pruning(DATA);
    maps(DATA, byKey);
    table(DATA);
    window.headsReady = performance.now();
  } catch (error) {
    window.headsError = String(error && error.message || error);
    $("heads-summary").textContent = "cannot show the heads: " + window.headsError;
    console.error(error);
  }
})();
