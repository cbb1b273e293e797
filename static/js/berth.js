/* Berth: the little JavaScript the pages need beyond htmx.
   After a form comes back with errors (an htmx POST swapped it in place), move keyboard focus
   to the first field in error, or to the error summary, so keyboard and screen-reader users
   are not left at the top of the page. */
(function () {
  "use strict";
  document.addEventListener("htmx:afterSettle", function (event) {
    var detail = event.detail || {};
    if (!detail.requestConfig || detail.requestConfig.verb !== "post") return;
    var root = document.getElementById("main");
    if (!root) return;
    var target = root.querySelector('[aria-invalid="true"]') || root.querySelector('[role="alert"]');
    if (!target) return;
    if (!target.hasAttribute("tabindex") && !/^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(target.tagName)) {
      target.setAttribute("tabindex", "-1");
    }
    target.focus();
  });
})();
