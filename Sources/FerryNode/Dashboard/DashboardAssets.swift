import FerryCore

// The dashboard's page, login form, style and script, built into the binary: the LAN has no
// internet (no CDN, no fonts, no build step). Hand-written: no listed library renders HTML,
// and the script is plain browser JavaScript with no framework. No inline script or style
// anywhere, so the Content-Security-Policy can forbid both.

/// The dashboard's HTML, CSS and JavaScript.
enum DashboardAssets {
    static func escape(_ s: String) -> String {
        s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    static func login(error: String?) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <title>Ferry: log in</title><link rel="icon" href="/favicon.ico" type="image/svg+xml"><link rel="stylesheet" href="/ui/app.css"></head>
        <body class="login"><main>
        <h1>Ferry</h1>
        <form method="post" action="/ui/login" id="login">
        <label for="key">This node's admin key</label>
        <input type="password" id="key" name="key" autocomplete="current-password" autofocus required>
        <button type="submit">Log in</button>
        </form>
        \(error.map { "<p class=\"error\" id=\"login-error\">\(escape($0))</p>" } ?? "")
        <p class="hint">The key is in <code>DATA/admin.key</code>. Or run <code>ferry ui</code> on this machine for a one-time login link.</p>
        </main></body></html>
        """
    }

    static func shell(csrf: String, nodeName: String) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <meta name="csrf-token" content="\(escape(csrf))">
        <title>Ferry: \(escape(nodeName))</title><link rel="icon" href="/favicon.ico" type="image/svg+xml"><link rel="stylesheet" href="/ui/app.css"></head>
        <body>
        <header><span class="brand">Ferry</span> <span id="node-name">\(escape(nodeName))</span>
        <nav id="nav">
        <a href="#mesh" id="nav-mesh">Mesh</a><a href="#replications" id="nav-replications">Replications</a>
        <a href="#conflicts" id="nav-conflicts">Conflicts</a><a href="#documents" id="nav-documents">Documents</a>
        <a href="#group" id="nav-group">Group</a><a href="#health" id="nav-health">Health</a>
        </nav>
        <form method="post" action="/ui/logout" id="logout"><input type="hidden" name="csrf" value="\(escape(csrf))"><button type="submit" id="logout-button">Log out</button></form>
        </header>
        <main id="view" tabindex="-1"></main>
        <p id="status" role="status" aria-live="polite"></p>
        <script src="/ui/app.js"></script>
        </body></html>
        """
    }

    /// The tab's icon (`/favicon.ico`): a hull on a blue disc, as SVG.
    static let icon = """
        <svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><circle cx="16" cy="16" r="15" fill="#1849a9"/>\
        <path d="M6 17h20l-4 7H10z" fill="#fff"/><path d="M15 6v10h2V6z" fill="#fff"/><path d="M17 7l6 8h-6z" fill="#e8eefc"/></svg>
        """

