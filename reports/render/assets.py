"""The page's style sheet and script, inlined in every report (the page fetches nothing)."""


CSS = """
:root { --fg:#1d1d1f; --muted:#6b6b6b; --line:#dcdcdc; --accent:#4e79a7; --bad:#c0392b;
  --page:1800px; --gutter:clamp(14px, 2.2vw, 40px); --measure:110ch; }
* { box-sizing: border-box; }
body { margin:0; color:var(--fg); background:#fff;
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif; }
/* The page follows the window up to --page wide; running text stops at --measure for reading, figures scale
   with their column (render/figures.py caps each at 1.5x its drawn size). */
header, nav { padding-left:max(var(--gutter), calc((100% - var(--page)) / 2 + var(--gutter)));
  padding-right:var(--gutter); }
header { padding-top:18px; padding-bottom:8px; border-bottom:1px solid var(--line); }
header h1 { margin:0 0 4px; font-size:22px; }
header p { margin:2px 0; color:var(--muted); }
nav { position:sticky; top:0; z-index:5; background:#f7f7f8; border-bottom:1px solid var(--line);
  padding-top:6px; padding-bottom:6px; font-size:13px; }
nav a { color:var(--accent); text-decoration:none; margin-right:16px; white-space:nowrap; }
main { max-width:var(--page); margin:0 auto; padding:0 var(--gutter) 40px; }
main p, main ul, main ol, header p { max-width:var(--measure); overflow-wrap:break-word; }
section { border-bottom:1px solid var(--line); padding:6px 0 18px; }
h2 { font-size:19px; margin:18px 0 8px; }
h3 { font-size:14.5px; margin:14px 0 6px; }
p.missing { color:var(--muted); font-style:italic; margin:6px 0; }
p.missing.error { color:var(--bad); font-style:normal; }
p.note { color:var(--muted); margin:4px 0; }
p.headline { font-size:15px; margin:8px 0; }
.speedup { color:var(--accent); }
.src { color:var(--muted); font-size:12px; }
.cols { display:grid; grid-template-columns:repeat(2, minmax(0, 1fr)); gap:12px 28px; align-items:start; }
.cols3 { display:grid; grid-template-columns:repeat(3, minmax(0, 1fr)); gap:12px 20px; align-items:start; }
@media (max-width: 1200px) { .cols3 { grid-template-columns:repeat(2, minmax(0, 1fr)); } }
@media (max-width: 900px) { .cols, .cols3 { grid-template-columns:1fr; } }
figure { margin:8px 0; }
figure svg { display:block; width:100%; height:auto; }
figcaption { color:var(--muted); font-size:12.5px; margin-top:2px; }
table { border-collapse:collapse; font-size:13px; margin:6px 0; }
th, td { border-bottom:1px solid var(--line); padding:3px 9px; text-align:left; vertical-align:top; }
th { background:#f3f4f6; font-weight:600; }
td.num { text-align:right; font-variant-numeric:tabular-nums; }
table.left td.num { text-align:left; }
table.nowrap td { white-space:nowrap; }
table.nowrap td.wrap { white-space:normal; }
table.kv td:first-child { color:var(--muted); white-space:nowrap; }
table.kv td { word-break:break-word; }
table.sortable th { cursor:pointer; user-select:none; position:sticky; top:0; white-space:nowrap; }
table.sortable th[aria-sort=ascending]::after { content:" \\25B2"; font-size:10px; }
table.sortable th[aria-sort=descending]::after { content:" \\25BC"; font-size:10px; }
tr.failed td { background:#fdecea; }
tr.pruned td { color:var(--muted); }
/* A table wider than its column scrolls sideways inside its own box; the page never does. */
div.tbox { max-width:100%; overflow-x:auto; margin:6px 0; }
div.tbox > table { margin:0; }
/* Long text in a cell (a failure's reason, a kernel's name) is one line cut with an ellipsis, the full text its
   title: a row is one line high whatever its text. */
div.clip { max-width:380px; overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
/* The trials table scrolls in a box of its own (both ways), with its scroll bars always shown. */
div.scroll { max-width:100%; max-height:640px; overflow:auto; border:1px solid var(--line); }
div.scroll::-webkit-scrollbar { width:11px; height:11px; }
div.scroll::-webkit-scrollbar-thumb { background:#c2c2c8; border-radius:6px; border:2px solid #f3f4f6; }
div.scroll::-webkit-scrollbar-track, div.scroll::-webkit-scrollbar-corner { background:#f3f4f6; }
div.scroll table { margin:0; }
table.trials td { white-space:nowrap; }
table.trials th, table.trials td { padding:3px 7px; }
table.trials th { white-space:normal; vertical-align:bottom; min-width:4.5em; }
table.trials th:first-child, table.trials td:first-child { position:sticky; left:0; z-index:1; background:#fff;
  min-width:0; box-shadow:inset -1px 0 0 var(--line); }
table.trials th:first-child { z-index:3; background:#f3f4f6; }
table.trials tr.failed td:first-child { background:#fdecea; }
table.trials td.reason div.clip { max-width:420px; }
pre { background:#f7f7f8; border:1px solid var(--line); padding:8px 10px; font-size:12.5px;
  overflow:auto; white-space:pre; }
pre.config { max-height:520px; }
details.config > summary { color:var(--accent); }
code { font-size:12.5px; background:#f3f4f6; padding:0 3px; }
div.guide p { margin:4px 0; }
ul.files { margin:2px 0 4px; padding-left:22px; font-size:13px; }
ul.files li { margin:1px 0; }
details { margin:4px 0; }
summary { cursor:pointer; }
"""


# Sort a table by clicking its header: numbers by value (data-v), text alphabetically, blanks last.
JS = """
(function () {
  function key(cell) {
    var v = cell.getAttribute('data-v');
    if (v !== null) { return v === '' ? null : parseFloat(v); }
    var t = cell.textContent.trim();
    return t === '' || t === '\\u2014' ? null : t.toLowerCase();
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener('click', function () {
        var asc = th.getAttribute('aria-sort') !== 'ascending';
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[col]), y = key(b.cells[col]);
          if (x === null || y === null) { return x === y ? 0 : (x === null ? 1 : -1); }
          var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
          return asc ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
    table.setAttribute('data-sort-ready', '1');
  });
})();
"""
