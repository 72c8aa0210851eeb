// Auto-refresh of the held-locks page: reloads it every N seconds while the box is
// ticked. The choice is kept in the URL (?refresh=0 or ?refresh=N) and in this
// browser (localStorage); on by default. No reload while the operator is typing in
// a field or a confirmation is open (a form.distlock-confirm, an open <dialog>, or an
// element marked data-distlock-no-refresh). Without JavaScript the page does not reload.
"use strict";
(function () {
  var box = document.getElementById("distlock-refresh");
  if (!box) { return; }
  var KEY = "django_distlock.refresh";
  var state = document.getElementById("distlock-refresh-state");
  var seconds = parseInt(box.dataset.seconds, 10) || 10;
  var param = box.dataset.param, stored = null;
  try { stored = window.localStorage.getItem(KEY); } catch (e) { /* storage off */ }
  box.checked = param ? param !== "0" : stored !== "0";
  document.getElementById("distlock-refresh-control").hidden = false;
  var left = seconds;
  function busy() {
    var el = document.activeElement;
    if (document.querySelector("form.distlock-confirm, dialog[open], [data-distlock-no-refresh]")) {
      return true;
    }
    return el && el !== box && /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName);
  }
  function show(text) { state.textContent = text; }
  function tick() {
    if (!box.checked) { show("off"); return; }
    if (busy()) { left = seconds; show("paused"); return; }
    left -= 1;
    if (left <= 0) { show("refreshing…"); window.location.reload(); return; }
    show("in " + left + " s");
  }
  box.addEventListener("change", function () {
    try { window.localStorage.setItem(KEY, box.checked ? "1" : "0"); } catch (e) { /* off */ }
    var query = new URLSearchParams(window.location.search);
    query.set("refresh", box.checked ? String(seconds) : "0");
    window.history.replaceState(null, "", "?" + query.toString());
    // The page's own links and its filter keep the choice too.
    document.querySelectorAll("#content-main a[href^='?']").forEach(function (a) {
      var linked = new URLSearchParams(a.getAttribute("href").slice(1));
      linked.set("refresh", query.get("refresh"));
      a.setAttribute("href", "?" + linked.toString());
    });
    var kept = document.querySelector("#changelist-search input[name=refresh]");
    if (!kept) {
      kept = document.createElement("input");
      kept.type = "hidden";
      kept.name = "refresh";
      document.getElementById("changelist-search").appendChild(kept);
    }
    kept.value = query.get("refresh");
    left = seconds;
    box.blur();
    tick();
  });
  tick();
  window.setInterval(tick, 1000);
}());