    static let style = """
        :root { --fg: #1d2430; --muted: #5b6675; --line: #d5dbe3; --ok: #1f7a3a; --bad: #b42318; --warn: #b54708; --accent: #1849a9; }
        * { box-sizing: border-box; }
        body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: #f7f9fb; }
        header { display: flex; flex-wrap: wrap; align-items: center; gap: .75rem; padding: .6rem 1rem; background: #fff; border-bottom: 1px solid var(--line); }
        .brand { font-weight: 700; }
        nav { display: flex; flex-wrap: wrap; gap: .25rem; flex: 1; }
        nav a { padding: .35rem .6rem; border-radius: .35rem; color: var(--accent); text-decoration: none; }
        nav a.active, nav a:focus { background: #e8eefc; outline: none; }
        main { padding: 1rem; max-width: 1200px; }
        h1 { font-size: 1.3rem; margin: .2rem 0 1rem; }
        h2 { font-size: 1.1rem; margin: 1.2rem 0 .5rem; }
        table { border-collapse: collapse; width: 100%; background: #fff; }
        th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
        th { font-weight: 600; color: var(--muted); }
        button { font: inherit; padding: .3rem .7rem; border: 1px solid var(--line); border-radius: .35rem; background: #fff; cursor: pointer; }
        button:focus, input:focus, textarea:focus, select:focus { outline: 2px solid var(--accent); }
        input, textarea, select { font: inherit; padding: .3rem .4rem; border: 1px solid var(--line); border-radius: .35rem; }
        textarea { width: 100%; min-height: 12rem; font-family: ui-monospace, monospace; font-size: 13px; }
        pre { background: #fff; border: 1px solid var(--line); padding: .5rem; overflow: auto; font-size: 13px; margin: 0; }
        .ok { color: var(--ok); } .bad { color: var(--bad); } .warn { color: var(--warn); } .muted { color: var(--muted); }
        .error { color: var(--bad); font-weight: 600; }
        .row { display: flex; flex-wrap: wrap; gap: 1rem; }
        .leaf { flex: 1 1 20rem; }
        .diff { background: #fff3c4; }
        .bar { height: .6rem; background: var(--line); border-radius: .3rem; min-width: 6rem; }
        .bar > span { display: block; height: 100%; background: var(--accent); border-radius: .3rem; }
        svg { background: #fff; border: 1px solid var(--line); max-width: 100%; }
        .chart { width: 100%; height: auto; }
        #mesh-graph { height: auto; }
        .login main { max-width: 26rem; margin: 4rem auto; background: #fff; padding: 1.5rem; border: 1px solid var(--line); border-radius: .5rem; }
        .login label, .login input { display: block; width: 100%; margin-bottom: .6rem; }
        .hint { color: var(--muted); font-size: 13px; }
        #status { position: fixed; bottom: 0; right: 1rem; margin: .5rem; }
        .scroll { overflow-x: auto; max-width: 100%; }
        .axis { font-size: 11px; fill: var(--muted); }
        .confirm { background: #fff3c4; padding: .5rem; border: 1px solid var(--warn); border-radius: .35rem; }
        .flag { color: var(--warn); font-weight: 600; margin-left: .4rem; }
        @media (max-width: 700px) { header { gap: .3rem; } main { padding: .5rem; } th, td { padding: .25rem; } }
        @media (max-width: 420px) { body { font-size: 14px; } nav a { padding: .3rem .4rem; } textarea, input[type=text], #rep-url { width: 100%; }
          .scroll > table { min-width: 34rem; } .leaf { flex-basis: 100%; } #status { left: 0; right: 0; } }
        """

    static let script = #"""
        "use strict";
        const csrf = document.querySelector('meta[name="csrf-token"]').content;
        const view = document.getElementById("view");
        const state = { snapshot: null, history: [], docsTicket: 0 };

        function el(tag, attrs, ...children) {
          const e = document.createElement(tag);
          for (const [k, v] of Object.entries(attrs || {})) {
            if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else if (v !== undefined && v !== null) e.setAttribute(k, v);
          }
          for (const c of children.flat()) if (c !== undefined && c !== null) e.append(c instanceof Node ? c : String(c));
          return e;
        }
        function svg(tag, attrs) {
          const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
          for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
          return e;
        }
        function say(text, bad) { const s = document.getElementById("status"); s.textContent = text; s.className = bad ? "bad" : "ok"; }

        async function api(method, path, body) {
          const options = { method, credentials: "same-origin", headers: {} };
          if (method !== "GET") options.headers["X-CSRF-Token"] = csrf;
          // Every POST and PUT carries a JSON body (the admin API takes no other), `{}` when it has nothing to say.
          if (body !== undefined || method === "POST" || method === "PUT") { options.headers["Content-Type"] = "application/json"; options.body = JSON.stringify(body === undefined ? {} : body); }
          const r = await fetch(path, options);
          if (r.status === 401) { location.href = "/ui/login"; throw new Error("logged out"); }
          const text = await r.text();
          let json = null; try { json = JSON.parse(text); } catch (e) {}
          if (!r.ok) { const err = new Error((json && (json.reason || json.error)) || text || r.statusText); err.status = r.status; throw err; }
          return json;
        }

        const short = (id) => (id || "").slice(0, 12);
        const bytes = (n) => n > 1048576 ? (n / 1048576).toFixed(1) + " MiB" : n > 1024 ? (n / 1024).toFixed(1) + " KiB" : Math.round(n) + " B";

        function linkState(p) {
          const r = p.replication || {};
          if (!p.trusted) return ["not trusted", "muted"];
          if (r.error && !r.errorTransient) return ["refused: " + r.error, "bad"];
          if (p.connected) return [r.activity === "busy" ? "connected, syncing" : "connected", "ok"];
          if (r.activity === "offline" || r.error) return ["offline" + (r.error ? ": " + r.error : ""), "warn"];
          return ["offline", "warn"];
        }

        // A member with no live link is offline; a removed one, removed.
        function memberState(o) {
          if (o.member === "removed") return ["removed from the group", "muted"];
          if (o.peer) return linkState(o.peer);
          return ["offline", "warn"];
        }

