package webui

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/uitest"
)

// Without AllowWrites the forms are absent and a POST is refused with 403
// even with the right CSRF token; nothing changes.
func TestReadOnlyRefusesWrites(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	j := openJournal(t, path)
	h, err := New(Config{Journal: j})
	require.NoError(t, err)
	srv, c := serve(t, h)
	for _, name := range []string{uitest.Unknown, uitest.Pending} {
		a := get(t, c, srv.URL+"/op?key="+keys[name])
		require.Equal(t, http.StatusOK, a.code)
		assert.NotContains(t, a.body, `action="/op/reconcile"`)
		assert.NotContains(t, a.body, `action="/op/cancel"`)
		assert.Contains(t, a.body, "read-only")
	}
	// A forged POST, even with the process's CSRF token in its form and
	// its cookie.
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	c.Jar.SetCookies(u, []*http.Cookie{{Name: csrfCookie, Value: h.csrf}})
	a := post(t, c, srv.URL+"/op/reconcile", url.Values{"csrf": {h.csrf}, "key": {keys[uitest.Unknown]}, "as": {"succeeded"}, "note": {"forged"}})
	assert.Equal(t, http.StatusForbidden, a.code)
	assert.Contains(t, a.body, "read-only; it was started without --allow-writes")
	a = post(t, c, srv.URL+"/op/cancel", url.Values{"csrf": {h.csrf}, "key": {keys[uitest.Pending]}})
	assert.Equal(t, http.StatusForbidden, a.code)
	assert.Contains(t, a.body, "read-only")
	assert.Equal(t, idem.StateUnknown, stateOf(t, j, keys[uitest.Unknown]).State)
	assert.Equal(t, idem.StatePending, stateOf(t, j, keys[uitest.Pending]).State)
}

// A POST without the CSRF token, with a wrong one, or without the
// cookie is refused with 403 and changes nothing; with both it applies.
func TestCSRF(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	j := openJournal(t, path)
	srv, c := server(t, Config{Journal: j, AllowWrites: true})
	key := keys[uitest.Unknown]
	page := get(t, c, srv.URL+"/op?key="+key)
	require.Contains(t, page.body, `action="/op/reconcile"`)
	token := csrfOf(t, page.body)
	form := func(csrf string) url.Values {
		v := url.Values{"key": {key}, "as": {"succeeded"}, "note": {"matched order 9812 in the ERP"}}
		if csrf != "" {
			v.Set("csrf", csrf)
		}
		return v
	}
	// No token; a wrong one; the right one without the cookie (another
	// site's form cannot send the SameSite cookie).
	assert.Equal(t, http.StatusForbidden, post(t, c, srv.URL+"/op/reconcile", form("")).code)
	wrong := token[:len(token)-1] + "0"
	if wrong == token {
		wrong = token[:len(token)-1] + "1"
	}
	assert.Equal(t, http.StatusForbidden, post(t, c, srv.URL+"/op/reconcile", form(wrong)).code)
	bare := &http.Client{CheckRedirect: c.CheckRedirect}
	a := post(t, bare, srv.URL+"/op/reconcile", form(token))
	assert.Equal(t, http.StatusForbidden, a.code)
	assert.Contains(t, a.body, "CSRF token is missing or wrong")
	assert.Equal(t, idem.StateUnknown, stateOf(t, j, key).State)

	a = post(t, c, srv.URL+"/op/reconcile", form(token))
	require.Equal(t, http.StatusSeeOther, a.code, a.body)
	rec := stateOf(t, j, key)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, "matched order 9812 in the ERP", rec.Note)
	a = get(t, c, srv.URL+a.header.Get("Location"))
	assert.Contains(t, a.body, "Reconciled: the operator")
	assert.Contains(t, a.body, "matched order 9812 in the ERP")
	assert.NotContains(t, a.body, `action="/op/reconcile"`, "a settled operation has no form")
}

// The page's settling follows the CLI's rules and says its errors.
func TestSettleRules(t *testing.T) {
	t.Parallel()
	path, keys := fixtureJournal(t)
	j := openJournal(t, path)
	srv, c := server(t, Config{Journal: j, AllowWrites: true})
	token := csrfOf(t, get(t, c, srv.URL+"/op?key="+keys[uitest.Unknown]).body)
	reconcile := func(key, as, note string) answer {
		return post(t, c, srv.URL+"/op/reconcile", url.Values{"csrf": {token}, "key": {key}, "as": {as}, "note": {note}})
	}
	for _, tc := range []struct {
		name, key, as, note string
		code                int
		want                string
	}{
		{"no outcome", keys[uitest.Unknown], "", "x", http.StatusBadRequest, "choose the outcome: succeeded or rejected"},
		{"a bad outcome", keys[uitest.Unknown], "pending", "x", http.StatusBadRequest, "reconciled as succeeded or rejected"},
		{"no note", keys[uitest.Unknown], "succeeded", "  ", http.StatusBadRequest, "the note is required"},
		{"a settled operation", keys[uitest.Succeeded], "rejected", "x", http.StatusConflict, "illegal state transition"},
		{"a pending operation", keys[uitest.Pending], "succeeded", "x", http.StatusConflict, "only unknown or expired operations are reconciled"},
		{"no such operation", "no-such-key", "succeeded", "x", http.StatusNotFound, "no operation has key no-such-key"},
	} {
		a := reconcile(tc.key, tc.as, tc.note)
		assert.Equal(t, tc.code, a.code, "%s: %s", tc.name, a.body)
		assert.Contains(t, a.body, tc.want, tc.name)
	}
	// The form comes back filled after a refusal.
	a := reconcile(keys[uitest.Unknown], "rejected", "  ")
	assert.Contains(t, a.body, `value="rejected" checked`)

	cancel := func(key string) answer {
		return post(t, c, srv.URL+"/op/cancel", url.Values{"csrf": {token}, "key": {key}})
	}
	a = cancel(keys[uitest.InFlight])
	assert.Equal(t, http.StatusConflict, a.code)
	assert.Contains(t, a.body, "is in_flight; only a pending operation that was never sent can be canceled")
	a = cancel(keys[uitest.Pending])
	require.Equal(t, http.StatusSeeOther, a.code, a.body)
	assert.Equal(t, idem.StateCanceled, stateOf(t, j, keys[uitest.Pending]).State)

	// An operation a live process drives is left to it.
	_, err := j.Acquire(context.Background(), keys[uitest.Unknown2], "worker-1", time.Hour)
	require.NoError(t, err)
	a = reconcile(keys[uitest.Unknown2], "succeeded", "checked")
	assert.Equal(t, http.StatusConflict, a.code)
	assert.Contains(t, a.body, "being driven by worker-1")
	assert.Equal(t, idem.StateUnknown, stateOf(t, j, keys[uitest.Unknown2]).State)
}
