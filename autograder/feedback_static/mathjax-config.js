// MathJax settings of the feedback page (a file, not an inline script: the page's
// Content-Security-Policy runs only scripts shipped beside it).
window.MathJax = {
  tex: {inlineMath: [["$", "$"], ["\\(", "\\)"]], displayMath: [["$$", "$$"], ["\\[", "\\]"]],
        processEscapes: true},
  // the safe extension keeps \href, \style and \class of a student's formula harmless
  loader: {load: ["ui/safe"]},
  options: {enableMenu: false}
};
