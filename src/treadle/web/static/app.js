// treadle web UI: the little script every page loads (no inline script anywhere: the CSP forbids it).
// - <time data-local>: adds the viewer's local time next to the server's rendering.
// - [data-refresh]: reloads a region from its fragment URL every data-interval ms (live refresh).
// - form[data-confirm]: asks before a destructive post.
// - pre[data-log]: shows an attempt's log and follows it while the attempt runs.
(function () {
  "use strict";

  var viewerZone = Intl.DateTimeFormat().resolvedOptions().timeZone;

  function localise(root) {
    root.querySelectorAll("time[data-local]").forEach(function (el) {
      if (el.dataset.localised) { return; }
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at.getTime())) { return; }
      el.dataset.localised = "1";
      var shownZone = el.textContent.trim().split(" ").pop();
      if (shownZone === viewerZone || (shownZone === "UTC" && viewerZone === "Etc/UTC")) { return; }
      var local = at.toLocaleString(undefined, {
        year: "numeric", month: "short", day: "numeric",
        hour: "2-digit", minute: "2-digit", timeZoneName: "short"
      });
      el.title = "your time: " + local;
      var span = document.createElement("span");
      span.className = "local";
      span.textContent = " (" + local + ")";
      el.after(span);
    });
  }

  function refresh(region) {
    var url = region.dataset.refresh;
    var every = parseInt(region.dataset.interval || "5000", 10);
    function tick() {
      if (document.hidden || region.contains(document.activeElement) && document.activeElement !== document.body) {
        window.setTimeout(tick, every);
        return;
      }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) {
          if (r.redirected || !r.ok) { throw new Error("refresh stopped: " + r.status); }
          return r.text();
        })
        .then(function (html) {
          region.innerHTML = html;
          localise(region);
          region.dispatchEvent(new CustomEvent("treadle:refreshed", { bubbles: true }));
          window.setTimeout(tick, every);
        })
        .catch(function () {
          region.dataset.refreshStopped = "1";
        });
    }
    window.setTimeout(tick, every);
  }

  function followLog(pre) {
    var offset = 0;
    var status = document.querySelector("[data-log-status]");
    function poll() {
      fetch(pre.dataset.log + "&offset=" + offset, { credentials: "same-origin" })
        .then(function (r) { return r.json(); })
        .then(function (data) {
          if (data.text) {
            var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
            pre.append(document.createTextNode(data.text));
            if (atBottom) { pre.scrollTop = pre.scrollHeight; }
          }
          offset = data.offset;
          if (data.missing && !pre.textContent) {
            pre.classList.add("empty");
            pre.textContent = data.missing;
          }
          if (status) { status.textContent = data.running ? "following the running attempt…" : ""; }
          if (data.running) { window.setTimeout(poll, 1000); }
          pre.dataset.loaded = "1";
        })
        .catch(function () {
          if (status) { status.textContent = "could not read the log"; }
        });
    }
    poll();
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    localise(document);
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("pre[data-log]").forEach(followLog);
  });
})();
