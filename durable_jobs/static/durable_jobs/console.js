// Live progress for the durable_jobs admin: poll the JSON view for the jobs on the page
// and update their progress bars, counts and status badges without reloading. Paused
// while the tab is hidden; stops polling once no job on the page is live.
(function () {
  "use strict";
  var INTERVAL_MS = 2000;
  var timer = null;

  function jobIds() {
    var seen = {};
    document.querySelectorAll("[data-dj-status]").forEach(function (el) {
      if (el.textContent === "pending" || el.textContent === "running") {
        seen[el.getAttribute("data-dj-status")] = true;
      }
    });
    return Object.keys(seen);
  }

  function liveUrl() {
    var path = window.location.pathname;
    var base = path.slice(0, path.indexOf("/durable_jobs/job/") + "/durable_jobs/job/".length);
    return base + "live/";
  }

  function apply(id, job) {
    document.querySelectorAll("[data-dj-status='" + id + "']").forEach(function (el) {
      el.textContent = job.status;
      el.className = "dj-status dj-status-" + job.status;
      var colours = {pending: "#6b7280", running: "#2563eb", completed: "#15803d", failed: "#b91c1c",
                     cancelled: "#92400e"};
      el.style.background = colours[job.status] || "#6b7280";
    });
    document.querySelectorAll("[data-dj-progress='" + id + "']").forEach(function (el) {
      if (job.percent !== null) { el.max = 100; el.value = job.percent; }
      else if (!job.live) { el.remove(); }
    });
    document.querySelectorAll("[data-dj-count='" + id + "']").forEach(function (el) {
      el.textContent = job.total ? job.processed + "/" + job.total : job.processed + " processed";
    });
  }

  function poll() {
    timer = null;
    if (document.hidden) { return; }
    var ids = jobIds();
    if (!ids.length) { return; }
    var query = ids.map(function (id) { return "id=" + encodeURIComponent(id); }).join("&");
    fetch(liveUrl() + "?" + query, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) {
        if (data && data.jobs) {
          Object.keys(data.jobs).forEach(function (id) { apply(id, data.jobs[id]); });
        }
      })
      .catch(function () {})
      .then(schedule);
  }

  function schedule() {
    if (timer === null && !document.hidden) { timer = window.setTimeout(poll, INTERVAL_MS); }
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      if (timer !== null) { window.clearTimeout(timer); timer = null; }
    } else {
      schedule();
    }
  });
  document.addEventListener("DOMContentLoaded", schedule);
})();
