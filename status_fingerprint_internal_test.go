package idem

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/internal/wire"
)

// sameRequest takes the journaled request's fingerprint, or that of its
// target with leading path segments a proxy stripped; nothing else.
func TestSameRequestComparesTheServersFingerprint(t *testing.T) {
	rec := Record{Method: "POST", URL: "https://api.example.com/api/v1/orders?src=web&a=%2F", Body: []byte(`{"q":1}`)}
	fp := func(method, target, body string) string { return wire.RequestFingerprint(method, target, []byte(body)) }
	for _, tc := range []struct {
		what string
		fp   string
		same bool
	}{
		{"as sent", fp("POST", "/api/v1/orders?src=web&a=%2F", `{"q":1}`), true},
		{"/api stripped", fp("POST", "/v1/orders?src=web&a=%2F", `{"q":1}`), true},
		{"/api/v1 stripped", fp("POST", "/orders?src=web&a=%2F", `{"q":1}`), true},
		{"/api/v1/ stripped", fp("POST", "orders?src=web&a=%2F", `{"q":1}`), true},
		{"another body", fp("POST", "/api/v1/orders?src=web&a=%2F", `{"q":2}`), false},
		{"another method", fp("PUT", "/api/v1/orders?src=web&a=%2F", `{"q":1}`), false},
		{"another query", fp("POST", "/api/v1/orders?src=app&a=%2F", `{"q":1}`), false},
		{"no query", fp("POST", "/api/v1/orders", `{"q":1}`), false},
		{"another route", fp("POST", "/api/v1/refunds?src=web&a=%2F", `{"q":1}`), false},
		{"a prefix added", fp("POST", "/gw/api/v1/orders?src=web&a=%2F", `{"q":1}`), false},
		{"a middle segment dropped", fp("POST", "/api/orders?src=web&a=%2F", `{"q":1}`), false},
	} {
		assert.Equal(t, tc.same, sameRequest(tc.fp, rec), tc.what)
	}
	// A path escaped in the URL is compared escaped, as the request line
	// carries it; an empty query ("?") is no query for either side.
	escaped := Record{Method: "POST", URL: "https://api.example.com/api/a%2Fb/orders?", Body: []byte("x")}
	assert.True(t, sameRequest(fp("POST", "/api/a%2Fb/orders", "x"), escaped))
	assert.True(t, sameRequest(fp("POST", "/a%2Fb/orders", "x"), escaped))
	assert.False(t, sameRequest(fp("POST", "/api/a/b/orders", "x"), escaped))
	// An empty path is sent as "/".
	root := Record{Method: "POST", URL: "https://api.example.com", Body: nil}
	assert.True(t, sameRequest(fp("POST", "/", ""), root))
}
