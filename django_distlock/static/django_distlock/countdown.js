// Live "expires in" countdowns of the held-locks pages (no dependencies).
"use strict";
(function () {
  function tick() {
    var now = Date.now();
    document.querySelectorAll(".distlock-countdown").forEach(function (el) {
      var left = Math.round((Date.parse(el.dataset.expires) - now) / 1000);
      if (isNaN(left)) { return; }
      if (left <= 0) { el.textContent = "expired"; el.classList.add("distlock-expired"); return; }
      var h = Math.floor(left / 3600), m = Math.floor(left % 3600 / 60), s = left % 60;
      el.textContent = (h ? h + " h " : "") + (h || m ? m + " min " : "") + s + " s";
    });
  }
  tick();
  setInterval(tick, 1000);
}());
