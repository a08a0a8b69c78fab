package testserver

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/idemkit/idem/examples/server/orders"
	"github.com/idemkit/idem/internal/wire"
)

// requestChecks is what Daemon demands of every request, besides what the
// middleware does, when it is told to (-key-header, -key-quoted,
// -tenant-tokens, -audit): the key in one header and one form only, and
// each tenant's own credential. A request that fails either is refused
// (400 for the key, 403 for the credential) before the middleware sees it,
// and every request checked is written to the audit log, one line each:
//
//	<method> <route> <tenant> header=<verdict> token=<verdict>
//
// route is "orders" (POST /orders) or "status" (GET /idempotency/{key});
// tenant is orders.Tenant of the request. The header verdict is "ok", or
// what is wrong: "other:<name>" (the key, or a key, in another of the
// usual key headers), "missing", "repeated", "bare" (a token where an
// sf-string is required), "unparsable", or "mismatch" (a status request's
// header names another key than its path). The token verdict is "ok",
// "none" (no Authorization), "of:<tenant>" (another tenant's token) or
// "unknown". A verdict never contains a space.
type requestChecks struct {
	header string            // canonical name of the one key header
	quoted bool              // the key must be an RFC 8941 sf-string
	tokens map[string]string // tenant → its bearer token; empty: not checked

	mu  sync.Mutex
	log io.Writer // nil: no audit log
}

// otherKeyHeaders are the key headers a client of another configuration
// sends: with a custom header configured, any of them on a request is a
// key in the wrong place.
var otherKeyHeaders = []string{wire.KeyHeader, "X-Idempotency-Key"}

// parseTokens reads "tenant=token,tenant=token".
func parseTokens(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	tokens := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		tenant, token, ok := strings.Cut(pair, "=")
		if !ok || tenant == "" || token == "" || strings.ContainsAny(pair, " \t") {
			return nil, fmt.Errorf("-tenant-tokens: %q is not tenant=token", pair)
		}
		if _, dup := tokens[tenant]; dup {
			return nil, fmt.Errorf("-tenant-tokens: tenant %q appears twice", tenant)
		}
		tokens[tenant] = token
	}
	return tokens, nil
}

// orders wraps the POST /orders handler.
func (c *requestChecks) orders(next http.Handler) http.Handler {
	return c.wrap("orders", next)
}

// status wraps the GET /idempotency/{key} handler.
func (c *requestChecks) status(next http.Handler) http.Handler {
	return c.wrap("status", next)
}

func (c *requestChecks) wrap(route string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := orders.Tenant(r)
		header, token := c.checkHeader(route, r), c.checkToken(tenant, r)
		c.audit(fmt.Sprintf("%s %s %s header=%s token=%s\n", r.Method, route, tenant, header, token))
		switch {
		case token != "ok":
			refuse(w, http.StatusForbidden, "", fmt.Sprintf("The request for tenant %q does not carry that tenant's credential (%s).", tenant, token))
		case header != "ok":
			refuse(w, http.StatusBadRequest, wire.ProblemKeyInvalid, fmt.Sprintf("This service takes the key in %s only, as %s (%s).", c.header, c.form(), header))
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func (c *requestChecks) form() string {
	if c.quoted {
		return "an RFC 8941 sf-string"
	}
	return "a token or an sf-string"
}

func (c *requestChecks) checkHeader(route string, r *http.Request) string {
	var others []string
	for _, h := range otherKeyHeaders {
		if h = http.CanonicalHeaderKey(h); h != c.header && len(r.Header.Values(h)) > 0 {
			others = append(others, h)
		}
	}
	if len(others) > 0 {
		return "other:" + strings.Join(others, ",")
	}
	values := r.Header.Values(c.header)
	switch {
	case len(values) == 0:
		return "missing"
	case len(values) > 1:
		return "repeated"
	}
	v := strings.Trim(values[0], " \t")
	key, err := wire.ParseKey(v)
	switch {
	case err != nil:
		return "unparsable"
	case c.quoted && !strings.HasPrefix(v, `"`):
		return "bare"
	case route == "status" && key != r.PathValue("key"):
		return "mismatch"
	}
	return "ok"
}

func (c *requestChecks) checkToken(tenant string, r *http.Request) string {
	if len(c.tokens) == 0 {
		return "ok"
	}
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return "none"
	}
	if want, ok := c.tokens[tenant]; ok && auth == "Bearer "+want {
		return "ok"
	}
	for _, t := range slices.Sorted(maps.Keys(c.tokens)) {
		if auth == "Bearer "+c.tokens[t] {
			return "of:" + t
		}
	}
	return "unknown"
}

// audit writes one line, in one write: a SIGKILL of the server keeps every
// line written before it (the kernel holds them) and cuts none.
func (c *requestChecks) audit(line string) {
	if c.log == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = io.WriteString(c.log, line)
}

func refuse(w http.ResponseWriter, status int, typ, detail string) {
	body, _ := json.Marshal(wire.Problem{Type: typ, Status: status, Title: http.StatusText(status), Detail: detail})
	w.Header().Set("Content-Type", wire.ProblemContentType)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
