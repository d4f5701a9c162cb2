// The model view as one self-contained HTML page: the graph's data as JSON and a small script that lays it out (a
// layered layout per module: model -> layer -> attention / ffn -> ops), draws it as SVG and lets the reader pan, zoom,
// collapse and expand layers and click a node for its details. Nothing is fetched: the file opens offline.
#include <fmt/core.h>

#include <cmath>

#include "graph/printer.h"
#include "graph/printer_model.h"

namespace tessera::graph {

namespace {

using view::quote;

std::string json_num(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "null"; }

std::string shape_json(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::string graph_json(const Graph& g, const RenderOptions& o) {
  const bool prof = view::has_profile(o, g);
  std::string out = "{";
  out += fmt::format("\"model\":{},\"n_tokens\":{},\"n_past\":{},\"note\":{},\"profile\":{},\"wall_ms\":{},",
                     quote(g.model_name), g.n_tokens(), g.n_past(), quote(o.note), quote(o.profile),
                     prof ? json_num(o.wall_ms) : "null");
  out += o.collapse_others ? fmt::format("\"full\":[{},{}],", o.full_first, o.full_last) : "\"full\":null,";
  out += "\"nodes\":[";
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const Tensor& t = g.tensor(n.output);
    std::string ins = "[", weights = "[", fused = "[";
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const Tensor& x = g.tensor(n.inputs[j]);
      ins += fmt::format("{}{{\"t\":{},\"kind\":\"{}\",\"shape\":{},\"dtype\":\"{}\",\"from\":{}}}", j ? "," : "",
                         quote(x.name), tensor_kind_name(x.kind), shape_json(x.shape), dtype_name(x.dtype), x.producer);
    }
    const std::vector<std::string> w = view::weight_lines(g, n);
    for (size_t j = 0; j < w.size(); ++j) {
      if (j) weights += ',';
      weights += quote(w[j]);
    }
    for (size_t j = 0; j < n.fusion.fused_from.size(); ++j) {
      if (j) fused += ',';
      fused += quote(n.fusion.fused_from[j]);
    }
    out += fmt::format(
        "{}{{\"id\":{},\"name\":{},\"op\":\"{}\",\"cls\":\"{}\",\"role\":\"{}\",\"layer\":{},\"block\":{},"
        "\"shape\":{},\"dtype\":\"{}\",\"flops\":{},\"bytes\":{},\"ai\":{},\"inputs\":{}],\"weights\":{}],"
        "\"fused\":{}],\"ms\":{},\"roof\":{}}}",
        i ? ",\n" : "\n", i, quote(n.name), op_name(n.op), op_class(n.op), role_name(n.role), n.layer,
        quote(view::module_of(n)), shape_json(t.shape), dtype_name(t.dtype), n.flops, n.bytes,
        json_num(view::intensity(n)), ins, weights, fused, prof ? json_num(view::node_ms(o, i)) : "null",
        prof && view::node_roof(o, i) >= 0 ? json_num(view::node_roof(o, i)) : "null");
  }
  out += "]}";
  return out;
}

// The page. Layout: a block's nodes are ranked by their longest path from the block's first node (q, k and v share a
// rank, side by side); blocks stack inside their layer, layers and top-level modules stack down the page.
constexpr const char* kHead = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tessera graph</title>
<script>window.tesseraErrors=[];window.addEventListener('error',function(e){window.tesseraErrors.push(String(e.message));document.documentElement.setAttribute('data-errors',String(window.tesseraErrors.length));});</script>
<style>
html,body{margin:0;height:100%;font:12px Helvetica,Arial,sans-serif;color:#222;overflow:hidden}
#bar{position:absolute;top:0;left:0;right:0;height:58px;background:#f7f7f7;border-bottom:1px solid #ccc;padding:4px 10px;box-sizing:border-box}
#bar h1{font-size:14px;margin:0 0 2px 0}#bar .sub{color:#555}#bar button{margin-right:4px;font-size:11px}
#canvas{position:absolute;top:58px;left:0;right:340px;bottom:0;cursor:grab;background:#fff}
#side{position:absolute;top:58px;right:0;width:340px;bottom:0;overflow:auto;border-left:1px solid #ccc;padding:8px;box-sizing:border-box;background:#fcfcfc}
#side table{border-collapse:collapse;width:100%}#side td{vertical-align:top;padding:2px 4px;border-bottom:1px solid #eee;word-break:break-all}
#side td:first-child{color:#666;white-space:nowrap;word-break:normal}
svg text{pointer-events:none}.node rect{stroke:#777;stroke-width:1}.node.fused rect{stroke:#6a3d9a;stroke-width:2.5}
.node.sel rect{stroke:#000;stroke-width:3}.node{cursor:pointer}.edge{fill:none;stroke:#888;stroke-width:1.1}
.elabel{font-size:8px;fill:#666}.layerbox{fill:#fafafa;stroke:#999;stroke-width:1}.blockbox{fill:none;stroke:#bbb;stroke-dasharray:4 3}
.ltitle{cursor:pointer}.ltitle rect{fill:#e8eef7;stroke:#99a}.collapsed rect.cbox{fill:#f0f0f0;stroke:#888;stroke-width:1.5;cursor:pointer}
</style></head><body>
<div id="bar"><h1 id="title"></h1><div class="sub" id="sub"></div>
<div><button id="expand">expand all</button><button id="collapse">collapse all</button><button id="first">collapse all but layer 0</button><button id="fit">fit</button>
<span id="status"></span></div></div>
<div id="canvas"><svg id="svg" width="100%" height="100%"><defs><marker id="arr" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0L8,4L0,8z" fill="#888"/></marker></defs><g id="vp"></g></svg></div>
<div id="side"><b>Click a node for its details.</b><br><br>Drag to pan, wheel to zoom, click a layer's title to collapse or expand it.</div>
<script id="graph-data" type="application/json">)HTML";

constexpr const char* kScript = R"HTML(</script>
<script>
(function(){
'use strict';
var t0=performance.now();
var G=JSON.parse(document.getElementById('graph-data').textContent);
var N=G.nodes, NW=210, NH=60, GX=14, GY=34, PAD=12, TITLE=22;
function esc(s){return String(s).replace(/[&<>"]/g,function(c){return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c];});}
function human(v,u){var p=['','K','M','G','T','P'],i=0;while(Math.abs(v)>=1000&&i<5){v/=1000;i++;}
  return (i?v.toFixed(Math.abs(v)>=100?0:Math.abs(v)>=10?1:2)+' '+p[i]:String(Math.round(v))+' ')+u;}
function shp(s){return '['+s.join(', ')+']';}
var prof=G.wall_ms!==null, maxMs=0;N.forEach(function(n){if(n.ms>maxMs)maxMs=n.ms;});
function heat(f){var S=[[255,247,236],[253,174,97],[215,48,39],[165,0,38]];f=Math.max(0,Math.min(1,f));var x=f*3,k=Math.min(2,Math.floor(x)),r=x-k;
  var c=S[k].map(function(a,i){return Math.round(a+(S[k+1][i]-a)*r);});return 'rgb('+c.join(',')+')';}
function fill(n){if(prof)return heat(maxMs>0?n.ms/maxMs:0);
  return n.cls==='matmul'?'#cfe2ff':n.op==='attention'?'#ffe5b4':n.op==='rmsnorm'?'#d8f3dc':'#eeeeee';}
// Modules: top-level blocks outside the layers (embd, output) and layers holding their blocks (attn, ffn).
var items=[], layers={}, nLayers=0;
N.forEach(function(n){
  if(n.layer<0){var last=items[items.length-1];
    if(!last||last.kind!=='block'||last.name!==n.block){last={kind:'block',name:n.block,nodes:[]};items.push(last);}
    last.nodes.push(n.id);return;}
  var L=layers[n.layer];
  if(!L){L=layers[n.layer]={kind:'layer',layer:n.layer,blocks:[],collapsed:false,flops:0,bytes:0,ms:0,count:0};items.push(L);nLayers++;}
  var b=L.blocks[L.blocks.length-1];if(!b||b.name!==n.block){b={kind:'block',name:n.block,nodes:[]};L.blocks.push(b);}
  b.nodes.push(n.id);L.flops+=n.flops;L.bytes+=n.bytes;L.ms+=(n.ms||0);L.count++;});
var maxLayerMs=0;items.forEach(function(it){if(it.kind==='layer'&&it.ms>maxLayerMs)maxLayerMs=it.ms;});
var pos=new Array(N.length), owner=new Array(N.length);
function layoutBlock(b){var inb={},rank={},rows=[];b.nodes.forEach(function(id){inb[id]=1;});
  b.nodes.forEach(function(id){var r=0;N[id].inputs.forEach(function(x){if(x.from>=0&&inb[x.from])r=Math.max(r,rank[x.from]+1);});rank[id]=r;(rows[r]=rows[r]||[]).push(id);});
  var w=0;rows=rows.filter(function(r){return r;});rows.forEach(function(r){w=Math.max(w,r.length*NW+(r.length-1)*GX);});
  b.w=w+2*PAD;b.h=TITLE+rows.length*NH+(rows.length-1)*GY+PAD;b.rows=rows;}
function placeBlock(b,x,y){b.x=x;b.y=y;b.rows.forEach(function(r,i){var rw=r.length*NW+(r.length-1)*GX,x0=x+(b.w-rw)/2;
  r.forEach(function(id,j){pos[id]={x:x0+j*(NW+GX),y:y+TITLE+i*(NH+GY),w:NW,h:NH};});});}
function layout(){var y=20,W=0;
  items.forEach(function(it){if(it.kind==='block'){layoutBlock(it);it.W=it.w;it.H=it.h;}
    else if(it.collapsed){it.W=380;it.H=58;}
    else{var w=0,h=TITLE+4;it.blocks.forEach(function(b){layoutBlock(b);w=Math.max(w,b.w);h+=b.h+GY;});it.W=w+2*PAD;it.H=h;}
    W=Math.max(W,it.W);});
  items.forEach(function(it){var x=(W-it.W)/2;it.x=x;it.y=y;
    if(it.kind==='block'){placeBlock(it,x,y);it.nodes.forEach(function(id){owner[id]=null;});}
    else if(it.collapsed){it.blocks.forEach(function(b){b.nodes.forEach(function(id){owner[id]=it;pos[id]=null;});});}
    else{var by=y+TITLE+4;it.blocks.forEach(function(b){placeBlock(b,x+(it.W-b.w)/2,by);by+=b.h+GY;b.nodes.forEach(function(id){owner[id]=null;});});}
    y+=it.H+GY*1.5;});
  return {w:W,h:y};}
function anchor(id,bottom){var p=pos[id];if(p)return {x:p.x+p.w/2,y:bottom?p.y+p.h:p.y};var L=owner[id];return {x:L.x+L.W/2,y:bottom?L.y+L.H:L.y};}
var selected=-1, drawnNodes=0, drawnEdges=0, size;
function draw(){size=layout();var s=[],e=[],bg=[];drawnNodes=0;drawnEdges=0;
  items.forEach(function(it){
    if(it.kind==='layer'){
      var head='blk.'+it.layer+' (layer '+it.layer+') \u2014 '+it.count+' ops, '+human(it.flops,'FLOP')+', '+human(it.bytes,'B')+(prof?', '+it.ms.toFixed(3)+' ms'+(G.wall_ms>0?' ('+(100*it.ms/G.wall_ms).toFixed(1)+'% of wall)':''):'');
      if(it.collapsed){s.push('<g class="collapsed ltitle" data-layer="'+it.layer+'"><rect class="cbox" x="'+it.x+'" y="'+it.y+'" width="'+it.W+'" height="'+it.H+'" rx="6" style="fill:'+(prof?heat(maxLayerMs>0?0.6*it.ms/maxLayerMs:0):'#f0f0f0')+'"/>'+
        '<text x="'+(it.x+10)+'" y="'+(it.y+22)+'" font-size="12" font-weight="bold">\u25b8 blk.'+it.layer+' (collapsed: '+it.count+' ops)</text>'+
        '<text x="'+(it.x+10)+'" y="'+(it.y+42)+'" font-size="11">'+esc(human(it.flops,'FLOP')+', '+human(it.bytes,'B')+(prof?', '+it.ms.toFixed(3)+' ms':''))+'</text></g>');return;}
      bg.push('<rect class="layerbox" x=""'+it.x+'" y="'+it.y+'" width="'+it.W+'" height="'+it.H+'" rx="8"/>');
      s.push('<g class="ltitle" data-layer="'+it.layer+'"><rect x="'+it.x+'" y="'+it.y+'" width="'+it.W+'" height="'+TITLE+'" rx="8"/><text x="'+(it.x+8)+'" y="'+(it.y+15)+'" font-size="12" font-weight="bold">\u25be '+esc(head)+'</text></g>');
      it.blocks.forEach(function(b){bg.push('<rect class="blockbox" x="'+b.x+'" y="'+b.y+'" width="'+b.w+'" height="'+b.h+'" rx="6"/><text x="'+(b.x+6)+'" y="'+(b.y+14)+'" font-size="11" fill="#666">'+(b.name==='attn'?'attention':esc(b.name))+'</text>');});
    } else bg.push('<rect class="blockbox" x="'+it.x+'" y="'+it.y+'" width="'+it.W+'" height="'+it.H+'" rx="6"/><text x="'+(it.x+6)+'" y="'+(it.y+14)+'" font-size="11" fill="#666">'+esc(it.name)+'</text>');});
  var seen={};
  N.forEach(function(n){n.inputs.forEach(function(x){if(x.from<0||x.kind==='weight')return;
    var a=anchor(x.from,true),b=anchor(n.id,false),k=a.x+','+a.y+'>'+b.x+','+b.y;
    if((!pos[x.from]&&!pos[n.id]&&owner[x.from]===owner[n.id])||seen[k])return;seen[k]=1;
    var my=(a.y+b.y)/2, d=b.y<=a.y?'M'+a.x+','+a.y+' C'+(a.x+120)+','+(a.y+80)+' '+(b.x+120)+','+(b.y-80)+' '+b.x+','+b.y:'M'+a.x+','+a.y+' C'+a.x+','+my+' '+b.x+','+my+' '+b.x+','+b.y;
    e.push('<path class="edge" d="'+d+'" marker-end="url(#arr)"/><text class="elabel" x="'+((a.x+b.x)/2+4)+'" y="'+(my+3)+'">'+esc(shp(x.shape)+' '+x.dtype)+'</text>');drawnEdges++;});});
  N.forEach(function(n){var p=pos[n.id];if(!p)return;drawnNodes++;
    var l3=human(n.flops,'FLOP')+', '+human(n.bytes,'B')+', AI '+(n.ai).toFixed(2);
    var l4=n.fused.length?'fuses '+n.fused.length+': '+n.fused.join(', '):(n.weights.length?n.weights[0].split(' ').slice(1).join(' '):'');
    if(prof)l4=n.ms.toFixed(3)+' ms'+(G.wall_ms>0?', '+(100*n.ms/G.wall_ms).toFixed(1)+'%':'')+(n.roof!==null?', '+(100*n.roof).toFixed(0)+'% roof':'');
    s.push('<g class="node'+(n.fused.length?' fused':'')+(n.id===selected?' sel':'')+'" data-id="'+n.id+'"><rect x="'+p.x+'" y="'+p.y+'" width="'+p.w+'" height="'+p.h+'" rx="5" style="fill:'+fill(n)+'"/>'+
      '<text x="'+(p.x+6)+'" y="'+(p.y+13)+'" font-size="11" font-weight="bold">'+esc(n.name)+'</text>'+
      '<text x="'+(p.x+6)+'" y="'+(p.y+26)+'" font-size="10">'+esc(n.op+' \u2192 '+shp(n.shape)+' '+n.dtype)+'</text>'+
      '<text x="'+(p.x+6)+'" y="'+(p.y+39)+'" font-size="10">'+esc(l3)+'</text>'+
      '<text x="'+(p.x+6)+'" y="'+(p.y+52)+'" font-size="10" fill="#333">'+esc(l4.length>38?l4.slice(0,37)+'\u2026':l4)+'</text></g>');});
  document.getElementById('vp').innerHTML=bg.join('')+e.join('')+s.join('');
  var st=document.documentElement.dataset;st.layers=String(nLayers);st.nodes=String(N.length);st.drawnNodes=String(drawnNodes);st.drawnEdges=String(drawnEdges);
  st.collapsedLayers=String(items.filter(function(it){return it.kind==='layer'&&it.collapsed;}).length);}
var T={x:0,y:0,k:1},svg=document.getElementById('svg'),vp=document.getElementById('vp');
function apply(){vp.setAttribute('transform','translate('+T.x+','+T.y+') scale('+T.k+')');}
function fit(){var r=svg.getBoundingClientRect();T.k=Math.min(1.2,Math.max(0.02,Math.min((r.width-20)/size.w,1)));T.x=(r.width-size.w*T.k)/2;T.y=10;apply();}
var drag=null;
svg.addEventListener('mousedown',function(ev){drag={x:ev.clientX,y:ev.clientY,tx:T.x,ty:T.y,moved:false};svg.style.cursor='grabbing';});
window.addEventListener('mousemove',function(ev){if(!drag)return;var dx=ev.clientX-drag.x,dy=ev.clientY-drag.y;if(Math.abs(dx)+Math.abs(dy)>3)drag.moved=true;T.x=drag.tx+dx;T.y=drag.ty+dy;apply();});
window.addEventListener('mouseup',function(){svg.style.cursor='';setTimeout(function(){drag=null;},0);});
svg.addEventListener('wheel',function(ev){ev.preventDefault();var r=svg.getBoundingClientRect(),mx=ev.clientX-r.left,my=ev.clientY-r.top,f=Math.exp(-ev.deltaY*0.0015),k=Math.max(0.02,Math.min(8,T.k*f));
  T.x=mx-(mx-T.x)*k/T.k;T.y=my-(my-T.y)*k/T.k;T.k=k;apply();},{passive:false});
function details(n){var rows=[['name',n.name],['op',n.op+' ('+n.cls+')'],['role',n.role],['layer',n.layer<0?'-':n.layer],['module',n.block],
  ['output',shp(n.shape)+' '+n.dtype],['FLOPs',human(n.flops,'FLOP')+' ('+n.flops+')'],['bytes',human(n.bytes,'B')+' ('+n.bytes+')'],['arithmetic intensity',n.ai.toFixed(3)+' FLOP/B']];
  n.inputs.forEach(function(x,i){rows.push(['input '+i,x.t+' '+shp(x.shape)+' '+x.dtype+' ('+x.kind+')']);});
  if(n.fused.length)rows.push(['fuses',n.fused.join(', ')]);
  if(prof){rows.push(['time',n.ms.toFixed(4)+' ms']);if(G.wall_ms>0)rows.push(['% of wall',(100*n.ms/G.wall_ms).toFixed(2)+'%']);if(n.roof!==null)rows.push(['% of roof',(100*n.roof).toFixed(1)+'%']);}
  document.getElementById('side').innerHTML='<table>'+rows.map(function(r){return '<tr><td>'+esc(r[0])+'</td><td>'+esc(r[1])+'</td></tr>';}).join('')+'</table>';}
vp.addEventListener('click',function(ev){if(drag&&drag.moved)return;var g=ev.target.closest('[data-id],[data-layer]');if(!g)return;
  if(g.hasAttribute('data-id')){selected=+g.getAttribute('data-id');details(N[selected]);draw();return;}
  var L=layers[+g.getAttribute('data-layer')];L.collapsed=!L.collapsed;draw();});
function setAll(c,keepFirst){items.forEach(function(it){if(it.kind==='layer')it.collapsed=c&&!(keepFirst&&it.layer===0);});draw();fit();}
document.getElementById('expand').onclick=function(){setAll(false);};
document.getElementById('collapse').onclick=function(){setAll(true);};
document.getElementById('first').onclick=function(){setAll(true,true);};
document.getElementById('fit').onclick=fit;
document.getElementById('title').textContent='model '+(G.model||'graph')+': T='+G.n_tokens+' tokens at P='+G.n_past+', '+N.length+' nodes in '+nLayers+' layers';
document.getElementById('sub').textContent=[G.note,G.profile,prof?'colour: time per node (white: fast, red: slowest)':'colour: op class (blue matmul, orange attention, green norm)'].filter(function(x){return x;}).join(' \u2014 ');
var h=location.hash.match(/layers=(\d+)-(\d+)/)||(G.full?[0,G.full[0],G.full[1]]:null);
if(h)items.forEach(function(it){if(it.kind==='layer')it.collapsed=it.layer<+h[1]||it.layer>+h[2];});
draw();fit();
var ms=performance.now()-t0;document.documentElement.dataset.renderMs=ms.toFixed(1);
// From the navigation's start (performance.now's origin): parsing the page and its data included.
document.documentElement.dataset.loadedMs=performance.now().toFixed(1);
document.getElementById('status').textContent=' drew '+drawnNodes+' nodes, '+drawnEdges+' edges in '+ms.toFixed(0)+' ms';
document.documentElement.dataset.ready='1';
})();
</script></body></html>
)HTML";

}  // namespace

std::string to_html(const Graph& g, const RenderOptions& o) {
  std::string out = kHead;
  out += graph_json(g, o);
  out += kScript;
  return out;
}

}  // namespace tessera::graph
