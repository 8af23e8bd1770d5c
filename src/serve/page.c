/* The web page of `difflet serve` (GET /): one self-contained HTML document with its
 * CSS and script inline (no external resources). It talks to the server only through
 * the public API (/v1/models, /v1/jobs, /v1/videos), as any other client would.
 *
 * What it offers: prompt, negative prompt, model (a picker with several models;
 * `?model=ID` preselects one), size, length (video models), steps, guidance, seed,
 * caching; live progress (server-sent events, or polling when an API key is set, as
 * EventSource sends no headers); Cancel (POST /v1/jobs/ID/cancel); the result (a
 * <video> player for a model whose /v1/models entry has output "video"); and a gallery
 * of this browser session's results, newest first, with the settings each job really
 * ran with (its `request` on GET /v1/jobs/ID: a random seed or a model's default
 * guidance shows as its value). The gallery lives in sessionStorage as job ids and
 * settings only (no pictures): a reload keeps it and fetches the content again.
 * Generate stays off until /v1/models has answered: a form sent before has no model
 * or size to send.
 * A DDiT deployment's pool (units busy, requests waiting, promotions) shows under the
 * status line, refreshed every 2 s from /v1/models.
 *
 * The query string fills the form (`?prompt=...&negative_prompt=...&steps=2&seed=7`,
 * the API's field names), so a setting can be linked to; `?autorun` submits it. An API
 * key is given once (typed, or `#key=K`, which is taken out of the address bar), kept
 * in localStorage and sent as Bearer.
 *
 * Element ids are looked up explicitly (window.prompt and window.status are built-ins
 * that named access would not override); tests/test_serve*.py read the DOM by them.
 * The script keeps to single quotes, so the C string needs no escapes. */
#include "serve/api_impl.h"