        function renderMesh() {
          const s = state.snapshot;
          view.replaceChildren(el("h1", {}, "Mesh"));
          if (!s) { view.append(el("p", { class: "muted" }, "Waiting for the node…")); return; }
          const members = (s.group && s.group.members) || [];
          const peers = s.peers || [];
          const ids = new Map();
          for (const m of members) if (m.id !== s.node.id) ids.set(m.id, { id: m.id, name: m.name, member: m.state });
          for (const p of peers) ids.set(p.id, Object.assign(ids.get(p.id) || {}, { id: p.id, name: p.name || (ids.get(p.id) || {}).name, peer: p }));
          const others = [...ids.values()];
          const w = 640, h = 360, r = Math.min(w, h) / 2 - 50;
          const g = svg("svg", { viewBox: `0 0 ${w} ${h}`, width: w, height: h, id: "mesh-graph", role: "img", "aria-label": "mesh graph" });
          // Every node on one circle, this one first: each link is a chord of its own, so none
          // is drawn over another (with this node at the centre, B–C hid A's two links).
          const at = (i) => { const a = (2 * Math.PI * i) / (others.length + 1) - Math.PI / 2; return [w / 2 + r * Math.cos(a), h / 2 + r * Math.sin(a)]; };
          const [cx, cy] = others.length ? at(0) : [w / 2, h / 2];
          others.forEach((o, i) => {
            [o.x, o.y] = at(i + 1);
            const [text, cls] = memberState(o);
            const color = cls === "ok" ? "#1f7a3a" : cls === "bad" ? "#b42318" : cls === "warn" ? "#b54708" : "#98a2b3";
            g.append(svg("line", { x1: cx, y1: cy, x2: o.x, y2: o.y, stroke: color, "stroke-width": 3, "stroke-dasharray": cls === "ok" ? "" : "6 4", "data-peer": o.id, "data-state": text }));
          });
          // The links the peers report of their own (heartbeats): the whole group's mesh.
          const byID = new Map(others.map((o) => [o.id, o]));
          const drawn = new Set();
          for (const o of others) for (const to of ((o.peer || {}).links || [])) {
            const t = byID.get(to); const key = [o.id, to].sort().join(" ");
            if (!t || drawn.has(key)) continue; drawn.add(key);
            g.append(svg("line", { x1: o.x, y1: o.y, x2: t.x, y2: t.y, stroke: "#98a2b3", "stroke-width": 1.5, "data-link": key }));
          }
          const node = (x, y, label, fill) => { g.append(svg("circle", { cx: x, cy: y, r: 18, fill, stroke: "#1d2430" })); const t = svg("text", { x, y: y + 34, "text-anchor": "middle", "font-size": 13 }); t.textContent = label; g.append(t); };
          node(cx, cy, (s.node.name || short(s.node.id)) + " (this node)", "#e8eefc");
          for (const o of others) node(o.x, o.y, o.name || short(o.id), "#fff");
          view.append(g);
          const rows = others.map((o) => {
            const p = o.peer || {}; const rep = p.replication || {};
            const before = ((state.previous || {}).peers || []).find((x) => x.id === o.id);
            const dt = state.previous ? Math.max(0.001, s.time - state.previous.time) : 0;
            const rateOf = (k) => before && before.replication && rep[k] !== undefined ? Math.max(0, (rep[k] - before.replication[k]) / dt) : 0;
            const behind = rep.total > rep.completed ? (rep.total - rep.completed) + " behind" : rep.activity ? "in step" : "-";
            const [text, cls] = memberState(o);
            return el("tr", { "data-peer": o.id }, el("td", {}, o.name || "-"), el("td", {}, el("code", {}, short(o.id))),
              el("td", { class: cls, "data-state": text }, text), el("td", {}, p.dialled ? "dialled" : p.connected ? "dialled us" : "-"),
              el("td", {}, rep.activity || "-"), el("td", {}, p.digestMatches === true ? "equal" : p.digestMatches === false ? "differs" : "unknown"),
              el("td", {}, behind),
              el("td", {}, rep.bytesSent !== undefined ? bytes(rateOf("bytesSent")) + "/s / " + bytes(rateOf("bytesReceived")) + "/s" : "-"));
          });
          view.append(el("div", { class: "scroll" }, el("table", { id: "peers" }, el("tr", {}, ["Name", "ID", "Link", "Direction", "Activity", "Digest", "Behind", "Sent / received"].map((t) => el("th", {}, t))), rows)));
        }

