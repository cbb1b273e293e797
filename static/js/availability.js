/* Berth availability outlook: one Chart.js chart per GPU type, drawn from the JSON the page
   embeds (json_script) -- the same numbers as the table beside it.  Bars stacked up to the
   capacity: GPUs used by running work, booked and in use, lendable (booked but unused, or held
   for sessions) and free to book; lines: the capacity, the demand forecast and its 80% band.
   Clicking an hour with free GPUs opens the booking form pre-filled for that hour; keyboard
   users have the same links in the table. */
(function () {
  "use strict";

  var COLORS = {
    running: "#64748b",
    booked: "#1f4fbf",
    free: "rgba(47, 133, 90, 0.55)",
    lendable: "#b45309",
    forecast: "#6b21a8",
    band: "rgba(107, 33, 168, 0.15)",
    capacity: "#1d2433"
  };

  function label(hour) {
    // "2026-11-30T14:00" -> "30/11 14:00" (already in the site's time zone)
    return hour.slice(8, 10) + "/" + hour.slice(5, 7) + " " + hour.slice(11, 16);
  }

  function bandPeak(data) {
    var peak = 0;
    (data.upper80 || []).concat(data.forecast || []).forEach(function (v) { if (v !== null && v > peak) { peak = v; } });
    return peak;
  }

  function draw(canvas) {
    var source = document.getElementById(canvas.getAttribute("data-chart"));
    if (!source || typeof window.Chart === "undefined") return;
    var data = JSON.parse(source.textContent);
    var hasForecast = data.forecast.some(function (v) { return v !== null; });
    var datasets = [
      { type: "bar", label: "Running work", data: data.stack.running, backgroundColor: COLORS.running,
        stack: "gpus", order: 3 },
      { type: "bar", label: "Booked, in use", data: data.stack.bookedInUse, backgroundColor: COLORS.booked,
        stack: "gpus", order: 3 },
      { type: "bar", label: "Lendable", data: data.stack.lendable, backgroundColor: COLORS.lendable,
        stack: "gpus", order: 3 },
      { type: "bar", label: "Free to book", data: data.stack.freeToBook, backgroundColor: COLORS.free,
        stack: "gpus", order: 3 },
      { type: "line", label: "Capacity", data: data.hours.map(function () { return data.capacity; }),
        borderColor: COLORS.capacity, borderWidth: 1, pointRadius: 0, order: 2, stack: "capacity" }
    ];
    if (hasForecast) {
      datasets.push(
        { type: "line", label: "Forecast 80% low", data: data.lower80, borderWidth: 0, pointRadius: 0,
          fill: false, order: 0, stack: "lower80" },
        { type: "line", label: "Forecast 80% band", data: data.upper80, borderWidth: 0, pointRadius: 0,
          backgroundColor: COLORS.band, fill: "-1", order: 0, stack: "upper80" },
        { type: "line", label: "Forecast demand", data: data.forecast, borderColor: COLORS.forecast,
          borderWidth: 2, pointRadius: 0, order: 0, stack: "forecast" }
      );
    }
    var peak = bandPeak(data);
    var cut = data.capacity > 0 && peak > 3 * data.capacity;
    var box = canvas.parentNode;  // the fixed-height chart box: the note goes above it
    if (cut && box && box.parentNode && !box.parentNode.querySelector(".chart-cut")) {
      var note = document.createElement("p");
      note.className = "help chart-cut";
      note.textContent = "The forecast band reaches " + peak.toFixed(1) + " GPUs, above 3× this type's " +
        data.capacity + ": the chart is cut at " + 3 * data.capacity + " GPUs (the table has every number).";
      box.parentNode.insertBefore(note, box);
    }
    // Only the bars share a stack: every line has its own (Chart.js stacks a shared one).
    // eslint-disable-next-line no-new
    new window.Chart(canvas, {
      data: { labels: data.hours.map(label), datasets: datasets },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        interaction: { mode: "index", intersect: false },
        scales: {
          x: { stacked: true, ticks: { maxRotation: 0, autoSkip: true, maxTicksLimit: 8 } },
          // Cut at 3x capacity: a forecast band far above a small pool would squash its bars
          // (the numbers under the chart have every value).
          y: { stacked: true, beginAtZero: true, suggestedMax: data.capacity, max: cut ? 3 * data.capacity : undefined, title: { display: true, text: "GPUs" } }
        },
        plugins: {
          legend: {
            labels: { filter: function (item) { return item.text !== "Forecast 80% low"; } }
          },
          tooltip: {
            callbacks: {
              footer: function (items) {
                var i = items.length ? items[0].dataIndex : -1;
                return i >= 0 && data.bookUrls[i] ? "Click to book this hour" : "";
              }
            }
          }
        },
        onHover: function (event, elements) {
          var i = elements.length ? elements[0].index : -1;
          canvas.classList.toggle("clickable", i >= 0 && Boolean(data.bookUrls[i]));
        },
        onClick: function (event, elements) {
          if (!elements.length) return;
          var url = data.bookUrls[elements[0].index];
          if (url) window.location.assign(url);
        }
      }
    });
    canvas.setAttribute("data-drawn", "true");
  }

  function init() {
    if (typeof window.Chart !== "undefined") {
      // Axis and legend text in the page's text colour (Chart.js's default grey is below 7:1).
      window.Chart.defaults.color = "#1d2433";
      window.Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
    }
    var canvases = document.querySelectorAll("canvas.outlook-chart");
    for (var i = 0; i < canvases.length; i++) draw(canvases[i]);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
