// Loaded between RequireJS and the widget manager (book/_ext/offline_book.py).
(function () {
  // The widget manager finds its fonts beside the module it is loaded as; point that
  // module at the copy served with the book, not at the page's own folder.
  var here = document.currentScript.src.replace(/[^/]*$/, "");
  require.config({paths: {"@jupyter-widgets/html-manager/dist": here + "html-manager"}});

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
