// In the static book a live-only widget (ipywidgets' `interactive`, drawn by a kernel) cannot
// redraw its figure: its controls would move while the figure stayed. Show them disabled
// (`inert`: no pointer, no keyboard focus), so each value shown is the one its figure was
// drawn with. Precomputed demos (course/book_demo.py, class course-demo) are left alone: their
// controls switch between figures drawn at build time. Widgets render after the page loads.
(function () {
  function disable(root) {
    root.querySelectorAll(".widget-interact:not(.course-live-only)").forEach(function (box) {
      if (box.closest(".course-demo")) { return; }
      box.classList.add("course-live-only");
      box.title = "Needs a running kernel: see the page's Live in JupyterLab note";
      Array.prototype.forEach.call(box.children, function (child) {
        if (!child.classList.contains("widget-output")) {
          child.inert = true;
          child.classList.add("course-disabled");
        }
      });
    });
  }
  function watch() {
    disable(document);
    new MutationObserver(function () { disable(document); })
      .observe(document.body, {childList: true, subtree: true});
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", watch);
  } else {
    watch();
  }
})();
