// idem ui: keeps the page's live part (#live, whose data-src names its
// URL) up to date while the application writes the journal, by fetching
// it again every 2 seconds. The server renders and escapes every byte;
// this only swaps it in. It pauses while the tab is hidden, and never
// runs two fetches at once.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  if (!live || !live.dataset.src) {
    return;
  }
  var busy = false;
  function say(text, bad) {
    if (status) {
      status.textContent = text;
      status.classList.toggle("live-bad", !!bad);
    }
  }
  function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(live.dataset.src, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        live.dataset.refreshed = String((Number(live.dataset.refreshed) || 0) + 1);
        say("live: updated " + new Date().toLocaleTimeString());
      })
      .catch(function (err) {
        say("not updating: " + err.message + " (is idem ui still running?)", true);
      })
      .finally(function () {
        busy = false;
      });
  }
  setInterval(refresh, 2000);
})();
