// Wicket console: countdowns on approvals, and an execution's live
// timeline over the kernel's event stream. Everything works without it
// but the live updates; nothing here builds HTML from event data.
(function () {
  'use strict';

  function left(ms) {
    if (ms <= 0) { return 'expired'; }
    var m = Math.floor(ms / 60000);
    if (m < 1) { return 'under a minute left'; }
    if (m < 60) { return m + ' min left'; }
    var h = Math.floor(m / 60);
    if (h < 48) { return h + ' h ' + (m % 60) + ' min left'; }
    return Math.floor(h / 24) + ' days left';
  }
  function countdowns() {
    var now = Date.now();
    document.querySelectorAll('time[data-expires]').forEach(function (t) {
      var s = t.parentNode.querySelector('.left');
      if (s) { s.textContent = left(Date.parse(t.getAttribute('datetime')) - now); }
    });
  }
  if (document.querySelector('time[data-expires]')) {
    countdowns();
    setInterval(countdowns, 15000);
  }

  var root = document.getElementById('execution');
  if (!root || root.dataset.terminal || !window.EventSource) { return; }
  var timeline = document.getElementById('timeline');
  var state = document.getElementById('stream-state');
  var live = document.getElementById('live');
  var last = Number(root.dataset.lastSeq || 0);
  var terminal = { 'execution.completed': 1, 'execution.failed': 1, 'execution.cancelled': 1 };
  var refreshing = false, again = false;

  // refresh fetches the live part again (status, totals, steps); one
  // fetch at a time, and one more if events came in the meantime.
  function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    fetch(root.dataset.live, { credentials: 'same-origin', headers: { 'Accept': 'text/html' } }).then(function (r) {
      if (r.status === 401) { state.textContent = 'Your session has ended: reload the page to sign in again.'; return null; }
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html !== null && html !== undefined) { live.innerHTML = html; }
    }).finally(function () {
      refreshing = false;
      if (again) { again = false; refresh(); }
    });
  }

  function fmt(t) {
    var d = new Date(t);
    return isNaN(d) ? t : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }

  function add(ev) {
    var li = document.createElement('li');
    li.dataset.seq = ev.seq;
    li.dataset.type = ev.type;
    li.className = 'new';
    var seq = document.createElement('span'); seq.className = 'seq'; seq.textContent = '#' + ev.seq;
    var time = document.createElement('time'); time.textContent = fmt(ev.time);
    var type = document.createElement('strong'); type.className = 'ev'; type.textContent = ev.type;
    var p = document.createElement('code'); p.className = 'payload';
    var s = JSON.stringify(ev.payload);
    p.textContent = s && s.length > 300 ? s.slice(0, 300) + '…' : s;
    li.append(seq, ' ', time, ' ', type, ' ', p);
    timeline.appendChild(li);
  }

  var url = root.dataset.stream + (root.dataset.stream.indexOf('?') < 0 ? '?' : '&') + 'after_seq=' + last;
  var es = new EventSource(url);
  es.onmessage = function (m) {
    var ev;
    try { ev = JSON.parse(m.data); } catch (e) { return; }
    if (typeof ev.seq !== 'number' || !ev.type) { return; } // a step delta
    if (ev.seq <= last) { return; }
    last = ev.seq;
    add(ev);
    refresh();
    if (terminal[ev.type]) {
      es.close();
      state.textContent = 'The execution has ended (' + ev.type + ').';
    }
  };
  es.onerror = function () {
    if (es.readyState === EventSource.CLOSED) {
      state.textContent = 'The live stream stopped; reload the page to see new events.';
    } else {
      state.textContent = 'Reconnecting to the live stream…';
    }
  };
  es.onopen = function () {
    root.dataset.connected = '1';
    state.textContent = 'Live: new events appear as they are recorded.';
  };
})();