        async function renderReplications() {
          const r = await api("GET", "/replications");
          view.replaceChildren(el("h1", {}, "Replications"));
          const act = (x, what, label) => el("button", { "data-action": what, onclick: async () => {
            try { await api(what === "remove" ? "DELETE" : "POST", "/replications/" + encodeURIComponent(x.id) + (what === "remove" ? "" : "/" + what)); say(label + ": " + x.id); renderReplications(); }
            catch (err) { say(err.message, true); } } }, label);
          const actions = (x) => [x.paused ? act(x, "resume", "Resume") : act(x, "pause", "Pause"), " ", act(x, "reset", "Reset checkpoint"),
            " ", x.source === "api" ? act(x, "remove", "Remove") : el("span", { class: "muted" }, "(config)")];
          // Progress: documents, and blob bytes once large blobs stream.
          const progress = (st) => {
            const pct = st.total ? Math.min(100, Math.round((100 * st.completed) / st.total)) : (st.activity === "idle" ? 100 : 0);
            const bar = el("div", { class: "bar", title: pct + "% of documents" }, el("span")); bar.firstChild.style.width = pct + "%";
            const blobTotal = (st.blobBytesToReceive || 0) + (st.blobBytesToSend || 0);
            const blobDone = (st.blobBytesReceived || 0) + (st.blobBytesSent || 0);
            const cell = el("td", {}, bar);
            if (blobTotal > 0) { const b = el("div", { class: "bar", title: bytes(blobDone) + " of " + bytes(blobTotal) + " of blobs" }, el("span")); b.firstChild.style.width = Math.min(100, Math.round((100 * blobDone) / blobTotal)) + "%"; cell.append(b, el("span", { class: "muted" }, bytes(blobDone) + " of " + bytes(blobTotal))); }
            return cell;
          };
          // The counters `ferry status` shows.
          const counters = (st) => el("td", { "data-counters": "" }, "pushed " + (st.pushed || 0) + ", pulled " + (st.pulled || 0) + ", rejected " + (st.rejected || 0) + "; " + bytes(st.bytesSent || 0) + " sent, " + bytes(st.bytesReceived || 0) + " received");
          const rows = (r.replications || []).map((x) => {
            const st = x.status || {};
            return el("tr", { "data-replication": x.id }, el("td", {}, x.id), el("td", {}, x.url || x.peer || "-"), el("td", {}, x.paused ? "paused" : st.activity || "-"), progress(st),
              counters(st), el("td", { class: st.error ? "bad" : "" }, st.error || "-"),
              el("td", {}, actions(x)));
          });
          view.append(el("div", { class: "scroll" }, el("table", { id: "replications" }, el("tr", {}, ["ID", "Target", "Activity", "Progress", "Counters", "Last error", ""].map((t) => el("th", {}, t))), rows)));
          // The links with peers: this node's own, or the peer's to it.
          const peers = ((await api("GET", "/peers")).peers || []).filter((p) => p.replication);
          const links = peers.map((p) => { const st = p.replication || {};
            return el("tr", { "data-link": p.id }, el("td", {}, p.name || short(p.id)), el("td", {}, p.direction || "-"), el("td", {}, st.activity || "-"), progress(st), counters(st),
              el("td", { class: st.error ? "bad" : "" }, st.error || "-")); });
          view.append(el("h2", {}, "Peer links"), links.length ? el("div", { class: "scroll" }, el("table", { id: "links" }, el("tr", {}, ["Peer", "Direction", "Activity", "Progress", "Counters", "Last error"].map((t) => el("th", {}, t))), links))
            : el("p", { class: "muted", id: "no-links" }, "No peer link yet."));
          const url = el("input", { id: "rep-url", placeholder: "http://127.0.0.1:5984/db", size: 40, "aria-label": "CouchDB database URL" });
          const cred = el("input", { id: "rep-credentials", placeholder: "credentials file (optional)", "aria-label": "credentials file" });
          const dir = el("select", { id: "rep-direction", "aria-label": "direction" }, ["pushAndPull", "push", "pull"].map((d) => el("option", { value: d }, d)));
          const form = el("form", { onsubmit: async (e) => { e.preventDefault();
            const body = { url: url.value, direction: dir.value, continuous: true }; if (cred.value) body.credentialsFile = cred.value;
            try { await api("POST", "/replications", body); say("replication added"); renderReplications(); } catch (err) { say(err.message, true); } } },
            url, " ", dir, " ", cred, " ", el("button", { type: "submit", id: "rep-add" }, "Add a CouchDB replication"));
          view.append(el("h2", {}, "Add"), form);
        }

        function keysDiffer(a, b, k) { return JSON.stringify((a || {})[k]) !== JSON.stringify((b || {})[k]); }

