package uitest

// HostileNexts are "next" values for the login of idem ui that, taken as
// they are, would send an operator who just entered the token somewhere
// else than the view's own pages: another host (browsers drop tabs and
// newlines and read a backslash as a slash), a script, or a page of the
// view that is no landing page. Each must land on "/".
var HostileNexts = []string{
	"", "ops", "evil.example", "evil.example/phish",
	"/\t/evil.example/phish", "/%09/evil.example/phish", "\t//evil.example", " //evil.example",
	"/\n/evil.example", "/\r/evil.example", "/\r\n/evil.example", "/%0a/evil.example", "/%0d/evil.example",
	"//evil.example", "///evil.example", "//evil.example/ops", "/\\evil.example", "\\\\evil.example",
	"/\\/evil.example", "\\/evil.example", "/%2F/evil.example", "/%2f%2fevil.example", "/%5C/evil.example",
	"/%5c%5cevil.example", "%2F%2Fevil.example", "/%252F/evil.example",
	"https://evil.example/", "http:evil.example", "http:/evil.example", "HTTPS://evil.example",
	"javascript:window.pwned=1", "JaVaScRiPt:window.pwned=1", " javascript:window.pwned=1", "java\tscript:window.pwned=1",
	"data:text/html,<script>window.pwned=1</script>", "/javascript:window.pwned=1",
	"//user:pass@evil.example", "/@evil.example", "/ops@evil.example", "https://127.0.0.1@evil.example/",
	"//127.0.0.1:1@evil.example", "/.//evil.example", "/./\\evil.example", "/ops/../..//evil.example",
	"/ops/..%2F..%2Fevil.example", "/\u3000/evil.example", "/\uff0f\uff0fevil.example", "/\u2215\u2215evil.example",
	"/ops\t", "/ops%09", "/op?key=x\r\nSet-Cookie: a=b", "/ops?q=\x00", "/ops\x7f",
	"/login", "/login?next=//evil.example", "/live/overview", "/static/../../evil", "/op/reconcile",
	"/OPS", "/ops/", "/op;//evil.example", "/ops?q=1;//evil.example",
}
