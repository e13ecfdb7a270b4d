//! The dashboard's HTML: escaping (everything a pipeline, a model or a
//! peer wrote goes through [`esc`]), the page layout, and the stylesheet and
//! script shipped inside the binary.

/// `s` as HTML text (also safe inside a quoted attribute).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// `s` as a URL path segment or query value.
pub fn url(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A whole page: the navigation (who is signed in, and the way out),
/// `body`, the stylesheet and the script.
pub fn page(title: &str, who: &str, signed_in: bool, csrf: &str, fleet: bool, body: &str) -> String {
    let fleet_link = if fleet { r#"<a href="/fleet">Fleet</a>"# } else { "" };
    let out = if signed_in {
        format!(r#"<form method="post" action="/logout" class="inline"><input type="hidden" name="csrf" value="{}"><button>Sign out</button></form>"#, esc(csrf))
    } else {
        String::new()
    };
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{title} · steppe</title><link rel="stylesheet" href="/static/app.css"></head>
<body><nav><a href="/" class="brand">steppe</a><a href="/">Runs</a><a href="/approvals">Approvals</a>{fleet_link}<span class="who">{who}</span>{out}</nav>
<main>{body}</main><script src="/static/app.js"></script></body></html>"#,
        title = esc(title),
        who = esc(who),
    )
}

/// The outcome of a run or step as a coloured word.
pub fn badge(outcome: &str) -> String {
    let class = match outcome {
        "succeeded" => "ok",
        "failed" | "errored" => "bad",
        "aborted" => "warn",
        "running" => "run",
        "skipped" => "skip",
        _ => "",
    };
    format!(r#"<span class="badge {class}">{}</span>"#, esc(outcome))
}

pub const CSS: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
nav{display:flex;gap:16px;align-items:center;padding:10px 20px;background:#1d2330;color:#fff}
nav a{color:#cfe0ff;text-decoration:none}nav .brand{font-weight:700;color:#fff}
nav .who{margin-left:auto;color:#9aa4b5}form.inline{display:inline}
main{padding:20px;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff}th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #e3e6ea;vertical-align:top}
th{font-weight:600;color:#5b6577}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;background:#e3e6ea;font-size:12px}
.badge.ok{background:#d3f3dc;color:#116329}.badge.bad{background:#fbd8d8;color:#8a1c1c}.badge.warn{background:#fdf0c8;color:#7a5b00}
.badge.run{background:#d8e7fd;color:#1d4f99}.badge.skip{background:#eee;color:#666}
.graph{display:flex;flex-direction:column;gap:6px;margin:12px 0}.graph .seq{display:flex;flex-direction:column;gap:6px}
.graph .par{display:flex;flex-direction:row;gap:8px;flex-wrap:wrap;border-left:3px solid #c8d0dc;padding-left:8px}
.node{border:1px solid #c8d0dc;border-radius:6px;padding:4px 10px;background:#fff;min-width:120px}
.node.ok{border-color:#3fb96b;background:#effaf2}.node.bad{border-color:#d9534f;background:#fdf1f1}.node.run{border-color:#3d7be0;background:#eef4fe}
.node.warn{border-color:#d6a400}.node .kind{color:#8a93a3;font-size:11px}
pre{background:#fff;border:1px solid #e3e6ea;padding:8px;overflow:auto;white-space:pre-wrap}
.wf td.bar{width:45%}.wf .track{position:relative;height:12px;background:#eef0f3}.wf .fill{position:absolute;top:0;height:12px;background:#3d7be0}.wf .fill.bad{background:#d9534f}
.filters input,.filters select{margin-right:8px}.error{color:#8a1c1c}.muted{color:#8a93a3}
"#;

/// The live run view: a server-sent event replaces the parts it names.
pub const JS: &str = r#"
(function(){
  var live=document.querySelector('[data-live]');
  if(!live||!window.EventSource)return;
  var es=new EventSource(live.getAttribute('data-live'));
  es.onmessage=function(m){
    var parts=JSON.parse(m.data);
    Object.keys(parts).forEach(function(id){var el=document.getElementById(id);if(el)el.innerHTML=parts[id];});
    if(parts.done){es.close();}
  };
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_pipelines_write_stays_text() {
        assert_eq!(esc("<script>alert('x')</script> & \"q\""), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;");
        assert_eq!(esc("a\u{1b}[31mb"), "a\u{fffd}[31mb");
        assert_eq!(url("build [os=linux]/x"), "build%20%5Bos%3Dlinux%5D%2Fx");
    }
}
