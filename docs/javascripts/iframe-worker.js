// attnmt's docs: a stand-in for Web Workers on pages opened from disk (file:), written for this site.
// Chromium refuses `new Worker(file URL)`, so Material's search (a worker) would not start from disk, and
// Material's offline plugin would fetch a shim from a CDN instead (it adds none when a polyfill's name says
// iframe-worker, as this file's does). Here the worker's script runs in a hidden iframe of the same page:
// messages to the worker are dispatched on the iframe's window, and the script's postMessage comes back as
// the worker's "message" event. Served over HTTP (mkdocs serve), real workers are used.
(function () {
  "use strict";
  if (location.protocol !== "file:") {
    return;
  }

  class FrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.waiting = [];
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      this.frame.tabIndex = -1;
      this.frame.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).appendChild(this.frame);
      const inner = this.frame.contentWindow;
      inner.postMessage = (data) => this.answer(data);
      inner.importScripts = () => {
        throw new Error("importScripts: not available to a page opened from disk");
      };
      const script = inner.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => {
        this.ready = true;
        this.waiting.splice(0).forEach((data) => this.deliver(data));
      };
      inner.document.head.appendChild(script);
    }

    answer(data) {
      const event = new MessageEvent("message", { data: data });
      this.dispatchEvent(event);
      if (typeof this.onmessage === "function") {
        this.onmessage(event);
      }
    }

    deliver(data) {
      const inner = this.frame.contentWindow;
      inner.dispatchEvent(new inner.MessageEvent("message", { data: data }));
    }

    postMessage(data) {
      if (this.ready) {
        this.deliver(data);
      } else {
        this.waiting.push(data);
      }
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.Worker = FrameWorker;
})();
