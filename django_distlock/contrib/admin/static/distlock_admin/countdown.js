// Live "expires in" countdowns and "held for" clocks of the held-locks pages (no
// dependencies). Times are the servers': the page says what time the server had
// (#distlock-server-now), and the clocks run from it, not from this computer's clock.
// Without JavaScript the server's text stays, as of the page's time.
"use strict";
(function () {
  var stamp = document.getElementById("distlock-server-now");
  var skew = stamp ? Date.parse(stamp.dataset.now) - Date.now() : 0;
  if (isNaN(skew)) { skew = 0; }
  function words(seconds) {
    var h = Math.floor(seconds / 3600), m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
    var d = Math.floor(h / 24);
    if (d) { return d + " d " + (h % 24) + " h"; }
    return (h ? h + " h " : "") + (h || m ? m + " min " : "") + s + " s";
  }
  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll(".distlock-countdown").forEach(function (el) {
      var left = Math.round((Date.parse(el.dataset.expires) - now) / 1000);
      if (isNaN(left)) { return; }
      if (left <= 0) { el.textContent = "expired"; el.classList.add("distlock-expired"); return; }
      el.textContent = words(left);
    });
    document.querySelectorAll(".distlock-held-for").forEach(function (el) {
      var held = Math.round((now - Date.parse(el.dataset.since)) / 1000);
      if (isNaN(held)) { return; }
      el.textContent = words(Math.max(held, 0));
    });
  }
  tick();
  setInterval(tick, 1000);
}());
