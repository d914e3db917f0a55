// The wellspring status page: reads the public status API of this origin every 20 s and renders it with DOM
// calls only (no innerHTML: incident text is operator input). Served under a CSP without inline script.
"use strict";

(() => {
  const REFRESH_MS = 20_000;
  const MODEL_LABELS = { ok: "정상", degraded: "성능 저하", down: "장애", idle: "유휴" };
  const INCIDENT_LABELS = { investigating: "조사 중", identified: "원인 확인", monitoring: "모니터링 중", resolved: "해결됨" };
  const SVG = "http://www.w3.org/2000/svg";
  const number = new Intl.NumberFormat("ko-KR");
  const decimal = new Intl.NumberFormat("ko-KR", { maximumFractionDigits: 1 });
  const kst = new Intl.DateTimeFormat("ko-KR", {
    timeZone: "Asia/Seoul", month: "long", day: "numeric", hour: "numeric", minute: "2-digit"
  });
  const kstClock = new Intl.DateTimeFormat("ko-KR", {
    timeZone: "Asia/Seoul", hour: "numeric", minute: "2-digit", second: "2-digit"
  });

  const $ = (id) => document.getElementById(id);
  const el = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  };
  const clear = (node) => { while (node.firstChild) node.removeChild(node.firstChild); };
  const known = (labels, value) => (Object.prototype.hasOwnProperty.call(labels, value) ? value : null);

  const badge = (labels, status) => {
    const key = known(labels, status);
    return el("span", `badge badge-${key ?? "idle"}`, key ? labels[key] : String(status));
  };

  const tokens = (n) => {
    if (n >= 100_000_000) return `${decimal.format(n / 100_000_000)}억`;
    if (n >= 10_000) return `${decimal.format(n / 10_000)}만`;
    return number.format(n);
  };

  /** An SVG polyline of the seven buckets, scaled to the largest. */
  const sparkline = (values, status) => {
    const width = 112;
    const height = 32;
    const pad = 3;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("class", `spark spark-${known(MODEL_LABELS, status) ?? "idle"}`);
    svg.setAttribute("role", "img");
    const list = Array.isArray(values) ? values.map((v) => (Number.isFinite(v) ? v : 0)) : [];
    const title = document.createElementNS(SVG, "title");
    title.textContent = `10분 단위 초당 출력 토큰: ${list.map((v) => decimal.format(v)).join(", ")}`;
    svg.appendChild(title);
    const base = document.createElementNS(SVG, "line");
    base.setAttribute("class", "base");
    base.setAttribute("x1", "0");
    base.setAttribute("x2", String(width));
    base.setAttribute("y1", String(height - pad));
    base.setAttribute("y2", String(height - pad));
    svg.appendChild(base);
    if (list.length > 1) {
      const max = Math.max(...list, 0);
      const points = list.map((v, i) => {
        const x = (i / (list.length - 1)) * (width - 2 * pad) + pad;
        const y = height - pad - (max > 0 ? (v / max) * (height - 2 * pad) : 0);
        return `${x.toFixed(1)},${y.toFixed(1)}`;
      });
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", points.join(" "));
      svg.appendChild(line);
    }
    return svg;
  };

  const cell = (label, className) => {
    const td = el("td", className);
    td.dataset.label = label;
    return td;
  };

  const renderFleet = (fleet) => {
    const body = $("fleet").querySelector("tbody");
    clear(body);
    for (const model of fleet.models ?? []) {
      const tr = el("tr");
      tr.dataset.model = model.id;
      tr.dataset.status = model.status;
      const name = cell("모델", "name-cell");
      name.appendChild(el("span", "model-name", model.display_name ?? model.id));
      if (model.display_name && model.display_name !== model.id) name.appendChild(el("span", "model-id", model.id));
      tr.appendChild(name);
      const status = cell("상태");
      status.appendChild(badge(MODEL_LABELS, model.status));
      tr.appendChild(status);
      const spark = cell("최근 70분 출력");
      spark.appendChild(sparkline(model.sparkline, model.status));
      tr.appendChild(spark);
      tr.appendChild(Object.assign(cell("생성 속도", "num"), {
        textContent: model.tps == null ? "-" : `${decimal.format(model.tps)} 토큰/초`
      }));
      tr.appendChild(Object.assign(cell("첫 응답", "num"), {
        textContent: model.ttfb_ms == null ? "-" : `${number.format(model.ttfb_ms)}ms`
      }));
      tr.appendChild(Object.assign(cell("최대 입력", "num"), { textContent: `${tokens(model.max_input_tokens)} 토큰` }));
      body.appendChild(tr);
    }
    if ((fleet.models ?? []).length === 0) {
      const tr = el("tr");
      const td = el("td", "empty", "표시할 모델이 없습니다.");
      td.colSpan = 6;
      tr.appendChild(td);
      body.appendChild(tr);
    }

    const disabled = $("disabled");
    const list = disabled.querySelector("ul");
    clear(list);
    for (const model of fleet.disabled ?? []) {
      list.appendChild(el("li", null, model.note ? `${model.displayName} — ${model.note}` : model.displayName));
    }
    disabled.hidden = (fleet.disabled ?? []).length === 0;

    const images = $("images");
    if (fleet.images) {
      images.textContent = `이미지 생성: 작업 서버 ${number.format(fleet.images.workers_online)}대 연결 · 대기 중인 요청 ${number.format(fleet.images.queue_depth)}건`;
      images.hidden = false;
    } else {
      images.hidden = true;
    }
  };

  const quotaRow = (label, used, limit, className) => {
    const row = el("div", `quota-row ${className ?? ""}`.trim());
    const head = el("div", "quota-head");
    const pct = limit > 0 ? Math.min(100, (used / limit) * 100) : 0;
    head.appendChild(el("span", null, label));
    head.appendChild(el("span", null, `${tokens(used)} / ${tokens(limit)} 토큰 (${decimal.format(pct)}%)`));
    row.appendChild(head);
    const bar = el("div", `bar${pct >= 100 ? " full" : pct >= 80 ? " high" : ""}`);
    bar.setAttribute("role", "progressbar");
    bar.setAttribute("aria-valuemin", "0");
    bar.setAttribute("aria-valuemax", "100");
    bar.setAttribute("aria-valuenow", String(Math.round(pct)));
    bar.setAttribute("aria-label", `${label} 사용률`);
    const fill = el("span");
    fill.style.width = `${pct}%`;
    bar.appendChild(fill);
    row.appendChild(bar);
    return row;
  };

  const renderQuota = (quota, names) => {
    const box = $("quota");
    clear(box);
    const models = Object.entries(quota.models ?? {});
    if (models.length === 0) {
      box.appendChild(el("p", "empty", "일일 한도가 설정된 모델이 없습니다."));
    } else {
      box.appendChild(quotaRow("전체", quota.global.used, quota.global.limit, "quota-total"));
      for (const [id, q] of models) box.appendChild(quotaRow(names.get(id) ?? id, q.used, q.limit));
    }
    $("reset").textContent = quota.global?.reset_at ? ` (다음 초기화: ${kst.format(new Date(quota.global.reset_at))})` : "";
  };

  const renderServer = (server) => {
    const box = $("server");
    clear(box);
    const stat = (label, value) => {
      const div = el("div");
      div.appendChild(el("dt", null, label));
      div.appendChild(el("dd", null, value));
      box.appendChild(div);
    };
    stat("활성 사용자 (24시간)", `${number.format(server.users)}명`);
    stat("현재 처리량", `${decimal.format(server.tps)} 토큰/초`);
    stat("누적 요청", `${tokens(server.allTime?.requests ?? 0)}건`);
    stat("누적 토큰", tokens(server.allTime?.tokens ?? 0));
  };

  const renderIncidents = (data) => {
    const list = $("incidents");
    clear(list);
    if ((data.incidents ?? []).length === 0) {
      list.appendChild(el("li", "empty", "최근 장애 기록이 없습니다."));
      return;
    }
    for (const incident of data.incidents) {
      const item = el("li");
      item.dataset.incident = String(incident.id);
      const head = el("div", "incident-head");
      head.appendChild(badge(INCIDENT_LABELS, incident.status));
      head.appendChild(el("span", "incident-title", incident.title));
      if (incident.created_at) {
        const time = el("time", "meta", kst.format(new Date(incident.created_at)));
        time.dateTime = incident.created_at;
        head.appendChild(time);
      }
      item.appendChild(head);
      if ((incident.updates ?? []).length > 0) {
        const updates = el("ol", "updates");
        for (const update of incident.updates) {
          const li = el("li");
          const time = el("time", null, kst.format(new Date(update.at)));
          time.dateTime = update.at;
          li.appendChild(time);
          const key = known(INCIDENT_LABELS, update.status);
          li.appendChild(el("span", "update-status", key ? INCIDENT_LABELS[key] : update.status));
          li.appendChild(el("span", null, update.message));
          updates.appendChild(li);
        }
        item.appendChild(updates);
      }
      list.appendChild(item);
    }
  };

  const renderSummary = (fleet, incidents) => {
    const summary = $("summary");
    const statuses = (fleet.models ?? []).map((m) => m.status);
    const down = statuses.filter((s) => s === "down").length;
    const degraded = statuses.filter((s) => s === "degraded").length;
    const active = Number(incidents.active) || 0;
    let text = "모든 시스템이 정상적으로 동작하고 있습니다.";
    let kind = "ok";
    if (down > 0) {
      text = `모델 ${down}개에 장애가 있습니다.`;
      kind = "down";
    } else if (degraded > 0) {
      text = `모델 ${degraded}개의 성능이 저하되었습니다.`;
      kind = "degraded";
    }
    if (active > 0) {
      text = `진행 중인 장애 ${active}건 · ${text}`;
      if (kind === "ok") kind = "degraded";
    }
    summary.textContent = text;
    summary.className = `summary summary-${kind}`;
  };

  const getJson = async (path) => {
    const response = await fetch(path, { headers: { accept: "application/json" } });
    if (response.status === 429) throw new Error("요청이 많아 잠시 후 다시 불러옵니다.");
    if (!response.ok) throw new Error(`상태 정보를 불러오지 못했습니다 (HTTP ${response.status}).`);
    return response.json();
  };

  let loading = false;
  const refresh = async () => {
    if (loading) return;
    loading = true;
    try {
      const [fleet, server, incidents] = await Promise.all([
        getJson("/api/stats/fleet"),
        getJson("/api/stats/server"),
        getJson("/api/incidents?limit=10")
      ]);
      const names = new Map((fleet.models ?? []).map((m) => [m.id, m.display_name ?? m.id]));
      renderFleet(fleet);
      renderQuota(server.quota ?? { models: {}, global: {} }, names);
      renderServer(server);
      renderIncidents(incidents);
      renderSummary(fleet, incidents);
      $("updated").textContent = kstClock.format(new Date());
      $("updated").dateTime = new Date().toISOString();
      $("notice").hidden = true;
      document.body.dataset.loaded = String(Date.now());
    } catch (error) {
      const notice = $("notice");
      notice.textContent = error instanceof Error && /[가-힣]/.test(error.message)
        ? error.message
        : "상태 정보를 불러오지 못했습니다. 잠시 후 다시 시도합니다.";
      notice.hidden = false;
    } finally {
      loading = false;
    }
  };

  refresh();
  setInterval(refresh, REFRESH_MS);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") refresh();
  });
})();
