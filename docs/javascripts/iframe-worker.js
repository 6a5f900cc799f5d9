/* Search from a site opened as files (file://, no server, no network).
 *
 * Material's search runs in a Web Worker, and a page opened from disk may not start one (the browser refuses a worker
 * script from a file:// URL). This stand-in runs the same worker script in a hidden same-origin iframe instead: the
 * page's messages are dispatched to the iframe's window, and the script's `postMessage` calls come back to the page
 * as "message" events, which is all Material's search asks of a Worker. Over http(s) the browser's Worker is used.
 *
 * Its name holds "iframe-worker" on purpose: Material's offline plugin then does not add its own shim of that name,
 * which it would fetch from a CDN (mkdocs.yml, `extra.polyfills`).
 */
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.pending = [];
      const frame = document.createElement("iframe");
      frame.hidden = true;
      frame.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).appendChild(frame);
      this.frame = frame;
      const scope = frame.contentWindow;
      scope.postMessage = (data) => setTimeout(() => {  // the worker's answer, to the page
        const event = new MessageEvent("message", { data: data });
        if (typeof this.onmessage === "function") this.onmessage(event);
        this.dispatchEvent(event);
      });
      scope.importScripts = () => {
        throw new Error("importScripts is not available in the file:// search worker (English search needs none)");
      };
      const script = scope.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => {
        this.ready = true;
        this.pending.splice(0).forEach((data) => this.postMessage(data));
      };
      scope.document.head.appendChild(script);
    }

    postMessage(data) {  // the page's message, to the worker's "message" listeners
      if (!this.ready) {
        this.pending.push(data);
        return;
      }
      const scope = this.frame.contentWindow;
      setTimeout(() => scope.dispatchEvent(new scope.MessageEvent("message", { data: data })));
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.Worker = FileWorker;
})();
