// The grove console's only script: live follow of a workspace's timeline.
// The server renders every item (escaped); this file only asks for the new ones when
// the workspace's event stream (server-sent events) says something happened, and puts
// them in place. It never builds HTML from data.
"use strict";

(function () {
  const list = document.getElementById("timeline");
  if (!list || typeof EventSource === "undefined") {
    return;
  }
  const workspace = list.dataset.workspace;
  let lastVersion = Number(list.dataset.lastVersion || "0");
  let busy = false;
  let again = false;

  function place(fragment) {
    const holder = document.createElement("template");
    holder.innerHTML = fragment;
    const wrap = holder.content.querySelector(".fragment");
    if (!wrap) {
      return;
    }
    lastVersion = Math.max(lastVersion, Number(wrap.dataset.lastVersion || "0"));
    for (const item of Array.from(wrap.children)) {
      const old = item.id ? document.getElementById(item.id) : null;
      if (old) {
        old.replaceWith(item);
      } else {
        list.appendChild(item);
      }
    }
    const empty = document.getElementById("timeline-empty");
    if (empty && list.querySelector(".item")) {
      empty.remove();
    }
    list.dataset.lastVersion = String(lastVersion);
  }

  async function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    try {
      // Re-read from before the newest running exec, so its finish replaces it.
      const running = list.querySelector(".item.running");
      const from = running ? Number(running.dataset.version) - 1 : lastVersion;
      const url = "/ui/workspaces/" + encodeURIComponent(workspace) + "/timeline?after=" + from;
      const response = await fetch(url, { credentials: "same-origin" });
      if (response.ok) {
        place(await response.text());
      }
    } finally {
      busy = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  const after = list.dataset.lastPosition;
  const source = new EventSource(
    "/ui/workspaces/" + encodeURIComponent(workspace) + "/follow" + (after && after !== "0" ? "?after=" + after : "")
  );
  source.onopen = function () {
    document.getElementById("live").hidden = false;
  };
  source.onmessage = function () {
    refresh();
  };
  source.onerror = function () {
    document.getElementById("live").hidden = true;
  };
})();
