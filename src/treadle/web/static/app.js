// treadle web UI: the little script every page loads (no inline script anywhere: the CSP forbids it).
// - <time data-local>: adds the viewer's local time next to the server's rendering.
// - [data-refresh]: reloads a region from its fragment URL every data-interval ms (live refresh).
// - form[data-confirm]: asks before a destructive post.
// - pre[data-log]: shows an attempt's log and follows it while the attempt runs.
// - table[data-codes]: draws the DAG grid's cells from each task row's state codes.
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

  function esc(text) {
    return text.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  // The grid sends one string of state codes per task (one letter per run, `-` for none) and a
  // mapped task's counts; each cell becomes a link to its task instance, built here in one pass.
  function drawGrids(root) {
    root.querySelectorAll("table[data-codes]").forEach(function (table) {
      if (window.performance && performance.mark) { performance.mark("treadle:grid-start"); }
      var names = {};
      table.dataset.codes.split(",").forEach(function (pair) {
        var at = pair.indexOf(":");
        names[pair.slice(0, at)] = pair.slice(at + 1);
      });
      var runs = Array.prototype.map.call(table.querySelectorAll("thead [data-run]"), function (el) {
        return esc(el.dataset.run);
      });
      var body = table.tBodies[0];
      var html = [];
      Array.prototype.forEach.call(body.rows, function (tr) {
        var task = esc(tr.dataset.task || ""), codes = tr.dataset.cells || "";
        var mapped = tr.dataset.mapped ? JSON.parse(tr.dataset.mapped) : {};
        var out = '<tr><th scope="row">' + task + '</th><td><div class="cells">';
        for (var i = 0; i < codes.length; i++) {
          var state = names[codes.charAt(i)];
          if (!state) {
            out += '<span class="cell none" aria-hidden="true"></span>';
            continue;
          }
          var cls = "cell s-" + state, label = task + " in " + runs[i] + ": " + state, text = "", counts = mapped[i];
          if (counts) {
            var total = 0, parts = [];
            Object.keys(counts).sort().forEach(function (s) {
              total += counts[s];
              parts.push(counts[s] + " " + s);
            });
            cls += " mapped";
            text = String(total);
            label = task + " in " + runs[i] + ": " + total + " mapped (" + parts.join(", ") + ")";
          }
          out += '<a class="' + cls + '" href="/runs/' + runs[i] + "/tasks/" + task + '" title="' +
            label + '">' + text + "</a>";
        }
        html.push(out + "</div></td></tr>");
      });
      body.innerHTML = html.join("");
      table.removeAttribute("data-codes");
      void table.offsetHeight; // lay the cells out now, so the mark below is when they are drawn
      table.dataset.drawn = "1";
      if (window.performance && performance.mark) { performance.mark("treadle:grid-drawn"); }
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
          drawGrids(region);
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
    drawGrids(document);
    localise(document);
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("pre[data-log]").forEach(followLog);
  });
})();
