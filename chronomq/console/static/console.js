// chronomq console: refreshes the live parts of a page and draws its charts (uPlot).
// No framework and no build step; served as a static file by the broker.
(function () {
  "use strict";
  var REFRESH_MS = 5000;  // unless the page says otherwise (console.refresh_s)

  function get(url, as) {
    return fetch(url, { credentials: "same-origin", headers: { "Accept": as } })
      .then(function (r) { if (!r.ok) { throw new Error(url + ": " + r.status); } return r; });
  }

  // A live part is re-rendered by the server (/part/...) and swapped in, unless the
  // operator is busy in it (a focused field, a ticked box), asked again when the answer
  // arrives: a box ticked while the request was out is kept.
  function busy(el) {
    return el.contains(document.activeElement) || el.querySelector("input:checked") !== null;
  }
  function refreshParts() {
    document.querySelectorAll(".live[data-src]").forEach(function (el) {
      if (busy(el)) { return; }
      get(el.dataset.src, "text/html").then(function (r) { return r.text(); })
        .then(function (html) {
          if (busy(el)) { return; }
          el.innerHTML = html; el.dataset.refreshed = Date.now();
        })
        .catch(function () { el.classList.add("stale"); });
    });
  }

  var charts = {};
  function chartSize(el) { return { width: Math.max(320, el.clientWidth - 8), height: 220 }; }

  function draw(name, opts, data) {
    var el = document.getElementById("chart-" + name);
    if (!el || typeof uPlot === "undefined") { return; }
    if (charts[name]) { charts[name].setData(data); return; }
    var size = chartSize(el);
    opts.width = size.width; opts.height = size.height;
    opts.scales = opts.scales || {};  // counts and rates start at zero
    opts.scales.y = { range: function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; } };
    charts[name] = new uPlot(opts, data, el);
    el.dataset.drawn = "1";
  }

  var bars = typeof uPlot !== "undefined" && uPlot.paths && uPlot.paths.bars
    ? uPlot.paths.bars({ size: [0.8, 60] }) : undefined;
  function barSeries(label, color) {
    return { label: label, stroke: color, fill: color + "99", paths: bars, points: { show: false } };
  }

  function overview(d) {
    var r = d.rates;
    draw("rates", {
      series: [{}, { label: "sent/s", stroke: "#2563eb" }, { label: "due/s", stroke: "#d97706" },
               { label: "popped/s", stroke: "#059669" }, { label: "acked/s", stroke: "#7c3aed" }],
      axes: [{}, { size: 60 }],
    }, [r.t, r.sent, r.due, r.delivered, r.acked]);
    var xs = d.lateness.bounds_ms.map(function (_, i) { return i; });
    xs.push(xs.length);
    var labels = d.lateness.bounds_ms.map(function (b) { return "<=" + b + " ms"; });
    labels.push("> 5 s");
    draw("lateness", {
      scales: { x: { time: false } },
      series: [{ label: "lateness" , value: function (u, v) { return v == null ? "" : labels[v]; } },
               barSeries("deliveries", "#d97706")],
      axes: [{ values: function (u, vals) { return vals.map(function (v) { return labels[v] || ""; }); } },
             { size: 60 }],
    }, [xs, d.lateness.counts]);
  }

  function schedule(s) {
    var m = s.minutes.map(function (_, i) { return (s.minute_start_ms + i * 60000) / 1000; });
    draw("minutes", { series: [{}, barSeries("due", "#2563eb")], axes: [{}, { size: 60 }] },
         [m, s.minutes]);
    var h = s.hours.map(function (_, i) { return (s.hour_start_ms + i * 3600000) / 1000; });
    draw("hours", { series: [{}, barSeries("due", "#059669")], axes: [{}, { size: 60 }] },
         [h, s.hours]);
    var days = s.days.length ? s.days : [[s.hour_start_ms, 0]];
    draw("days", { series: [{}, barSeries("due", "#7c3aed")], axes: [{}, { size: 60 }] },
         [days.map(function (d) { return d[0] / 1000; }), days.map(function (d) { return d[1]; })]);
  }

  function refreshCharts() {
    if (document.getElementById("chart-rates")) {
      get("/api/overview", "application/json").then(function (r) { return r.json(); }).then(overview);
    }
    if (document.getElementById("chart-minutes")) {
      get("/api/schedule", "application/json").then(function (r) { return r.json(); }).then(schedule);
    }
  }

  function tick() {
    if (document.hidden) { return; }
    refreshParts();
    refreshCharts();
  }

  document.addEventListener("DOMContentLoaded", function () {
    refreshCharts();
    var every = parseInt(document.body.dataset.refreshMs, 10);
    setInterval(tick, every > 0 ? every : REFRESH_MS);
  });
})();
