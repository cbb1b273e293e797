/* Berth: the little JavaScript the pages need beyond htmx. */
(function () {
  "use strict";
  // Controls that only work with JavaScript (class "js-only") are hidden until it runs.
  document.documentElement.classList.add("js");

  /* After a form comes back with errors (an htmx POST swapped it in place), move keyboard focus
     to the first field in error, or to the error summary, so keyboard and screen-reader users
     are not left at the top of the page. */
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

  /* Polled regions ([data-poll], hx-trigger "every 5s"): no requests while the tab is hidden,
     one at once when it becomes visible again ("berth:visible"), and no swap when the answer
     says nothing new, so the surrounding aria-live region announces real changes only.  (An
     hx-trigger filter expression would need eval, which the CSP forbids.) */
  document.addEventListener("htmx:confirm", function (event) {
    var elt = event.detail && event.detail.elt;
    if (elt && elt.hasAttribute && elt.hasAttribute("data-poll") && document.hidden) {
      event.preventDefault();
    }
  });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) document.dispatchEvent(new CustomEvent("berth:visible"));
  });
  function textOf(node) {
    return (node.textContent || "").replace(/\s+/g, " ").trim();
  }
  document.addEventListener("htmx:beforeSwap", function (event) {
    var detail = event.detail || {};
    var elt = detail.elt;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-poll") || !detail.xhr) return;
    if (detail.xhr.status !== 200) {
      detail.shouldSwap = false; // keep the last good state; the next poll tries again
      return;
    }
    var incoming = document.createElement("template");
    incoming.innerHTML = detail.serverResponse;
    var root = incoming.content.firstElementChild;
    if (!root || root.id !== elt.id) {
      // Not the fragment (the session ended and the poll was redirected to the login page):
      // never paste a page into the page; reload so the browser shows where it was sent.
      detail.shouldSwap = false;
      window.location.reload();
      return;
    }
    if (textOf(incoming.content) === textOf(elt)) detail.shouldSwap = false;
  });

  /* After a polled region changed, say its summary ([data-announce]) in the persistent live
     region "<id>-announce", so screen readers hear what changed rather than the whole part. */
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (!target || !target.id) return;
    var fresh = document.getElementById(target.id);
    if (!fresh || !fresh.hasAttribute("data-poll")) return;
    var region = document.getElementById(fresh.id + "-announce");
    var summary = fresh.querySelector("[data-announce]");
    if (region && summary) region.textContent = "Updated: " + textOf(summary);
  });

  /* "Start now": <button data-set-now="ID" data-utc-offset-s="N"> sets that datetime-local
     input to the current minute in the site's time zone and asks for fresh availability. */
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-set-now]");
    if (!button) return;
    var input = document.getElementById(button.getAttribute("data-set-now"));
    if (!input) return;
    var offset = parseInt(button.getAttribute("data-utc-offset-s") || "0", 10) || 0;
    input.value = new Date(Date.now() + offset * 1000).toISOString().slice(0, 16);
    input.dispatchEvent(new Event("change", { bubbles: true }));
    input.focus();
  });

  /* Copy buttons: <button data-copy="ID"> copies the text of the element with that id. */
  function announce(button, message) {
    var status = document.getElementById(button.getAttribute("data-copy") + "-status");
    if (status) status.textContent = message;
  }
  function fallbackCopy(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (e) {
      ok = false;
    }
    document.body.removeChild(area);
    return ok;
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.value !== undefined && source.tagName !== "PRE" && source.tagName !== "CODE"
      ? source.value : source.textContent;
    text = text.replace(/\s+$/, "");
    var done = function () { announce(button, "Copied."); };
    var failed = function () {
      if (fallbackCopy(text)) done();
      else announce(button, "Could not copy: select the text and copy it by hand.");
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, failed);
    } else {
      failed();
    }
  });
})();
