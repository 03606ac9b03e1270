// Loaded between RequireJS and the widget manager (book/_ext/offline_book.py).
(function () {
  // Each widget module (the manager, and @jupyter-widgets/base and /controls, which it
  // defines by name) finds its fonts beside the address RequireJS gives that name; map every
  // @jupyter-widgets name into the copy served with the book, not the page's own folder
  // (where the fonts of the controls' icons were asked for, and 404'd, before).
  var here = document.currentScript.src.replace(/[^/]*$/, "");
  var manager = here + "html-manager";
  require.config({paths: {"@jupyter-widgets/html-manager/dist": manager, "@jupyter-widgets": manager}});
  window.__jupyter_widgets_assets_path__ = manager + "/";

  // MathJax 3 has no MathJax.Hub; the widget manager, written for MathJax 2, typesets a
  // label with MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]). Answer that call
  // with MathJax 3's typesetPromise, on whichever MathJax object is current.
  var current = window.MathJax;
  var hub = {
    Queue: function () {
      Array.prototype.forEach.call(arguments, function (job) {
        if (Array.isArray(job) && job[0] === "Typeset" && current && current.startup) {
          current.startup.promise.then(function () { return current.typesetPromise([job[2]]); });
        }
      });
    }
  };
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    get: function () { return current; },
    set: function (value) {
      current = value;
      if (value && value.version && !value.Hub) { value.Hub = hub; }
    }
  });
  if (current && current.version && !current.Hub) { current.Hub = hub; }
})();