        async function renderConflicts() {
          const r = await api("GET", "/conflicts");
          view.replaceChildren(el("h1", {}, "Conflicts"));
          if (!r.conflicts.length) { view.append(el("p", { id: "no-conflicts" }, "No conflicts.")); return; }
          for (const c of r.conflicts) {
            const leaves = c.leaves;
            const boxes = leaves.map((leaf) => {
              const others = leaves.filter((l) => l !== leaf);
              const lines = Object.keys(leaf.body || {}).sort().map((k) => el("div", { class: others.some((o) => keysDiffer(leaf.body, o.body, k)) ? "diff" : "" }, k + ": " + JSON.stringify(leaf.body[k])));
              // Asks first, naming what goes: the other leaves are deleted (their edits are lost).
              const ask = el("div", { class: "confirm", "data-confirm": leaf.rev, hidden: "" },
                el("p", {}, "Keep " + leaf.rev.slice(0, 18) + " and delete " + (others.length === 1 ? "the other version" : "the " + others.length + " other versions") + " of " + c.id + ": ",
                  others.flatMap((o, i) => [i ? ", " : "", el("code", {}, o.rev.slice(0, 18))]), ". Their edits are lost."),
                el("button", { "data-discard": leaf.rev, onclick: async () => {
                  try { for (const o of others) await api("DELETE", "/docs/" + encodeURIComponent(c.id) + "?rev=" + encodeURIComponent(o.rev));
                    say("kept " + leaf.rev + " of " + c.id); renderConflicts(); } catch (err) { say(err.message, true); } } }, "Delete " + (others.length === 1 ? "it" : "them")),
                " ", el("button", { "data-cancel": leaf.rev, onclick: () => { ask.hidden = true; keep.focus(); } }, "Cancel"));
              const keep = el("button", { "data-keep": leaf.rev, onclick: () => { ask.hidden = false; ask.querySelector("button").focus(); } }, "Keep this one");
              return el("div", { class: "leaf" }, el("p", {}, el("code", {}, leaf.rev.slice(0, 18)), leaf.winner ? " (winner)" : ""), el("pre", {}, lines), keep, ask);
            });
            const resolve = (name) => el("button", { "data-resolver": name, onclick: async () => {
              try { const r = await api("POST", "/conflicts/resolve", { id: c.id, resolver: name }); say(name + " resolved " + c.id + " as " + (r.rev || "").slice(0, 12)); renderConflicts(); }
              catch (err) { say(err.message, true); } } }, name === "merge" ? "Merge all" : "Last writer wins");
            view.append(el("section", { "data-conflict": c.id }, el("h2", {}, c.id), el("div", { class: "row" }, boxes),
              el("p", {}, "Or resolve with a resolver: ", resolve("merge"), " ", resolve("lastWriteWins"))));
          }
        }

        async function renderDocuments() {
          view.replaceChildren(el("h1", {}, "Documents"));
          const prefix = el("input", { id: "doc-prefix", placeholder: "ID prefix", "aria-label": "ID prefix" });
          const list = el("table", { id: "documents" });
          const load = async () => {
            // One request per keystroke: only the answer to the latest may draw the list.
            const ticket = ++state.docsTicket;
            const [r, c] = await Promise.all([api("GET", "/docs?limit=200" + (prefix.value ? "&prefix=" + encodeURIComponent(prefix.value) : "")), api("GET", "/conflicts")]);
            if (ticket !== state.docsTicket) return;
            const rows = r.rows || [];
            const conflicted = new Set((c.conflicts || []).map((x) => x.id));
            // Spread: replaceChildren takes nodes, not arrays (it would print one as text).
            list.replaceChildren(el("tr", {}, el("th", {}, "ID"), el("th", {}, "Revision")),
              ...rows.map((d) => el("tr", { "data-row": d.id }, el("td", {}, el("a", { href: "#doc/" + encodeURIComponent(d.id), "data-doc": d.id }, d.id),
                conflicted.has(d.id) ? el("a", { class: "flag", href: "#conflicts", "data-conflicted": d.id }, "in conflict") : null),
                el("td", {}, el("code", {}, d.rev.slice(0, 18))))));
          };
          prefix.addEventListener("input", load);
          // A new document: its ID and JSON body, stored as its first revision.
          const newID = el("input", { id: "new-id", type: "text", placeholder: "new document ID", "aria-label": "new document ID" });
          const newBody = el("textarea", { id: "new-body", "aria-label": "new document JSON" }); newBody.value = "{}"; newBody.style.minHeight = "4rem";
          const created = el("p", { id: "new-message" });
          const create = el("form", { id: "new-doc", onsubmit: async (e) => { e.preventDefault();
            let parsed; try { parsed = JSON.parse(newBody.value); } catch (err) { created.textContent = "Not JSON: " + err.message; created.className = "error"; return; }
            if (!newID.value) { created.textContent = "Give the document an ID."; created.className = "error"; return; }
            try { const r = await api("PUT", "/docs/" + encodeURIComponent(newID.value), parsed); created.textContent = "Created " + newID.value + " as " + r.rev; created.className = "ok"; await load(); }
            catch (err) { created.className = "error"; created.textContent = (err.status === 409 ? "Not created: " + newID.value + " exists already. " : "Not created: ") + err.message; } } },
            newID, " ", el("button", { type: "submit", id: "new-create" }, "Create"), newBody, created);
          const query = el("textarea", { id: "mango", "aria-label": "Mango query" }); query.value = '{"selector": {}, "limit": 20}';
          const results = el("div", { id: "mango-results" });
          const run = el("button", { id: "mango-run", onclick: async () => {
            try { const r = await api("POST", "/find", JSON.parse(query.value));
              const idx = r.index ? (r.index.ddoc ? r.index.ddoc + "/" : "") + r.index.name : "none";
              results.replaceChildren(el("p", { id: "mango-index" }, "Index used: " + idx + "; " + r.docs.length + " documents"),
                el("pre", { id: "mango-docs" }, JSON.stringify(r.docs, null, 2)));
            } catch (err) { results.replaceChildren(el("p", { class: "error" }, err.message)); } } }, "Run query");
          view.append(el("p", {}, prefix), el("div", { class: "scroll" }, list), el("h2", {}, "New document"), create, el("h2", {}, "Mango query"), query, run, results);
          await load();
        }

