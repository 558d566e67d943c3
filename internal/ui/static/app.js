// sandkeep dashboard: live updates over server-sent events, and a confirmation before removing a sandbox.
// Everything works without this file except the live parts; text from the server is set with textContent.
"use strict";
document.documentElement.classList.add("js");

function showLive(on) {
  document.querySelectorAll("[data-live-indicator]").forEach(function (el) { el.hidden = !on; });
}

function liveEvents(list) {
  var es = new EventSource(list.dataset.liveEvents);
  es.onopen = function () { showLive(true); };
  es.onerror = function () { showLive(false); };
  es.addEventListener("ev", function (msg) {
    var d = JSON.parse(msg.data);
    if (list.querySelector('[data-seq="' + d.seq + '"]')) return;
    var li = document.createElement("li");
    li.dataset.seq = d.seq;
    if (d.class) li.classList.add(d.class);
    li.classList.add("new");
    var t = document.createElement("time"); t.textContent = d.stamp;
    var off = document.createElement("span"); off.className = "muted"; off.textContent = d.offset;
    var name = document.createElement("strong"); name.textContent = d.name;
    var sum = document.createElement("span"); sum.className = "summary"; sum.textContent = d.summary;
    li.append(t, " ", off, " ", name, " ", sum);
    list.append(li);
    var none = document.querySelector("[data-no-events]");
    if (none) none.remove();
  });
  es.addEventListener("done", function (msg) {
    var d = JSON.parse(msg.data);
    var pill = document.querySelector("[data-run-status]");
    if (pill) {
      pill.textContent = d.status;
      pill.className = "pill " + (d.status === "succeeded" ? "ok" : d.status === "failed" ? "bad" : "warn");
    }
    es.close();
    showLive(false);
  });
  es.addEventListener("signedout", function () { es.close(); showLive(false); });
}

function liveRows(body) {
  var es = new EventSource(body.dataset.liveRows);
  es.onopen = function () { showLive(true); };
  es.onerror = function () { showLive(false); };
  // The rows are HTML the server rendered from its own template, escaped there.
  es.addEventListener("rows", function (msg) { body.innerHTML = msg.data; });
  es.addEventListener("signedout", function () { es.close(); showLive(false); });
}

document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-live-events]").forEach(liveEvents);
  document.querySelectorAll("[data-live-rows]").forEach(liveRows);
  document.addEventListener("submit", function (e) {
    var msg = e.target.dataset && e.target.dataset.confirm;
    if (msg && !window.confirm(msg)) e.preventDefault();
  });
});
