"use strict";
// attnmt serve's page: the text goes to POST /translate, the chosen sentence to POST /attention, whose
// answer (the explorer's data) the explorer draws (window.attnmtExplorer, explorer.js). Both carry the
// controls: beam, target language, prefix, phrases to hold; /translate also word confidence.
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

  function controls() {
    // What the controls ask for, in both endpoints' terms: a prefix and phrases (";" between them) for
    // every sentence, a multilingual model's target language.
    const asked = {beam_size: Number($("serve-beam").value)};
    if (!$("serve-lang-label").hidden) asked.tgt_lang = $("serve-lang").value;
    const prefix = $("serve-prefix").value.trim();
    const phrases = $("serve-constraints").value.split(";").map((p) => p.trim()).filter((p) => p.length > 0);
    return {asked, prefix, phrases};
  }

  function words(output) {
    // The translation as its words, each underlined by its probability (its title says it).
    return output.words.map((w) => {
      const span = document.createElement("span");
      span.className = "word " + (w.prob < 0.5 ? "low" : w.prob < 0.8 ? "mid" : "high");
      span.title = "p = " + w.prob.toFixed(3);
      span.textContent = w.word;
      return span;
    });
  }

  function item(source, output, index) {
    const li = document.createElement("li");
    li.dataset.index = String(index);
    const src = document.createElement("span");
    src.className = "serve-src";
    src.dir = "auto";
    src.textContent = source;
    const tgt = document.createElement("span");
    tgt.className = "serve-tgt";
    tgt.dir = "auto";
    tgt.dataset.text = output.text;
    if (output.words) tgt.append(...words(output)); else tgt.textContent = output.text;
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
      const {asked: options, prefix, phrases} = controls();
      const body = {text: lines, ...options};
      if (prefix) body.prefix = lines.map(() => prefix);
      if (phrases.length > 0) body.constraints = lines.map(() => phrases);
      if ($("serve-words").checked) body.scores = "words";
      const answer = await post("/translate", body);
      if (mine !== asked) return;
      const items = answer.translations.map((t, k) => item(lines[k], t.outputs[0], k));
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
      const {asked: options, prefix, phrases} = controls();
      const body = {text: source, ...options};
      if (prefix) body.prefix = prefix;
      if (phrases.length > 0) body.constraints = phrases;
      const answer = await post("/attention", body);
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
  for (const typed of ["serve-input", "serve-prefix", "serve-constraints"]) {
    $(typed).addEventListener("input", () => {
      clearTimeout(timer);
      if ($("serve-live").checked) timer = setTimeout(translate, LIVE_MS);
    });
  }
  for (const chosen of ["serve-beam", "serve-lang", "serve-words"]) {
    $(chosen).addEventListener("change", translate);
  }

  fetch("/info").then((r) => r.json()).then((info) => {
    $("serve-model").textContent = info.src_lang + " \u2192 " + info.tgt_lang + "  (" + info.model + ")";
    const beam = String(info.decode.beam_size);
    const select = $("serve-beam");
    if (![...select.options].some((o) => o.value === beam)) select.append(new Option(beam, beam));
    select.value = beam;
    const langs = info.tgt_langs || [];
    if (langs.length > 1) {  // a multilingual model: which language to translate into
      $("serve-lang").replaceChildren(...langs.map((lang) => new Option(lang, lang)));
      $("serve-lang").value = info.tgt_lang;
      $("serve-lang-label").hidden = false;
    }
    if (!info.attention) status("a CTranslate2 export: translations only, no attention");
    window.serveReady = performance.now();
  }).catch((error) => status("cannot reach the server: " + error, true));
})();