const char dl_serve_page[] =
    "<!doctype html><html lang=en><head><meta charset=utf-8>"
    "<meta name=viewport content='width=device-width,initial-scale=1'><title>difflet</title><style>"
    "*{box-sizing:border-box}[hidden]{display:none!important}"
    "body{font:15px/1.4 system-ui,sans-serif;margin:0;background:#f3f3f0;color:#222}"
    "header{background:#234;color:#fff;padding:.5em 1em}h1{margin:0;font-size:1.2em}h2{font-size:1em;margin:0 0 .6em}"
    "main{max-width:1000px;margin:0 auto;padding:1em;display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:1em}"
    "@media(max-width:700px){main{grid-template-columns:minmax(0,1fr)}}"
    ".card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:1em}#q_gcard{grid-column:1/-1}"
    "label{display:block;font-size:.85em;color:#555}textarea,input,select{display:block;width:100%;font:inherit;padding:.25em}"
    ".row{display:grid;grid-template-columns:repeat(auto-fill,minmax(100px,1fr));gap:.5em;margin:.6em 0}"
    "button{font:inherit;padding:.35em 1.1em;cursor:pointer}#q_go{background:#2a6;color:#fff;border:1px solid #185}"
    "#wrap{height:8px;background:#e4e4e4;border-radius:4px;overflow:hidden;margin:.8em 0 .3em}#bar{height:100%;background:#4a7;width:0}"
    "#q_img,#q_video,figure img,figure video{width:100%;image-rendering:pixelated;background:#eee;display:block}"
    "#q_img,#q_video{max-height:65vh;object-fit:contain}figure button,h2 button{font-size:.8em;padding:.1em .6em}"
    "#q_gallery{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:.8em}"
    "figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:.4em;font-size:.8em;overflow-wrap:anywhere}"
    "figure .n{color:#a33}figure .s{color:#555}figure.gone img,figure.gone video{display:none}"
    ".key{margin-top:1em;font-size:.85em}.key input{display:inline;width:14em}"
    "</style></head><body><header><h1>difflet</h1></header><main><form id=form class=card>"
    "<label>prompt<textarea id=q_prompt rows=3>a large red circle in the centre on a blue background</textarea></label>"
    "<label>negative prompt<textarea id=q_neg rows=2 placeholder='(none)'></textarea></label><div class=row>"
    "<label id=q_mwrap hidden>model<select id=q_model></select></label><label>size<select id=q_size></select></label>"
    "<label id=q_len hidden>length<select id=q_frames></select></label>"
    "<label>steps<input id=q_steps type=number value=20 min=1 placeholder=default></label>"
    "<label>guidance<input id=q_guid type=number min=0 max=100 step=any placeholder=default></label>"
    "<label>seed<input id=q_seed type=number value=1 min=0 placeholder=random></label>"
    "<label>cache<select id=q_cache><option>off<option>cadence:2<option>online-delta</select></label></div>"
    "<button id=q_go disabled>Generate</button> <button id=q_cancel type=button disabled>Cancel</button>"
    "<div class=key>API key <input id=q_key type=password placeholder='(none)' autocomplete=off> kept in this browser</div>"
    "</form><section class=card><div id=wrap><div id=bar></div></div><p id=q_status></p><p id=q_pool hidden></p>"
    "<img id=q_img alt='' hidden><video id=q_video controls loop autoplay muted hidden></video></section>"
    "<section id=q_gcard class=card><h2>This session <button id=q_clear type=button>clear</button></h2>"
    "<div id=q_gallery></div></section></main>"
    "<script>const $=i=>document.getElementById(i),Q=new URLSearchParams(location.search);let V=0,M=[],job=null;"
    /* a key given as #key=... is stored and taken out of the address bar */
    "const hk=new URLSearchParams(location.hash.slice(1)).get('key');"
    "if(hk){localStorage.setItem('difflet_key',hk);history.replaceState(null,'',location.pathname+location.search)}"
    "$('q_key').value=localStorage.getItem('difflet_key')||'';"
    "$('q_key').onchange=()=>{localStorage.setItem('difflet_key',$('q_key').value);models();draw()};"
    "const H=()=>{const k=$('q_key').value;return k?{'Authorization':'Bearer '+k,'Content-Type':'application/json'}"
    ":{'Content-Type':'application/json'}};"
    "const api=(u,o)=>fetch(u,Object.assign({headers:H()},o||{}));"
    "const mk=(t,c,x)=>{const e=document.createElement(t);if(c)e.className=c;if(x!=null)e.textContent=x;return e};"
    "const opt=(sel,v,t)=>{const o=mk('option',0,t);o.value=v;$(sel).appendChild(o)};"
    /* content into an <img>/<video>: its route without a key, a blob fetched with one */
    "const curl=(id,v)=>v?'/v1/videos/'+id+'/content':'/v1/jobs/'+id+'/content';"
    "const load=(el,u)=>{if(!$('q_key').value){el.src=u;return}"
    "api(u).then(r=>{if(!r.ok)throw r.status;return r.blob()}).then(b=>{el.src=URL.createObjectURL(b)}).catch(()=>el.onerror&&el.onerror())};"
    /* the chosen model's sizes, and for a video model its lengths */
    "const pick=()=>{const d=M[$('q_model').selectedIndex]||M[0];$('q_size').textContent='';$('q_frames').textContent='';"
    "for(const s of d.sizes)opt('q_size',s,s);V=d.output=='video';$('q_len').hidden=!V;"
    "if(V)d.frames.forEach((f,i)=>opt('q_frames',f,d.seconds[i]+' s ('+f+' frames)'))};"
    /* settings (the API's names) into the form: from the query string, or a gallery entry */
    "const setsel=(i,v)=>{const s=$(i),o=s.value;s.value=v;if(s.selectedIndex<0)s.value=o};"
    "const fill=o=>{if(o.model)setsel('q_model',o.model);pick();if(o.size)setsel('q_size',o.size);if(o.frames)setsel('q_frames',o.frames);"
    "if(o.cache)setsel('q_cache',o.cache);for(const[k,i]of[['prompt','q_prompt'],['negative_prompt','q_neg'],['steps','q_steps'],"
    "['guidance_scale','q_guid'],['seed','q_seed']])if(o[k]!=null)$(i).value=o[k]};"
    /* the gallery: this session's results, newest first, kept in sessionStorage */
    "const G=()=>{try{return JSON.parse(sessionStorage.getItem('difflet_gallery'))||[]}catch(e){return[]}};"
    "const fig=e=>{const f=mk('figure'),m=mk(e.video?'video':'img');f.dataset.job=e.id;"
    "if(e.video){m.controls=m.loop=m.muted=true}else m.alt=e.prompt;"
    "m.onerror=()=>{f.classList.add('gone');f.title='no longer on the server'};load(m,curl(e.id,e.video));"
    "const c=mk('figcaption');c.append(mk('div','p',e.prompt));if(e.negative_prompt)c.append(mk('div','n','not: '+e.negative_prompt));"
    "c.append(mk('div','s',[e.model,e.size,e.frames?e.frames+' frames':'',e.steps+' steps','guidance '+e.guidance_scale,"
    "'seed '+e.seed].filter(x=>x).join(', ')));"
    "const u=mk('button',0,'reuse');u.type='button';u.onclick=()=>{fill(e);scrollTo(0,0)};c.append(u);"
    "f.append(m,c);return f};"
    "const draw=()=>{$('q_gallery').textContent='';for(const e of G())$('q_gallery').append(fig(e))};"
    "const add=(id,j,b)=>{const r=j.request||{},g=G(),e="
    "{id,video:j.kind=='video',model:j.model||b.model,prompt:r.prompt==null?b.prompt:r.prompt,"
    "negative_prompt:r.negative_prompt||'',size:r.width?r.width+'x'+r.height:b.size,frames:r.frames||b.frames,"
    "steps:r.steps||b.steps,guidance_scale:r.guidance_scale==null?b.guidance_scale:r.guidance_scale,seed:r.seed==null?b.seed:r.seed};"
    "g.unshift(e);sessionStorage.setItem('difflet_gallery',JSON.stringify(g.slice(0,100)));$('q_gallery').prepend(fig(e))};"
    "$('q_clear').onclick=()=>{sessionStorage.removeItem('difflet_gallery');draw()};draw();"
    /* the served models (again when a key is entered); the query string; ?autorun */
    "let first=1;const models=()=>api('/v1/models').then(r=>r.json()).then(m=>{if(!m.data){say(m.error.message);return}"
    "M=m.data;if(!job)$('q_go').disabled=false;$('q_model').textContent='';for(const d of M)opt('q_model',d.id,d.id+' ('+d.output+')');$('q_mwrap').hidden=M.length<2;"
    "if(!first){pick();return}first=0;fill(Object.fromEntries(Q));if(Q.has('autorun'))$('form').requestSubmit()})"
    ".catch(x=>say('the server did not answer: '+x));$('q_model').onchange=pick;"
    /* one job at a time: Generate is off and Cancel on while it runs */
    "const busy=b=>{$('q_go').disabled=!!b;$('q_cancel').disabled=!b;if(!b)job=null};"
    "const say=t=>{$('q_status').textContent=t};"
    /* a job's state (an SSE event or a poll); 1 when it has ended */
    "const show=(id,s)=>{if(!job||job.id!=id)return 1;if(!s.status){say(s.error?s.error.message:'no answer');return 0}$('bar').style.width=(s.progress||0)+'%';"
    "say(s.status=='queued'?'queued'+(s.queue_position?' (position '+s.queue_position+')':''):"
    "s.status+' '+s.steps_done+'/'+s.steps+(s.steps_cached?' ('+s.steps_cached+' cached)':'')+(job.cancel&&s.status=='in_progress'?', cancelling':''));"
    "if(s.status=='completed'){const J=job;busy(0);done(J);return 1}"
    "if(s.status=='failed'||s.status=='cancelled'){say(s.status+': '+(s.error||''));busy(0);return 1}return 0};"
    /* a finished job: the result, and its entry in the gallery with the settings it ran with */
    "const done=async J=>{$('q_img').hidden=J.video;$('q_video').hidden=!J.video;load($(J.video?'q_video':'q_img'),curl(J.id,J.video));"
    "let j={};try{j=await(await api('/v1/jobs/'+J.id)).json()}catch(e){}add(J.id,j,J.body)};"
    "$('form').onsubmit=async e=>{e.preventDefault();if(job)return;"
    "const b={prompt:$('q_prompt').value,model:$('q_model').value,size:$('q_size').value,cache:$('q_cache').value};"
    "for(const[k,i]of[['steps','q_steps'],['guidance_scale','q_guid'],['seed','q_seed']])if($(i).value.trim()!=='')b[k]=+$(i).value;"
    "if($('q_neg').value.trim())b.negative_prompt=$('q_neg').value;if(V)b.frames=+$('q_frames').value;"
    "job={id:'',video:V,body:b};busy(1);say('submitting');$('bar').style.width='0';let r,j;"
    "try{r=await api(V?'/v1/videos':'/v1/jobs',{method:'POST',body:JSON.stringify(b)});j=await r.json()}"
    "catch(x){say('the server did not answer: '+x);busy(0);return}"
    "if(!r.ok){say(j.error?j.error.message:'error '+r.status);busy(0);return}"
    "job.id=j.id;$('q_status').dataset.job=j.id;show(j.id,{status:'queued',queue_position:j.queue_position,progress:0});"
    /* without a key: server-sent events; with one (EventSource sends no headers): polling.
       A video's id names its job on /v1/jobs too. */
    "if(!$('q_key').value){const ev=new EventSource('/v1/jobs/'+j.id+'/events');"
    "for(const k of['progress','completed','failed','cancelled'])ev.addEventListener(k,m=>{if(show(j.id,JSON.parse(m.data)))ev.close()})}"
    "else{const poll=async()=>{let s=null;try{s=await(await api('/v1/jobs/'+j.id)).json()}catch(x){}"
    "if(!s||!show(j.id,s))setTimeout(poll,250)};poll()}};"
    /* Cancel: a queued job ends at once, a running one at its next step boundary */
    "$('q_cancel').onclick=async()=>{if(!job||!job.id)return;const J=job;J.cancel=1;say('cancelling');"
    "try{const s=await(await api('/v1/jobs/'+J.id+'/cancel',{method:'POST'})).json();if(s.status)show(J.id,s)}"
    "catch(x){say('the cancel did not reach the server: '+x)}};"
    /* a DDiT world's pool (a served model with `ddit`): units busy, requests waiting, promotions; every 2 s */
    "const pool=()=>api('/v1/models').then(r=>r.json()).then(m=>{const P=(m.data||[]).filter(d=>d.ddit);$('q_pool').hidden=!P.length;"
    "$('q_pool').textContent=P.map(d=>d.id+': DDiT pool '+d.ddit.busy+'/'+d.ddit.units+' units busy, '+d.ddit.waiting+' waiting, '"
    "+d.ddit.promotions+' promotions').join('; ')}).catch(()=>{});setInterval(pool,2000);pool();"
    "models();</script></body></html>";
