package idem_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/journaltest"
)

func TestMemoryJournalConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idem.Journal {
		return idem.NewMemoryJournal()
	})
}

// newMemoryClientOfAnOrder returns a server that answers every request with
// order 1 (201, a Location, a body), and a client on a MemoryJournal.
func newMemoryClientOfAnOrder(t *testing.T) (*scripted, *idem.Client) {
	t.Helper()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	})
	c, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return srv, c
}

// The client shares a MemoryJournal's records instead of copying them (see
// createRecord): what a caller does with its Result, its Op's body or
// headers after Do returns must still not reach the journal.
func TestMemoryJournalKeepsItsOwnCopies(t *testing.T) {
	t.Parallel()
	srv, c := newMemoryClientOfAnOrder(t)
	ctx := context.Background()
	op := idem.Op{ID: "a", URL: "/orders", Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"n":1}`)}
	res, err := c.Do(ctx, op)
	require.NoError(t, err)
	res.Body[0] = 'X'
	res.Header.Set("Location", "/elsewhere")
	op.Body[0] = 'X'
	op.Header["Content-Type"][0] = "text/plain"

	rec, err := c.Lookup(ctx, "", "a")
	require.NoError(t, err)
	assert.Equal(t, `{"n":1}`, string(rec.Body), "the journaled request")
	assert.Equal(t, "application/json", rec.Header.Get("Content-Type"))
	require.NotNil(t, rec.Response)
	assert.Equal(t, `{"id":1}`, string(rec.Response.Body), "the journaled response")
	assert.Equal(t, "/orders/1", rec.Response.Header.Get("Location"))

	again, err := c.Do(ctx, idem.Op{ID: "a", URL: "/orders", Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"n":1}`)})
	require.NoError(t, err)
	assert.Equal(t, `{"id":1}`, string(again.Body), "the journaled result, returned again")
	assert.Equal(t, "/orders/1", again.Header.Get("Location"))
	assert.Len(t, srv.received(), 1, "sent once")
}

// The standard client's journaled header is built from the request's own
// values: the journal must not keep them, for the caller may reuse them.
func TestMemoryJournalKeepsItsOwnCopiesOfAStandardRequest(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	j := idem.NewMemoryJournal()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
	require.NoError(t, err)
	defer c.Close()
	ctx := idem.WithOperation(context.Background(), "b")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"n":1}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.StandardClient().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	req.Header["Content-Type"][0] = "text/plain"

	rec, err := c.Lookup(context.Background(), "", "b")
	require.NoError(t, err)
	assert.Equal(t, "application/json", rec.Header.Get("Content-Type"), "the journaled request")
}

// wrappedMemory embeds a MemoryJournal to see its writes.
type wrappedMemory struct {
	*idem.MemoryJournal
	creates, updates atomic.Int32
}

func (w *wrappedMemory) Create(ctx context.Context, rec idem.Record) (idem.Record, bool, error) {
	w.creates.Add(1)
	return w.MemoryJournal.Create(ctx, rec)
}

func (w *wrappedMemory) Update(ctx context.Context, rec idem.Record, d idem.Durability, why idem.Event) (idem.Record, error) {
	w.updates.Add(1)
	return w.MemoryJournal.Update(ctx, rec, d, why)
}

// Only a MemoryJournal itself is written without copies: a type that
// embeds one to change Create or Update is written through them.
func TestAJournalEmbeddingAMemoryJournalIsWrittenThroughItsOwnMethods(t *testing.T) {
	t.Parallel()
	srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	j := &wrappedMemory{MemoryJournal: idem.NewMemoryJournal()}
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Do(context.Background(), idem.Op{ID: "a", URL: "/orders"})
	require.NoError(t, err)
	assert.Equal(t, int32(1), j.creates.Load(), "Create")
	assert.Equal(t, int32(1), j.updates.Load(), "Update")
}

// The standard client's response shares its header with the Result, not
// with the journal: what a caller does to resp.Header or the Result's body
// must not reach the journaled answer, nor the response a later call gets.
func TestMemoryJournalKeepsItsOwnCopiesOfAStandardResponse(t *testing.T) {
	t.Parallel()
	srv, c := newMemoryClientOfAnOrder(t)
	std := c.StandardClient()
	call := func() *http.Response {
		t.Helper()
		ctx := idem.WithOperation(context.Background(), "c")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"n":1}`))
		require.NoError(t, err)
		resp, err := std.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp
	}
	resp := call()
	resp.Header["Location"][0] = "/elsewhere"
	resp.Header.Set("X-Added", "by the caller")
	res, ok := idem.ResultOf(resp)
	require.True(t, ok)
	res.Body[0] = 'X'

	rec, err := c.Lookup(context.Background(), "", "c")
	require.NoError(t, err)
	require.NotNil(t, rec.Response)
	assert.Equal(t, "/orders/1", rec.Response.Header.Get("Location"), "the journaled answer")
	assert.Empty(t, rec.Response.Header.Get("X-Added"))
	assert.Equal(t, `{"id":1}`, string(rec.Response.Body))

	again := call()
	assert.Equal(t, "/orders/1", again.Header.Get("Location"), "the journaled answer, returned again")
	assert.Empty(t, again.Header.Get("X-Added"))
	res, ok = idem.ResultOf(again)
	require.True(t, ok)
	assert.True(t, res.Journaled)
	assert.Equal(t, `{"id":1}`, string(res.Body))
	assert.Len(t, srv.received(), 1, "sent once")
}
