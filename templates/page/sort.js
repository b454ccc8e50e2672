{% raw %}// Sorting a table by a clicked header: numbers by value, text by text, empty
// cells (a failed configuration's figures) last either way; a second click
// reverses. Without it the page is the same, unsorted.
document.querySelectorAll('table.sortable').forEach(function(t){
var hs=t.tHead.rows[0].cells;for(var i=0;i<hs.length;i++){(function(c){var asc=true;
hs[c].addEventListener('click',function(){var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows);
rows.sort(function(x,y){var p=x.cells[c].getAttribute('data-value')||'',q=y.cells[c].getAttribute('data-value')||'';
if(p===''||q==='')return (p==='')-(q==='');var a=Number(p),d=Number(q);
var r=(isNaN(a)||isNaN(d))?p.localeCompare(q):a-d;return asc?r:-r;});
asc=!asc;rows.forEach(function(r){b.appendChild(r);});});})(i);}});{% endraw %}
