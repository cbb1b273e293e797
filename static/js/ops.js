/* Operations pages: draw each chart from the JSON its table was built from (json_script).
 * CSP: no inline script; Chart.js and this file come from 'self'.  Charts are redrawn after
 * htmx swaps a report in.  The numbers are always in the table under the chart as well. */
(function () {
  "use strict";
  // Okabe-Ito: distinguishable with common colour-vision deficiencies.
  var PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];
  var charts = new WeakMap();

  function colour(i) { return PALETTE[i % PALETTE.length]; }

  function datasets(data) {
    var series = data.series;
    if (data.only) {
      series = data.only.map(function (i) { return data.series[i - 1]; });
    } else if (data.skip_last) {
      series = series.slice(0, -1);
    }
    return series.map(function (s, i) {
      return { label: s.label, data: s.data, backgroundColor: colour(i), borderColor: colour(i), borderWidth: 2, pointRadius: 0 };
    });
  }

  function bandConfig(data) {
    var col = function (name) {
      for (var i = 0; i < data.series.length; i++) { if (data.series[i].label === name) { return data.series[i].data; } }
      return [];
    };
    return {
      type: "line",
      data: {
        labels: data.labels,
        datasets: [
          { label: "Actual", data: col("Actual"), borderColor: "#000000", borderWidth: 2, pointRadius: 0 },
          { label: "Lower 80%", data: col("Lower 80%"), borderColor: "#56B4E9", borderWidth: 1, pointRadius: 0, fill: false },
          { label: "Upper 80%", data: col("Upper 80%"), borderColor: "#56B4E9", backgroundColor: "rgba(86,180,233,0.3)", borderWidth: 1, pointRadius: 0, fill: "-1" },
          { label: "Forecast", data: col("Forecast"), borderColor: "#0072B2", borderWidth: 2, pointRadius: 0 },
          { label: "Capacity", data: col("Capacity"), borderColor: "#D55E00", borderDash: [6, 4], borderWidth: 2, pointRadius: 0 }
        ]
      },
      // y_max: the axis is cut at 3x capacity when a band runs far above it (the page says so).
      options: { maintainAspectRatio: false, animation: false, spanGaps: false, scales: { y: { beginAtZero: true, max: data.y_max || undefined, title: { display: true, text: "GPUs" } } } }
    };
  }

  function config(data) {
    if (data.kind === "band") { return bandConfig(data); }
    var stacked = data.kind === "stacked";
    return {
      type: data.kind === "line" ? "line" : "bar",
      data: { labels: data.labels, datasets: datasets(data) },
      options: {
        maintainAspectRatio: false,
        animation: false,
        scales: { x: { stacked: stacked }, y: { stacked: stacked, beginAtZero: true } },
        plugins: { legend: { position: "bottom" } }
      }
    };
  }

  function draw(root) {
    if (typeof window.Chart === "undefined") { return; }
    var canvases = (root || document).querySelectorAll("canvas[data-chart]");
    Array.prototype.forEach.call(canvases, function (canvas) {
      if (charts.has(canvas)) { return; }
      var source = document.getElementById(canvas.getAttribute("data-chart"));
      if (!source) { return; }
      var data = JSON.parse(source.textContent);
      charts.set(canvas, new window.Chart(canvas, config(data)));
      canvas.setAttribute("data-drawn", "true");
    });
  }

  document.addEventListener("DOMContentLoaded", function () { draw(document); });
  document.addEventListener("htmx:afterSettle", function (event) { draw(event.target); });
  // Move the focus to a drill-down when it arrives, so keyboard users land on it.
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (target && target.id === "idle-drill") {
      var fresh = document.getElementById("idle-drill");
      if (fresh) { fresh.focus(); }
    }
  });
})();
