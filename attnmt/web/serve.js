"use strict";
// attnmt serve's page: the text goes to POST /translate, the chosen sentence to POST /attention, whose
// answer (the explorer's data) the explorer draws (window.attnmtExplorer, explorer.js).
(function () {
  const $ = (id) => document.getElementById(id);
  const LIVE_MS = 600;  // typing pauses this long before a live translation
  let asked = 0;  // the newest translation asked for; older answers are dropped
  let chosen = 0;  // the newest attention asked for
  let timer = null;
  window.serveTranslations = 0;  // answers shown so far (tests wait on it)

  function status(message, error) {
    $("serve-status").textContent = message;
    $("serve-status").classList.toggle("error", Boolean(error));
  }

  async function post(path, body) {
    const response = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                        body: JSON.stringify(body)});
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || response.statusText);
    return answer;
  }

  function item(source, translation, index) {
    const li = document.createElement("li");
    li.dataset.index = String(index);
    const src = document.createElement("span");
    src.className = "serve-src";
    src.dir = "auto";
    src.textContent = source;
    const tgt = document.createElement("span");
    tgt.className = "serve-tgt";
    tgt.dir = "auto";
    tgt.textContent = translation;
    li.append(src, tgt);
    li.addEventListener("click", () => attend(li, source));
    return li;
  }

  async function translate() {
    const lines = $("serve-input").value.split("\n").map((l) => l.trim()).filter((l) => l.length > 0);
    if (lines.length === 0) return;
    const mine = ++asked;
    status("translating\u2026");
    const started = performance.now();
    try {
      const answer = await post("/translate", {text: lines, beam_size: Number($("serve-beam").value)});
      if (mine !== asked) return;
      const items = answer.translations.map((t, k) => item(lines[k], t.outputs[0].text, k));
      $("serve-results").replaceChildren(...items);
      window.serveTranslations += 1;
      status(lines.length + " sentence(s) in " + Math.round(performance.now() - started) + " ms");
      attend(items[0], lines[0]);
    } catch (error) {
      if (mine === asked) status(String(error.message || error), true);
    }
  }

  async function attend(li, source) {
    const mine = ++chosen;
    for (const other of $("serve-results").children) other.classList.toggle("chosen", other === li);
    try {
      const answer = await post("/attention", {text: source, beam_size: Number($("serve-beam").value)});
      if (mine !== chosen) return;
      if (answer.data.sentences.length === 0) {
        $("serve-attention").hidden = true;
        status("the translation is empty: no attention to draw");
        return;
      }
      $("serve-attention").hidden = false;
      await window.attnmtExplorer.show(answer.data, answer.weights, answer.bytes);
    } catch (error) {
      if (mine === chosen) status(String(error.message || error), true);
    }
  }

  $("serve-form").addEventListener("submit", (e) => { e.preventDefault(); translate(); });
  $("serve-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); translate(); }
  });
  $("serve-input").addEventListener("input", () => {
    clearTimeout(timer);
    if ($("serve-live").checked) timer = setTimeout(translate, LIVE_MS);
  });
  $("serve-beam").addEventListener("change", translate);

  fetch("/info").then((r) => r.json()).then((info) => {
    $("serve-model").textContent = info.src_lang + " \u2192 " + info.tgt_lang + "  (" + info.model + ")";
    const beam = String(info.decode.beam_size);
    const select = $("serve-beam");
    if (![...select.options].some((o) => o.value === beam)) select.append(new Option(beam, beam));
    select.value = beam;
    if (!info.attention) status("a CTranslate2 export: translations only, no attention");
    window.serveReady = performance.now();
  }).catch((error) => status("cannot reach the server: " + error, true));
})();