        async function renderDocument(id) {
          view.replaceChildren(el("h1", {}, id));
          let doc;
          try { doc = await api("GET", "/docs/" + encodeURIComponent(id) + "?conflicts=true"); } catch (err) { view.append(el("p", { class: "error" }, err.message)); return; }
          const rev = doc._rev; const body = Object.assign({}, doc);
          for (const k of ["_id", "_rev", "_conflicts", "_deleted"]) delete body[k];
          const editor = el("textarea", { id: "doc-editor", "aria-label": "document JSON" }); editor.value = JSON.stringify(body, null, 2);
          const message = el("p", { id: "doc-message" });
          const save = el("button", { id: "doc-save", onclick: async () => {
            let parsed; try { parsed = JSON.parse(editor.value); } catch (err) { message.textContent = "Not JSON: " + err.message; message.className = "error"; return; }
            try { const r = await api("PUT", "/docs/" + encodeURIComponent(id) + "?rev=" + encodeURIComponent(rev), parsed);
              message.textContent = "Saved as " + r.rev; message.className = "ok"; setTimeout(() => renderDocument(id), 400);
            } catch (err) {
              message.className = "error";
              message.textContent = err.status === 409 ? "Not saved: the document changed since you opened it (stale revision " + rev.slice(0, 12) + "). Reload it to edit the current revision." : "Not saved: " + err.message;
            } } }, "Save");
          // Attachments: blob references anywhere in the body, each with a download link; an upload
          // stores the file as a blob and saves the document with it under "attachments".
          const refs = [];
          (function walk(v, path) {
            if (v && typeof v === "object") {
              if (v["@type"] === "blob" && v.digest) refs.push([path, v]);
              else for (const [k, x] of Object.entries(v)) walk(x, path ? path + "." + k : k);
            }
          })(body, "");
          const file = el("input", { type: "file", id: "attach-file", "aria-label": "file to attach" });
          const attach = el("button", { id: "attach", onclick: async () => {
            const f = file.files[0]; if (!f) { message.textContent = "Choose a file first."; message.className = "error"; return; }
            try {
              const r = await fetch("/blobs", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf, "Content-Type": f.type || "application/octet-stream" }, body: f });
              const ref = await r.json(); if (!r.ok) throw new Error(ref.reason || r.statusText);
              const next = Object.assign({}, body); next.attachments = Object.assign({}, body.attachments || {}); next.attachments[f.name] = ref;
              const saved = await api("PUT", "/docs/" + encodeURIComponent(id) + "?rev=" + encodeURIComponent(rev), next);
              message.textContent = "Attached " + f.name + "; saved as " + saved.rev; message.className = "ok"; setTimeout(() => renderDocument(id), 400);
            } catch (err) { message.className = "error"; message.textContent = (err.status === 409 ? "Not saved (stale revision): " : "Not attached: ") + err.message; } } }, "Attach");
          const attachments = el("ul", { id: "attachments" }, refs.map(([path, ref]) => el("li", {},
            el("a", { href: "/blobs/" + ref.digest, download: path.split(".").pop() || ref.digest, "data-digest": ref.digest }, path), " (" + bytes(ref.length) + ")")));
          // The revision tree, children under their parents; leaves and the winner marked.
          const tree = await api("GET", "/docs/" + encodeURIComponent(id) + "?tree=true");
          const children = new Map();
          for (const r of tree.revisions) { const k = r.parent || ""; if (!children.has(k)) children.set(k, []); children.get(k).push(r); }
          const branch = (parent) => el("ul", {}, (children.get(parent) || []).map((r) => el("li", { "data-rev": r.rev },
            el("code", {}, r.rev.slice(0, 20)), r.winner ? " winner" : r.leaf ? " leaf" : "", r.deleted ? " (deleted)" : "", r.bodyKept ? "" : " (body not kept)",
            children.has(r.rev) ? branch(r.rev) : null)));
          const roots = tree.revisions.filter((r) => !r.parent || !tree.revisions.some((x) => x.rev === r.parent)).map((r) => r.parent || "");
          const history = el("div", { id: "doc-revisions" }, [...new Set(roots)].map(branch));
          // Deleting names the revision it deletes (a stale one is refused, as a stale save is).
          const sure = el("span", { class: "confirm", id: "doc-delete-confirm", hidden: "" }, "Delete " + id + " at " + rev.slice(0, 18) + "? ",
            el("button", { id: "doc-delete-yes", onclick: async () => {
              try { await api("DELETE", "/docs/" + encodeURIComponent(id) + "?rev=" + encodeURIComponent(rev)); say("deleted " + id); location.hash = "documents"; }
              catch (err) { message.className = "error"; message.textContent = (err.status === 409 ? "Not deleted: the document changed since you opened it. " : "Not deleted: ") + err.message; } } }, "Delete"),
            " ", el("button", { id: "doc-delete-no", onclick: () => { sure.hidden = true; } }, "Cancel"));
          const remove = doc._deleted ? null : el("button", { id: "doc-delete", onclick: () => { sure.hidden = false; sure.querySelector("button").focus(); } }, "Delete…");
          view.append(el("p", {}, el("a", { href: "#documents" }, "← Documents")), editor, save, " ", remove, " ", sure, message,
            el("h2", {}, "Attachments"), attachments, el("p", {}, file, " ", attach), el("h2", {}, "Revisions"), history);
        }

        async function renderGroup() {
          const g = await api("GET", "/group");
          view.replaceChildren(el("h1", {}, "Group"));
          if (!g.group) { view.append(el("p", {}, "This node belongs to no group yet: inviting a node founds one.")); }
          const rows = (g.members || []).map((m) => el("tr", { "data-member": m.id }, el("td", {}, m.name || "-"), el("td", {}, el("code", {}, short(m.id))),
            el("td", {}, m.admin ? "admin" : "member"), el("td", {}, m.state + (m.founder ? " (founder)" : "")),
            el("td", {}, g.admin && !m.founder && m.state === "member" && m.id !== g.self ? el("button", { onclick: async () => {
              if (!confirm("Remove " + (m.name || short(m.id)) + " from the group?")) return;
              try { await api("DELETE", "/group/members/" + m.id); say("removed"); renderGroup(); } catch (err) { say(err.message, true); } } }, "Remove") : "")));
          view.append(el("div", { class: "scroll" }, el("table", { id: "members" }, el("tr", {}, ["Name", "ID", "Role", "State", ""].map((t) => el("th", {}, t))), rows)));
          const code = el("p", { id: "invite-code" });
          view.append(el("h2", {}, "Invite"), el("button", { id: "invite", onclick: async () => {
            try { const r = await api("POST", "/group/invitations", {}); code.replaceChildren("Code (single use, expires " + (r.expires || "soon") + "): ", el("code", {}, r.code)); }
            catch (err) { say(err.message, true); } } }, "Invite a node"), code);
          const trust = await api("GET", "/trust");
          view.append(el("h2", {}, "Trust and policies"), el("div", { class: "scroll" }, el("table", { id: "trust" }, el("tr", {}, ["Name", "ID", "Source", "Policy"].map((t) => el("th", {}, t))),
            (trust.trusted || []).map((t) => el("tr", {}, el("td", {}, t.name || "-"), el("td", {}, el("code", {}, short(t.id))), el("td", {}, t.source || "-"), el("td", {}, JSON.stringify(t.policy || "all")))))));
        }

        // A line over the last minute or so: a value axis (0 and the largest, in the unit) on the
        // left, a time axis (seconds ago to now) below.
        function chart(id, label, values, format, span) {
          const w = 600, h = 130, left = 64, bottom = 22, top = 22, max = Math.max(1, ...values);
          const g = svg("svg", { viewBox: `0 0 ${w} ${h}`, class: "chart", id, role: "img", "aria-label": label + ", last " + Math.round(span) + " s" });
          const y = (v) => h - bottom - ((h - bottom - top) * v) / max;
          const text = (x, yy, s, attrs) => { const t = svg("text", Object.assign({ x, y: yy, class: "axis" }, attrs || {})); t.textContent = s; g.append(t); };
          g.append(svg("line", { x1: left, y1: top, x2: left, y2: h - bottom, stroke: "#98a2b3", class: "y-axis" }));
          g.append(svg("line", { x1: left, y1: h - bottom, x2: w - 4, y2: h - bottom, stroke: "#98a2b3", class: "x-axis" }));
          text(left - 4, y(max) + 4, format(max), { "text-anchor": "end", "data-axis": "max" });
          text(left - 4, y(0) + 4, format(0), { "text-anchor": "end", "data-axis": "zero" });
          text(left, h - 6, "−" + Math.round(span) + " s", { "data-axis": "from" });
          text(w - 4, h - 6, "now", { "text-anchor": "end", "data-axis": "to" });
          const pts = values.map((v, i) => `${left + (i * (w - 4 - left)) / Math.max(1, values.length - 1)},${y(v)}`).join(" ");
          g.append(svg("polyline", { points: pts, fill: "none", stroke: "#1849a9", "stroke-width": 2 }));
          const t = svg("text", { x: left + 6, y: 15, "font-size": 13 }); t.textContent = label + ": " + format(values[values.length - 1] || 0); g.append(t);
          return g;
        }

        function renderHealth() {
          view.replaceChildren(el("h1", {}, "Health"));
          const s = state.snapshot; if (!s) return;
          const hist = state.history;
          const rate = (key) => hist.map((x, i) => i === 0 ? 0 : Math.max(0, (x.m[key] - hist[i - 1].m[key]) / Math.max(0.001, x.t - hist[i - 1].t)));
          const writes = rate("ferry_last_sequence");
          const span = hist.length > 1 ? hist[hist.length - 1].t - hist[0].t : 0;
          const sent = rate("ferry_bytes_sent_total"), received = rate("ferry_bytes_received_total");
          view.append(el("table", { id: "health" },
            el("tr", {}, el("th", {}, "Version"), el("td", {}, s.node.version)),
            el("tr", {}, el("th", {}, "Documents"), el("td", {}, s.node.docCount)),
            el("tr", {}, el("th", {}, "Data size"), el("td", {}, bytes(s.metrics.ferry_store_size_bytes || 0))),
            el("tr", {}, el("th", {}, "Disk free"), el("td", {}, bytes(s.metrics.freeBytes || 0))),
            el("tr", {}, el("th", {}, "Access rules"), el("td", {}, s.node.access ? s.node.access.version : "none"))),
            chart("chart-writes", "writes/s", writes, (v) => v.toFixed(1) + "/s", span),
            chart("chart-bytes", "bytes/s sent and received", sent.map((v, i) => v + received[i]), (v) => bytes(v) + "/s", span),
            chart("chart-peers", "peers connected", hist.map((x) => x.m.ferry_connected_peers || 0), (v) => String(v), span));
        }

        const routes = { mesh: renderMesh, replications: renderReplications, conflicts: renderConflicts, documents: renderDocuments, group: renderGroup, health: renderHealth };
        async function route() {
          const hash = location.hash.slice(1) || "mesh";
          for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === "#" + hash.split("/")[0]);
          try {
            if (hash.startsWith("doc/")) await renderDocument(decodeURIComponent(hash.slice(4)));
            else await (routes[hash] || renderMesh)();
          } catch (err) { if (err.message !== "logged out") view.replaceChildren(el("p", { class: "error" }, err.message)); }
        }
        window.addEventListener("hashchange", route);

        const events = new EventSource("/ui/events");
        events.onmessage = (e) => {
          state.previous = state.snapshot;
          state.snapshot = JSON.parse(e.data);
          state.history.push({ t: state.snapshot.time, m: state.snapshot.metrics });
          if (state.history.length > 60) state.history.shift();
          const hash = location.hash.slice(1) || "mesh";
          if (hash === "mesh") renderMesh(); else if (hash === "health") renderHealth();
        };
        route();
        """#
}
