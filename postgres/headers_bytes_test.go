package postgres_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/server"
)

// A handler's response header whose value is not UTF-8 (obs-text, which
// HTTP allows: a Content-Disposition with a Latin-1 file name, a legacy
// system's header) or holds a NUL. The package server's doc: a completed
// entry replays "the stored response, status, headers and body byte for
// byte", and the package doc says the PostgreSQL store "keeps the same
// promises" as the memory and SQLite stores. The memory store gives the
// bytes back as they were written.
func TestStoreKeepsResponseHeadersByteForByte(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"not UTF-8": "attachment; filename=\"caf\xe9.txt\"",
		"NUL":       "a\x00b",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			now := time.Now()
			for sname, s := range map[string]server.Store{"memory": server.NewMemoryStore(), "postgres": openStore(t)} {
				res, err := s.Claim(ctx, claimAt("k1", "fp", now))
				require.NoError(t, err, sname)
				require.True(t, res.Claimed, sname)
				h := http.Header{"Content-Disposition": {value}}
				err = s.Complete(ctx, server.CompleteRequest{Scope: "tenant", Key: "k1", Token: res.Token, ExpiresAt: now.Add(time.Hour),
					Response: &server.StoredResponse{Status: 200, Header: h, Body: []byte("x")}})
				require.NoError(t, err, "%s: the completion of a response the handler wrote", sname)
				e, err := s.Get(ctx, "tenant", "k1", now)
				require.NoError(t, err, sname)
				require.NotNil(t, e.Response, sname)
				assert.Equal(t, []byte(value), []byte(e.Response.Header.Get("Content-Disposition")),
					"%s: the replayed header is the one the handler wrote, byte for byte", sname)
			}
		})
	}
}

// The journal side of the same: an endpoint answers with a header that is
// not UTF-8. Client.Do's doc: a success carries "the server's status,
// headers and body", and calling Do again "returns the journaled result",
// and calls for one operation "return the same result". The first Do
// returns the server's bytes; the second answers from the journal, whose
// header went through JSON: U+FFFD where the server sent 0xE9.
func TestRepeatedDoGetsTheFirstAnswersHeadersByteForByte(t *testing.T) {
	t.Parallel()
	const value = "attachment; filename=\"caf\xe9.txt\""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Disposition", value)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	c, err := idem.New(idem.Config{Journal: openJournal(t), BaseURL: srv.URL, Owner: "w"})
	require.NoError(t, err)
	defer c.Close()
	op := idem.Op{ID: "file-1", Method: http.MethodPost, URL: "/files", Body: []byte(`{}`)}
	first, err := c.Do(ctx, op)
	require.NoError(t, err)
	require.Equal(t, []byte(value), []byte(first.Header.Get("Content-Disposition")))
	again, err := c.Do(ctx, op)
	require.NoError(t, err)
	assert.Equal(t, []byte(value), []byte(again.Header.Get("Content-Disposition")), "the recorded outcome is the answer the first Do returned")
}
