// Live progress for the durable_jobs admin: poll the JSON view for the jobs on the page
// and update their progress bars, counts and status badges without reloading. Paused
// while the tab is hidden; stops polling once no job on the page is live. The badge
// shows the word the server chose (console.display.display_status); console.css colours it.
// Also: the change list's copy buttons put a job's full id on the clipboard.
(function () {
  "use strict";
  var INTERVAL_MS = 2000;
  var timer = null;

  function jobIds() {
    var seen = {};
    document.querySelectorAll("[data-dj-status][data-dj-live='true']").forEach(function (el) {
      seen[el.getAttribute("data-dj-status")] = true;
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
      if (el.textContent !== job.status) { el.removeAttribute("title"); }  // it explained the old word
      el.textContent = job.status;
      el.className = "dj-status dj-status-" + job.status.replace(/ /g, "-");
      el.setAttribute("data-dj-live", job.live ? "true" : "false");
    });
    document.querySelectorAll("[data-dj-progress='" + id + "']").forEach(function (el) {
      if (job.percent !== null) { el.max = 100; el.value = job.percent; }
      else if (!job.live) { el.remove(); }
    });
    document.querySelectorAll("[data-dj-count='" + id + "']").forEach(function (el) {
      // Thousands separated as the server writes them (f"{n:,}").
      var n = function (value) { return Number(value).toLocaleString("en-US"); };
      el.textContent = job.total ? n(job.processed) + "/" + n(job.total) : n(job.processed) + " processed";
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
  function copied(button) {
    button.classList.add("dj-copied");
    button.textContent = "copied";
    window.setTimeout(function () { button.classList.remove("dj-copied"); button.textContent = "copy"; },
                      1500);
  }

  function copyFallback(text, button) {
    // No clipboard API (a page served over plain HTTP to another host): select a copy.
    var field = document.createElement("textarea");
    field.value = text;
    field.setAttribute("readonly", "");
    field.style.position = "fixed";
    field.style.opacity = "0";
    document.body.appendChild(field);
    field.select();
    try { if (document.execCommand("copy")) { copied(button); } } catch (e) {}
    document.body.removeChild(field);
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-dj-copy]") : null;
    if (!button) { return; }
    event.preventDefault();
    var text = button.getAttribute("data-dj-copy");
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { copied(button); },
                                               function () { copyFallback(text, button); });
    } else {
      copyFallback(text, button);
    }
  });
  document.addEventListener("DOMContentLoaded", schedule);
})();
